"""Starting and stopping server processes for tests: free ports, readiness polls, teardown.

One definition with `gpuvigil lab`, which starts the same servers: `gpuvigil.lab.procs`
and `gpuvigil.io.ports`.
"""

from __future__ import annotations

from gpuvigil.io.ports import free_port
from gpuvigil.lab.procs import Proc, wait_until

__all__ = ["Proc", "free_port", "wait_until"]
