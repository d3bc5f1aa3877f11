"""Readings: the frozen values probes return and pure rules consume.

One module so that rules (which may not import probes) and the simulator (which builds
readings from simulated hardware) share one definition of each. Sections by source.
"""

from __future__ import annotations

# --- GPU: NVML and nvidia-smi (owner: layer-1 GPU work) ------------------------------------


# --- DCGM (owner: layer-1 GPU work) --------------------------------------------------------


# --- Kernel log: Xid and SXid events (owner: layer-1 kernel-log work) ----------------------


# --- Network fabric and PCIe (owner: fabric/preflight work) --------------------------------
