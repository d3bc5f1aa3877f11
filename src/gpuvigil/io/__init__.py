"""Clients that more than one layer uses: the fail-closed command runner (`exec`), the
Kubernetes client's connection (`kube_client`), and the Slurm client and slurm.conf
reader (`slurm_client`, `slurm_conf`). Here, below `node` and `platform`, so neither
imports the other to reach them; they import only `core`."""
