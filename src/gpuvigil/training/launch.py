"""`python -m gpuvigil.training.launch ...`: torchrun, with restarts that work on many nodes.

Takes exactly torchrun's arguments. The one difference: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
so each rendezvous round gives the workers a fresh store instead of the job-long store of
the first round (whose stale keys make restarted workers hang or fail to connect, and whose
per-agent restart counts cannot name a round consistently across nodes).
"""

from __future__ import annotations

import os


def main() -> None:
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    from torch.distributed.run import main as torchrun

    torchrun()


if __name__ == "__main__":
    main()
