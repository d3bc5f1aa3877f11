"""The tools of a lab machine, acting on its fake hardware: `python -m
gpuvigil.lab.fake_tools TOOL ARGS...`, run through the scripts in the machine's `bin/`.

- `nvidia-smi --gpu-reset [-i N]`: what a GPU reset repairs (`fakes.faults.reset_gpu`) on
  the machine's NVML scenario; a lost GPU cannot be reset (exit 255, as nvidia-smi does
  when the GPU is not reachable). `nvidia-smi -q -x`: the scenario as XML
  (`fakes.nvidia_smi`), for the NVML fallback.
- `systemctl reboot`: leaves `reboot-requested` in the machine's folder; the lab carries
  the reboot out (`machine.Machine.reboot`), killing this machine's processes.
- `nsenter ... -- CMD ARGS`: runs CMD (the shipped agent config enters PID 1's namespaces
  to reboot the host; the lab's machine is already the host).
The machine comes from `GPUVIGIL_LAB_MACHINE` and `GPUVIGIL_FAKE_NVML_SCENARIO`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpuvigil.fakes import faults
from gpuvigil.fakes.gpu import SCENARIO_ENV, FakeNode
from gpuvigil.fakes.nvidia_smi import lost_lines, render_xml


def _scenario() -> Path:
    return Path(os.environ[SCENARIO_ENV])


def nvidia_smi(args: list[str]) -> int:
    node = FakeNode.load(_scenario())
    if "--gpu-reset" in args:
        picked = [int(args[args.index("-i") + 1])] if "-i" in args else [g.index for g in node.gpus]
        for index in picked:
            if node.gpu(index).lost:
                print(f"Unable to reset GPU {index}: the GPU is lost (fell off the bus)",
                      file=sys.stderr)  # fmt: skip
                return 255
        for index in picked:
            faults.reset_gpu(node, index)
        node.save(_scenario())
        for index in picked:
            print(f"GPU {node.gpu(index).pci_bus_id} was successfully reset.")
        return 0
    if "-q" in args and "-x" in args:
        sys.stdout.write(render_xml(node))
        sys.stdout.write(lost_lines(node))
        return 0
    print(f"lab nvidia-smi: unsupported arguments {args}", file=sys.stderr)
    return 2


def systemctl(args: list[str]) -> int:
    if args[:1] != ["reboot"]:
        print(f"lab systemctl: only `reboot` is emulated, not {args}", file=sys.stderr)
        return 1
    (Path(os.environ["GPUVIGIL_LAB_MACHINE"]) / "reboot-requested").write_text("reboot\n")
    return 0


def nsenter(args: list[str]) -> int:
    if "--" not in args or args.index("--") == len(args) - 1:
        print("lab nsenter: expected `-- COMMAND ...`", file=sys.stderr)
        return 1
    cmd = args[args.index("--") + 1 :]
    os.execvp(cmd[0], cmd)
    return 127  # not reached


TOOLS = {"nvidia-smi": nvidia_smi, "systemctl": systemctl, "nsenter": nsenter}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in TOOLS:
        print(f"usage: python -m gpuvigil.lab.fake_tools {{{','.join(TOOLS)}}} ...",
              file=sys.stderr)  # fmt: skip
        return 2
    return TOOLS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
