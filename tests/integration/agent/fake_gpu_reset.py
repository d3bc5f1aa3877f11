"""`python -m fake_gpu_reset --gpu-reset -i N`: what `nvidia-smi --gpu-reset` does to the
fake GPUs of the scenario in GPUVIGIL_FAKE_NVML_SCENARIO (`fakes.faults.reset_gpu`), for
the agent's real remediator in tests/integration/agent (the lab has its own fake tools)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpuvigil.fakes import faults
from gpuvigil.fakes.gpu import SCENARIO_ENV, FakeNode


def main(argv: list[str]) -> int:
    path = Path(os.environ[SCENARIO_ENV])
    node = FakeNode.load(path)
    if argv[:1] != ["--gpu-reset"]:
        return 2
    picked = [int(argv[2])] if argv[1:2] == ["-i"] else [g.index for g in node.gpus]
    for index in picked:
        faults.reset_gpu(node, index)
    node.save(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
