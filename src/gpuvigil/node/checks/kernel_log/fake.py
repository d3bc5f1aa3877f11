"""The simulator's `kernel_log` readings (`DOMAIN.fake`): the faulty node's Xids (the fake
GPUs' pending Xids, plus SRAM/GSP faults and bare `XID_<n>` that the fakes do not carry)
printed as NVRM kernel-log lines and parsed by `kernel_log_parser.parse_line` into a
KernelLog, with the agent's GPU map. Imported only by the simulator and tests
(`domain.FAKE_MODULE`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from gpuvigil.fakes.faulty import GPUS, MODEL, FaultyNode, Seen
from gpuvigil.fakes.gpu import FakeNode, make_node
from gpuvigil.fakes.nvidia_smi import render_xml
from gpuvigil.node.checks.gpu import fake as gpu_fake
from gpuvigil.node.checks.gpu.nvidia_smi import parse_xml
from gpuvigil.node.checks.gpu.readings import GpuRef, KnownGpus
from gpuvigil.node.checks.kernel_log.kernel_log_parser import parse_line
from gpuvigil.node.checks.kernel_log.readings import KernelLog

# Faults the shared fakes do not carry: the Xid the driver prints for them.
XID_ONLY = {"SRAM_ECC": 95, "GSP_ERROR": 119}


def readings(node: FaultyNode) -> list[Seen]:
    name = node.fault.upper()
    if name in XID_ONLY or name.startswith("XID_"):
        code = XID_ONLY.get(name) or int(name.removeprefix("XID_"))
        return [xid_log(make_node(GPUS, model=MODEL), [(node.gpu, code, False)],
                        now=node.now, booted=node.booted)]  # fmt: skip
    if node.injected is None:
        return []
    pending = [(g.index, x.code, x.boot) for g in node.node.gpus for x in g.xids]
    return [xid_log(node.node, pending, now=node.now, booted=node.booted,
                    refs=gpu_fake.gpu_map(node))]  # fmt: skip


def xid_log(
    node: FakeNode,
    xids: list[tuple[int, int, bool]],
    *,
    now: datetime,
    booted: datetime,
    refs: dict[str, GpuRef] | None = None,
) -> Seen:
    """Print each Xid (gpu, code, at boot) as the driver would (with the GPU's own bus id,
    which the kernel knows even for a GPU NVML has lost) and parse it, with the agent's
    GPU map (`refs`; default: what nvidia-smi reads of the node)."""
    if refs is None:
        refs = parse_xml(render_xml(node), observed_at=now).gpu_map()
    bus = {g.index: g.pci_bus_id for g in node.gpus}
    lines, driver_loaded = [], None
    for index, code, boot in xids:
        at = booted + timedelta(seconds=30) if boot else now - timedelta(seconds=5)
        if boot:
            driver_loaded = booted + timedelta(seconds=20)
        pci = bus[index].removeprefix("0000")
        stamp = at.strftime("%Y-%m-%dT%H:%M:%S,000000+00:00")
        lines.append(f"{stamp} host kernel: NVRM: Xid (PCI:{pci}): {code}, pid=4242, "
                     f"name=python, simulated")  # fmt: skip
    events = tuple(e for e in (parse_line(s) for s in lines) if e is not None)
    log = KernelLog(events=events, boot_id="boot-1", driver_loaded_at=driver_loaded)
    return Seen("kernel_log", (log, KnownGpus(refs)))
