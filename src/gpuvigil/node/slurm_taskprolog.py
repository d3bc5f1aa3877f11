"""What Slurm's TaskProlog prints so a task's CUDA_VISIBLE_DEVICES names device numbers.

Called by `gpuvigil slurm-taskprolog` (deploy/slurm/gpuvigil-taskprolog, slurm.conf's
TaskProlog). Why: without device cgroups (`ConstrainDevices=yes`), Slurm 22.05 numbers a
node's GPUs by their position in gres.conf, so on a node degraded to
`File=/dev/nvidia[0-2,4-7]` a 7-GPU job gets CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6 (measured)
and CUDA, which sees all eight, would hand it the bad GPU 3. This maps each position to its
file's device number (0,1,2,4,5,6,7) and pins CUDA to PCI bus order, in which device
numbers count. With ConstrainDevices=yes do not install it: CUDA then sees only the
allocated files and Slurm's own numbering is right.

Fail closed: a task whose GPUs cannot be mapped (no gres.conf, a position past the node's
files) gets no GPU at all (`CUDA_VISIBLE_DEVICES=` empty) and a line saying why.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuvigil.io import slurm_conf as sc

VARS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


def prolog_lines(env: Mapping[str, str], gres_text: str | None) -> list[str]:
    """TaskProlog output (`export NAME=value`, `print text`) for a task with `env`."""
    given = env.get("CUDA_VISIBLE_DEVICES")
    if not given:
        return []  # no GPU allocated: nothing to map
    node = env.get("SLURMD_NODENAME", "")
    try:
        if gres_text is None:
            raise ValueError("gres.conf could not be read")
        files = sc.node_gpu_files(gres_text, node)
        nums = [sc.device_number(files[int(p)]) for p in given.split(",")]
        if None in nums:
            raise ValueError(f"a GPU file of {node} has no device number")
    except (ValueError, IndexError) as e:
        return [*(f"export {v}=" for v in VARS), f"print gpuvigil-taskprolog: no GPU given: {e}"]
    mapped = ",".join(str(n) for n in nums)
    return [*(f"export {v}={mapped}" for v in VARS), "export CUDA_DEVICE_ORDER=PCI_BUS_ID"]
