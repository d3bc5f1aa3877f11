"""Active (workload) checks: matmul correctness and throughput, device-memory patterns,
host/peer transfer bandwidth, all-reduce bus bandwidth.

A GPU can answer every status query and still corrupt work; an adapter can be present and
still run collectives at a fraction of their bandwidth. Only a workload shows either.
`runner.run_active` runs the checks in a worker subprocess (`worker.py`) under deadlines,
so a hung kernel or collective is killed, never waited on. torch is imported only inside
the worker-side modules (`ops.py` and the checks), never by `runner`, `config` or
`results`. Called by `gpuvigil preflight` and `bench/active.py`.
"""
