"""Real servers for the integration tests, started on loopback and stopped by PID.

kube-apiserver + etcd (+ kube-scheduler, kube-controller-manager), Slurm (munge, slurmctld,
one slurmd per node), Prometheus, headless Chromium. Measured recipes and gotchas:
`../shared/REALPARTS.md`. Fixtures are in `fixtures.py`; tests ask for them by name.
"""
