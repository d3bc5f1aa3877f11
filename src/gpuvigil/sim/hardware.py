"""Simulated hardware through the real layer-1 code: a fault -> what the node agent reports.

Called by `sim.detect.Layer1` once per fault kind (the verdicts are cached there). Each
fault is built the way the tests build it, read into the real readings and judged by the
real rules through the one pipeline the agent uses (`node.pipeline.judge`):
- GPU faults: a fake H100 node (`gpuvigil.fakes.gpu`) with the seeded `Fault` applied,
  read through the fake NVML by the real NVML worker's reader (in this process) and turned
  into a GpuInventory by `nvml_readings.inventory_from_lines`;
- Xids (the fake GPU's pending Xids, plus SRAM/GSP faults the fakes do not carry): printed
  as NVRM kernel-log lines, parsed by `kernel_log_parser.parse_line` into a KernelLog
  (judged with the shipped Xid catalog, boot noise included, and the GPU inventory);
- network adapters: a fake sysfs tree of a p5-like node (32 EFA adapters), read by the
  real fabric probe;
- a hung or missing tool: the real fail-closed check runner (`node.checks.run_check`).
"""

from __future__ import annotations

import functools
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.fakes import faults as fake_faults
from gpuvigil.fakes import nvml as fake_nvml
from gpuvigil.fakes.faults import Fault
from gpuvigil.fakes.gpu import FakeNode, make_node
from gpuvigil.fakes.nvidia_smi import render_xml
from gpuvigil.fakes.sysfs import FakeSysfs
from gpuvigil.node import sweep
from gpuvigil.node.checks import REGISTRY, CheckContext, Needs, run_check
from gpuvigil.node.checks.fabric import fabric as fabric_probe
from gpuvigil.node.checks.fabric.readings import NodeInstance
from gpuvigil.node.checks.gpu.nvidia_smi import parse_xml
from gpuvigil.node.checks.gpu.nvml_readings import inventory_from_lines
from gpuvigil.node.checks.gpu.nvml_worker import Worker
from gpuvigil.node.checks.gpu.readings import ExpectedGpus, GpuInventory, GpuRef, KnownGpus
from gpuvigil.node.checks.kernel_log.kernel_log_parser import parse_line
from gpuvigil.node.checks.kernel_log.readings import KernelLog
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.pipeline.judge import judge

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
BOOTED = NOW - timedelta(days=3)
# p5.48xlarge has 32 EFA adapters; 4 give the same verdicts and build 8x faster.
EFA_ADAPTERS = 4

# Faults the seeded enum does not carry: the Xid the driver prints for them.
XID_ONLY = {"SRAM_ECC": 95, "GSP_ERROR": 119}
# Faults that no node check can see: the host is down (its agent with it), a hung
# collective (the job sees it), silent corruption without an active check.
INVISIBLE = {"HOST_DOWN", "NCCL_HANG"}
FABRIC_FAULTS = {Fault.EFA_DOWN, Fault.EFA_MISSING}


def findings_for(fault: str, *, gpu: int, config: NodeConfig | None = None) -> list[Finding]:
    """Every FAILED or WARNING finding layer 1 reports for a node carrying `fault` on GPU
    `gpu` (the one the fault model drew; node-wide faults ignore it)."""
    cfg = config or sim_node_config()
    if fault in INVISIBLE:
        return []
    if fault in XID_ONLY or fault.startswith("XID_"):
        code = XID_ONLY.get(fault) or int(fault.removeprefix("XID_"))
        node = make_node(8, model="H100")
        return _problems(_xids(node, [(gpu, code, False)], cfg))
    f = Fault(fault.lower())
    if f is Fault.TOOL_HANG:
        return _problems(_tool(hang=True))
    if f is Fault.TOOL_MISSING:
        return _problems(_tool(hang=False))
    if f in FABRIC_FAULTS:
        return _problems(_fabric(f, cfg))
    node = make_node(8, model="H100")
    fake_faults.apply(node, f, gpu=gpu, seed=0)
    inv = _nvml_inventory(node)
    out = judge([inv, ExpectedGpus(8, "sim")], config=cfg, now=NOW, check="gpu")
    pending = [(g.index, x.code, x.boot) for g in node.gpus for x in g.xids]
    # the agent's last sweep saw the node healthy: a GPU lost since keeps its bus id
    out += _xids(node, pending, cfg, refs=inv.gpu_map(known=_healthy_map()))
    return _problems(out)


@functools.cache
def _healthy_map() -> dict[str, GpuRef]:
    """The Xid rules' GPU map from a sweep of the healthy node (before any fault)."""
    return _nvml_inventory(make_node(8, model="H100")).gpu_map()


