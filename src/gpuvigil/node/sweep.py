"""One sweep: every registered check once -> a NodeReport (`gpuvigil check`, preflight).

`load_checks()` imports every module that registers checks: this list is the one place
that names them.
"""

from __future__ import annotations

import importlib

CHECK_MODULES = (
    "gpuvigil.node.probes.nvml",
    "gpuvigil.node.probes.nvidia_smi",
    "gpuvigil.node.probes.dcgm",
    "gpuvigil.node.probes.kernel_log",
    "gpuvigil.node.probes.fabric",
    "gpuvigil.node.probes.pcie",
)


def load_checks() -> None:
    for name in CHECK_MODULES:
        importlib.import_module(name)
