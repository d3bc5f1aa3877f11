"""Exit codes of a training worker stopped by gpuvigil (documented in docs/training.md).

Chosen outside 0-2 (Python's own), 126-165 (shell and 128+signal) and the sysexits range
(64-78), so a job log or `torchrun`'s per-worker failure summary names the cause.
torchrun restarts the group on any non-zero worker exit, up to `--max-restarts`.
"""

from __future__ import annotations

HANG = 86  # the hang watchdog fired: no step completed within the timeout
NODE_UNHEALTHY = 87  # the health gate refused: the node agent reports this node unhealthy
NODE_STATE_UNKNOWN = 88  # the health gate refused: the agent's state file is missing/stale/garbage

DESCRIPTIONS = {
    HANG: "hang watchdog: no step completed within the timeout",
    NODE_UNHEALTHY: "health gate: this node is marked unhealthy by the gpuvigil agent",
    NODE_STATE_UNKNOWN: "health gate: this node's gpuvigil state is missing, stale or unreadable",
}
