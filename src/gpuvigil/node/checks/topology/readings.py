"""The `topology` domain's readings: `nvidia-smi topo -m`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuTopology:
    """The GPUs and NICs `topo -m` lists, and the link between each pair of GPUs."""

    gpus: tuple[int, ...] = ()
    nics: tuple[str, ...] = ()  # legend names (mlx5_0) when given, else NIC0...
    pairs: tuple[tuple[int, int, str], ...] = ()  # (gpu a, gpu b, "NV18" | "SYS" | ...)
    problems: tuple[str, ...] = ()