def active_findings(fault: str, *, gpu: int) -> list[Finding]:
    """What the active checks (matmul correctness) report: silent corruption shows here."""
    if Fault(fault.lower()) is not Fault.SDC:
        return []
    node = make_node(8, model="H100")
    fake_faults.apply(node, Fault.SDC, gpu=gpu, seed=0)
    # a GPU that computes wrong answers is RMA material: fatal, REPLACE
    return [
        Finding(check="matmul", status=Status.FAILED, code="GPU_SDC", component=f"gpu:{g.index}",
                message="matmul result differs from the reference", fatal=True,
                action=Action.REPLACE, observed_at=NOW)
        for g in node.gpus
        if g.sdc
    ]  # fmt: skip


def _nvml_inventory(node: FakeNode) -> GpuInventory:
    """The snapshot the agent's NVML worker would take of `node`, read in-process."""
    fake_nvml.install(node)
    try:
        fake_nvml.nvmlInit()
        worker = Worker(fake_nvml)
        count = worker.call(fake_nvml.nvmlDeviceGetCount)
        lines = [worker.gpu(i, 36) for i in range(count if isinstance(count, int) else 0)]
        driver = worker.call(fake_nvml.nvmlSystemGetDriverVersion)
        lines.append({"done": True, "count": count, "driver_version": driver})
        fake_nvml.nvmlShutdown()
    finally:
        fake_nvml.install(None)
    return inventory_from_lines(lines, observed_at=NOW)


@functools.cache
def sim_node_config() -> NodeConfig:
    """The simulated fleet's node config: defaults, plus the boot noise its GPUs print
    (the fake's driver-load Xid), as an operator adds what their fleet shows."""
    return NodeConfig.model_validate(
        {"kernel_log": {"families": {"hopper": {"boot_noise": [fake_faults.BOOT_NOISE_XID]}}}}
    )


def check_interval_s(check: str) -> float:
    """How often the check that produced a finding runs (the agent's schedule)."""
    sweep.load_checks()
    spec = REGISTRY.get(check)
    return spec.interval_s if spec is not None else 60.0


def _problems(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status is not Status.OK]


def _xids(
    node: FakeNode,
    xids: list[tuple[int, int, bool]],
    cfg: NodeConfig,
    *,
    refs: dict[str, GpuRef] | None = None,
) -> list[Finding]:
    """Print each Xid as the driver would (with the GPU's own bus id, which the kernel
    knows even for a GPU NVML has lost), parse it and judge it with the real catalog and
    the agent's GPU map (`refs`; default: what nvidia-smi reads of the node)."""
    if refs is None:
        refs = parse_xml(render_xml(node), observed_at=NOW).gpu_map()
    bus = {g.index: g.pci_bus_id for g in node.gpus}
    lines, driver_loaded = [], None
    for index, code, boot in xids:
        at = BOOTED + timedelta(seconds=30) if boot else NOW - timedelta(seconds=5)
        if boot:
            driver_loaded = BOOTED + timedelta(seconds=20)
        pci = bus[index].removeprefix("0000")
        stamp = at.strftime("%Y-%m-%dT%H:%M:%S,000000+00:00")
        lines.append(f"{stamp} host kernel: NVRM: Xid (PCI:{pci}): {code}, pid=4242, "
                     f"name=python, simulated")  # fmt: skip
    events = tuple(e for e in (parse_line(s) for s in lines) if e is not None)
    log = KernelLog(events=events, boot_id="boot-1", driver_loaded_at=driver_loaded)
    return judge([log, KnownGpus(refs)], config=cfg, now=NOW, check="kernel_log")


def _fabric(fault: Fault, cfg: NodeConfig) -> list[Finding]:
    with tempfile.TemporaryDirectory(prefix="gpuvigil-sim-") as tmp:
        fs = FakeSysfs.node(Path(tmp), gpus=8, kind="efa", adapters=EFA_ADAPTERS)
        first = sorted(fs.pci_of)[0]
        if fault is Fault.EFA_DOWN:
            fs.port_down(first)
        else:
            fs.remove_adapter(first)
        reading = fabric_probe.read_fabric(Path(tmp))
        fabric = cfg.fabric.model_copy(update={"kind": "efa", "expect_adapters": EFA_ADAPTERS})
        node_cfg = cfg.model_copy(update={"fabric": fabric})
        return judge([reading, NodeInstance()], config=node_cfg, now=NOW, check="fabric")


def _tool(*, hang: bool) -> list[Finding]:
    """The real runner's verdict on a check whose tool hangs or is not installed."""
    sweep.load_checks()
    spec = REGISTRY["gpu"]
    ctx = CheckContext(config=NodeConfig(), env={"PATH": ""})
    if hang:
        spec = replace(spec, fn=lambda _ctx: time.sleep(0.2) or [], timeout_s=0.01)
    else:
        spec = replace(spec, needs=Needs(binaries=("nvidia-smi",)))
    findings, _ = run_check(spec, ctx)
    return findings
