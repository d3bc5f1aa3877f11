"""One pipeline from reading to finding: rules declare what they read, `judge` feeds them,
and every path that judges a node (the live check, the agent's stream, `analyze`, the
simulator, replay) gives the same verdict for the same readings."""

from __future__ import annotations

import importlib
import threading
import time
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuvigil.core import codes
from gpuvigil.core.findings import Finding, Status
from gpuvigil.fakes import faults
from gpuvigil.fakes.faults import Fault
from gpuvigil.fakes.gpu import make_node
from gpuvigil.node import sweep
from gpuvigil.node.checks import REGISTRY, CheckContext, run_check
from gpuvigil.node.checks.domain import load_domains, modules_of
from gpuvigil.node.checks.gpu import fake as gpu_fake
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuReading
from gpuvigil.node.checks.kernel_log import fake as kernel_log_fake
from gpuvigil.node.checks.kernel_log import kernel_log
from gpuvigil.node.checks.kernel_log.readings import KernelLog
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.kernel_watch import KernelStreamConfig, KernelWatch
from gpuvigil.node.pipeline import registry
from gpuvigil.node.pipeline.facts import Facts
from gpuvigil.node.pipeline.judge import judge, load_rules
from gpuvigil.sim import hardware, replay

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
# Every domain's readings (`node/checks/<domain>/readings.py`), live checks' and pasted tools'.
READING_MODULES = [
    importlib.import_module(name)
    for d in load_domains()
    for name in modules_of(importlib.import_module(f"gpuvigil.node.checks.{d}"))
    if name.endswith(".readings")
]
READING_TYPES = {
    obj
    for module in READING_MODULES
    for obj in vars(module).values()
    if isinstance(obj, type) and obj.__module__ == module.__name__
}


def test_facts_keep_the_latest_and_the_one_before() -> None:
    f = Facts()
    assert f.get(KernelLog) is None and f.previous(KernelLog) is None
    a, b = KernelLog(lines_read=1), KernelLog(lines_read=2)
    f.put(a)
    f.put(b)
    assert f.get(KernelLog) is b and f.previous(KernelLog) is a and KernelLog in f


def test_every_rule_declares_typed_readings_and_a_known_family() -> None:
    rules = load_rules()
    assert {"gpu", "gpu_memory", "gpu_thermal", "gpu_links", "xid", "driver_faults", "dcgm",
            "fabric", "pcie"} <= set(rules)  # fmt: skip
    for spec in rules.values():
        assert spec.reads in READING_TYPES, spec.name
        assert set(spec.uses) <= READING_TYPES, spec.name
        assert spec.families and set(spec.families) <= set(codes.FAMILIES), spec.name
        assert spec.description, f"rule {spec.name} has no docstring"


def test_a_rule_may_not_read_what_it_did_not_declare() -> None:
    spec = load_rules()["gpu_memory"]
    inputs = registry.Inputs(spec, now=NOW, config=NodeConfig(), check="gpu", latest={},
                             previous={})  # fmt: skip
    with pytest.raises(registry.UndeclaredInput):
        inputs.get(KernelLog)


@dataclass(frozen=True)
class _Odd:
    """A reading only the broken rule below reads."""

    n: int = 0


def test_a_rule_that_raises_fails_closed_and_spares_the_others() -> None:
    @registry.rule("test_broken", reads=_Odd, codes=("CHECK_ERROR",))
    def broken(reading: _Odd, on: registry.Inputs) -> list[Finding]:
        """Always raises."""
        raise ZeroDivisionError("bug")

    try:
        inv = GpuInventory("nvml", NOW, gpus=(GpuReading(index=0, ecc_volatile_uncorrected=2),))
        found = judge([_Odd(), inv], config=NodeConfig(), now=NOW, check="gpu")
    finally:
        registry.RULES.pop("test_broken")
    err = [f for f in found if f.code == "CHECK_ERROR" and f.evidence.get("rule") == "test_broken"]
    assert err and err[0].status is Status.FAILED and "ZeroDivisionError" in err[0].message
    assert ("ECC_UNCORRECTED_VOLATILE", "gpu:0") in {(f.code, f.component) for f in found}


# Faults the fake NVML can be read through (the others stop NVML or the tools themselves).
NVML_READABLE = [
    f for f in Fault if f not in (Fault.TOOL_HANG, Fault.TOOL_MISSING, Fault.DRIVER_UNAVAILABLE)
]


