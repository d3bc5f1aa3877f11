"""The compute the active checks drive, behind one seam: `TorchOps`.

Every check calls these methods instead of torch directly, so a test or the simulator can
wrap them (`OpsWrapper`) to return a wrong result, run slowly or hang, while the check,
its expectations and its judgement stay exactly as in production. Imported only inside
the worker process (it imports torch).
"""

from __future__ import annotations

import os
import time
from typing import Any


class TorchOps:
    """CUDA GPUs, or `cpu_devices` virtual devices on the CPU (same code, small sizes)."""

    def __init__(self, device: str, *, cpu_devices: int = 2, sysfs_root: str = "/") -> None:
        import torch

        self.torch = torch
        self.kind = "cuda" if device.startswith("cuda") else "cpu"
        self.pci: list[str | None] = []
        if self.kind == "cuda":
            self.devices = [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())]
            self.pci = [
                _pci_address(torch.cuda.get_device_properties(i)) for i in range(len(self.devices))
            ]
        else:
            self.devices = [torch.device("cpu")] * cpu_devices
            # One intra-op thread: a matmul split over threads waits, every call, for each
            # thread's turn on a loaded machine (48x48 fp32 on 2 busy cores: 16 ms a call
            # instead of 50 us, in 2 runs of 8), so the rate measured was the scheduler's.
            # The virtual devices share the cores anyway; this worker process is theirs.
            torch.set_num_threads(1)
        self.asynchronous = self.kind == "cuda"
        self._host_index = host_gpu_indexes(sysfs_root) if self.kind == "cuda" else {}

    # --- identity ------------------------------------------------------------------------
    def count(self) -> int:
        return len(self.devices)

    def component(self, i: int) -> str:
        """`gpu:N` with N the host's NVML index (GPUs in PCI address order, as the `gpu` and
        `pcie` checks number them), not torch's index, which CUDA_VISIBLE_DEVICES and the
        device order can shuffle: a remediation must reset the GPU that failed."""
        if self.kind != "cuda":
            return f"cpu:{i}"
        pci = self.pci[i] if i < len(self.pci) else None
        host = self._host_index.get(pci) if pci else None
        return f"gpu:{host if host is not None else i}"

    def name(self, i: int) -> str:
        if self.kind == "cuda":
            return str(self.torch.cuda.get_device_name(i))
        return "cpu"

    # --- compute -------------------------------------------------------------------------
    def matmul(self, i: int, a: Any, b: Any) -> Any:
        return self.torch.matmul(a, b)

    def fill(self, i: int, t: Any, value: int) -> None:
        t.fill_(value)

    def fill_index(self, i: int, t: Any, start: int) -> None:
        """Write start, start+1, ... (an address-dependent pattern) into int32 `t`."""
        self.torch.arange(start, start + t.numel(), dtype=t.dtype, device=t.device, out=t)

    def copy(self, i: int, dst: Any, src: Any) -> None:
        dst.copy_(src, non_blocking=self.asynchronous)

    def all_reduce(self, t: Any) -> None:
        import torch.distributed as dist

        dist.all_reduce(t)

    # --- memory and time -----------------------------------------------------------------
    def empty(self, i: int, numel: int, dtype: Any) -> Any:
        return self.torch.empty(numel, dtype=dtype, device=self.devices[i])

    def host(self, numel: int, dtype: Any) -> Any:
        t = self.torch.empty(numel, dtype=dtype)
        return t.pin_memory() if self.kind == "cuda" else t

    def free_bytes(self, i: int) -> int | None:
        if self.kind == "cuda":
            free, _total = self.torch.cuda.mem_get_info(i)
            return int(free)
        return None

    def release(self) -> None:
        if self.kind == "cuda":
            self.torch.cuda.empty_cache()

    def synchronize(self, i: int | None = None) -> None:
        if self.kind != "cuda":
            return
        if i is None:
            for d in range(len(self.devices)):
                self.torch.cuda.synchronize(d)
        else:
            self.torch.cuda.synchronize(i)

    def timer(self, i: int) -> Timer:
        return Timer(self, i)


def _pci_address(props: Any) -> str | None:
    try:
        domain, bus, dev = props.pci_domain_id, props.pci_bus_id, props.pci_device_id
    except AttributeError:
        return None
    return f"{int(domain):04x}:{int(bus):02x}:{int(dev):02x}.0"


def host_gpu_indexes(root: str = "/") -> dict[str, int]:
    """{PCI address: index} of the host's NVIDIA GPUs in PCI order, from sysfs."""
    base = os.path.join(root, "sys/bus/pci/devices")
    out: dict[str, int] = {}
    try:
        addresses = sorted(os.listdir(base))
    except OSError:
        return out
    for addr in addresses:
        try:
            with open(os.path.join(base, addr, "vendor")) as f:
                vendor = f.read().strip()
            with open(os.path.join(base, addr, "class")) as f:
                pci_class = f.read().strip()
        except OSError:
            continue
        if vendor == "0x10de" and pci_class.startswith(("0x0300", "0x0302")):
            out[addr.lower()] = len(out)
    return out


class Timer:
    """Device time of the work between start() and stop(): CUDA events on a GPU (the
    host returns before the kernels finish), the wall clock on the CPU."""

    def __init__(self, ops: TorchOps, i: int) -> None:
        self.ops, self.i = ops, i
        self._t0 = 0.0
        self._events: tuple[Any, Any] | None = None

    def start(self) -> Timer:
        if self.ops.kind == "cuda":
            torch = self.ops.torch
            with torch.cuda.device(self.i):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
            self._events = (start, end)
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> float:
        """Seconds; synchronizes the device."""
        if self._events is not None:
            start, end = self._events
            with self.ops.torch.cuda.device(self.i):
                end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1000.0
        return time.perf_counter() - self._t0


class OpsWrapper:
    """Base of fault injectors: delegates everything to the wrapped ops.

    Subclasses override one method (say `matmul`) to corrupt, slow down or hang it; see
    `gpuvigil.fakes.active`.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def timer(self, i: int) -> Timer:
        return Timer(self, i)  # type: ignore[arg-type]