@pytest.mark.parametrize("fault", NVML_READABLE)
def test_each_gpu_rule_feeds_only_its_declared_family(fault: Fault) -> None:
    """A finding's family is its rule's, or the could-not-judge family."""
    node = make_node(8, model="H100")
    faults.apply(node, fault, gpu=3, seed=0)
    inv = gpu_fake.nvml_inventory(node, now=NOW)  # the fake NVML through the real worker's reader
    cfg = NodeConfig()
    for spec in load_rules().values():
        if spec.reads is not GpuInventory:
            continue
        inputs = registry.Inputs(spec, now=NOW, config=cfg, check="gpu", latest={},
                                 previous={})  # fmt: skip
        for f in spec.fn(inv, inputs):
            assert f.family in (*spec.families, codes.HEALTH_CHECK), (spec.name, f.code)


# --- the same readings, the same verdict, on every path ----------------------------------

BUS = "00000000:3B:00.0"
XID48 = "NVRM: Xid (PCI:0000:3b:00): 48, pid=77, name=python3, DBE (0x0000001c)"


def _inventory() -> GpuInventory:
    gpu = GpuReading(index=3, pci_bus_id=BUS, architecture="Hopper", name="NVIDIA H100 80GB HBM3")
    return GpuInventory("nvml", datetime.now(UTC), gpus=(gpu,), count=1)


def _verdict(found: list[Finding]) -> set[tuple[str, str, str, bool]]:
    return {
        (f.code, f.component, f.action.value, f.fatal) for f in found if f.code.startswith("XID")
    }


def test_the_same_xid_gets_the_same_verdict_on_every_path(tmp_path: Path) -> None:
    sweep.load_checks()
    stamp = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S,000000+00:00")
    line = f"{stamp} NVRM: {XID48.removeprefix('NVRM: ')}"
    log = tmp_path / "kern.log"
    log.write_text(f"{stamp} kernel: Linux version 6.1\n{line}\n")
    want = {("XID_48", "gpu:3", "RESET_GPU", True)}

    # 1. the live check (`gpuvigil check`), with the `gpu` check's inventory in the facts
    cfg = NodeConfig.model_validate({"kernel_log": {"file": str(log)}})
    ctx = CheckContext(config=cfg, root=Path("/"), env={"PATH": ""})
    ctx.facts.put(_inventory())
    live, _ = run_check(REGISTRY["kernel_log"], ctx)
    assert _verdict(live) == want

    # 2. the agent's stream
    stream_ctx = CheckContext(config=NodeConfig(), root=tmp_path, env={"PATH": ""})
    stream_ctx.facts.put(_inventory())
    watch = KernelWatch(KernelStreamConfig(source="file", file=log), ctx=stream_ctx,
                        changed=threading.Event(), metrics=None)  # fmt: skip
    watch.start()
    try:
        assert watch.ready.wait(10)
        assert _verdict(watch.snapshot(time.monotonic())[0]) == want
    finally:
        watch.stop()

    # 3. `gpuvigil analyze` of the capture, with the captured GPU readings
    captured = kernel_log.analyze_capture(log.read_bytes(), gpus=_inventory().gpu_map())
    assert _verdict(captured) == want

    # 4. the simulator's layer 1 (the same Xid on the fake node's GPU 3)
    seen = kernel_log_fake.xid_log(make_node(8, model="H100"), [(3, 48, False)],
                                   now=hardware.NOW, booted=hardware.BOOTED)  # fmt: skip
    sim = hardware.judged(seen, hardware.sim_node_config())
    assert _verdict(sim) == want

    # 5. replay of the kernel log (no GPU map there: the PCI address names the part)
    (node_log := tmp_path / "gpu-7.log").write_text(line + "\n")
    changes = list(replay.changes_from_kernel_logs([node_log], config=NodeConfig()))
    assert _verdict(changes[-1][2]) == {("XID_48", "pci:0000:3b:00.0", "RESET_GPU", True)}


def test_readings_are_frozen_values() -> None:
    for cls in READING_TYPES:
        params = getattr(cls, "__dataclass_params__", None)
        if params is not None and fields(cls):
            assert params.frozen, cls.__name__
