"""The `gpu` check: GPUs through NVML, every call in a worker process that can be killed.

NVML calls can block forever inside the driver (a wedged GPU, a driver in recovery), so
they run in the NVML worker (`probes.nvml_client`), kept warm between sweeps. Each GPU has
its own deadline: a GPU that hangs is read as a Timeout of that GPU (CHECK_TIMEOUT on
`gpu:N`) and the next GPUs are read by a fresh worker, so one hung GPU hides nothing. NVML
failing to start is recorded as the `GpuSource` fact, after which `nvidia-smi -q -x` is
tried as the fallback. The readings (GpuInventory, ExpectedGpus, GpuSource and NVML's
own Xid events) go to the node's facts and the pipeline's GPU and Xid rules; this module
imports no rule.

Called through the registry by `gpuvigil check`, the agent, preflight and the bench.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from gpuvigil.core.findings import Finding, Status, utcnow
from gpuvigil.node import instance
from gpuvigil.node.bus_ids import normalize_bus_id
from gpuvigil.node.checks import CheckContext, Readout, check
from gpuvigil.node.checks.gpu.nvml_client import Answer, NvmlClient, client_for, close_all
from gpuvigil.node.checks.gpu.readings import (
    ExpectedGpus,
    GpuInventory,
    GpuSource,
    KnownGpus,
    NvmlXidEvents,
    ReadError,
)
from gpuvigil.node.checks.kernel_log.readings import XidEvent
from gpuvigil.node.checks.pcie.pcie import gpu_addresses

__all__ = ["Answer", "NvmlClient", "client_for", "close_all", "gpu_check"]


@check(
    "gpu",
    group="fast",
    interval_s=30,
    timeout_s=60,
    description="GPUs via NVML: count, lost, ECC, remapped rows, thermal, PCIe, NVLink",
)
def gpu_check(ctx: CheckContext) -> Readout:
    cfg = ctx.config.gpu
    expected = expected_gpus(ctx)
    client = client_for(cfg.nvml_module, ctx.env)
    inv, answer = client.snapshot(
        timeout_s=cfg.nvml_timeout_s,
        max_links=cfg.nvlink_max_links,
        budget_s=cfg.nvml_budget_s,
        events=True,
    )
    if answer.failure == "init" and answer.init_error is not None:
        return _without_nvml(ctx, answer.init_error, expected=expected)
    findings: list[Finding] = []
    if answer.failure:
        findings.append(_worker_failure(answer, inv, timeout_s=cfg.nvml_timeout_s))
        # A GPU cut short by the failure is not "missing": judge count only on a full answer.
        expected = ExpectedGpus(None, f"not judged: {answer.failure}")
    # The GPU map carried from sweep to sweep: a GPU that stopped answering keeps the bus
    # id an earlier sweep read, so its Xids stay on gpu:<index>.
    before = ctx.facts.get(KnownGpus)
    known = KnownGpus(inv.gpu_map(known=before.by_bus if before else None))
    readings: list[object] = [inv, expected, GpuSource(module=cfg.nvml_module), known]
    # NVML's Xid events came with the answer, unless a GPU hung (registering for them would
    # hang on it too; the kernel log, the primary source, still reports its Xids).
    if not answer.failure and not answer.hung:
        buses = {r.index: r.bus_id for r in known.by_bus.values()}
        new = xid_events_from_answer(answer, at=utcnow(), buses=buses)
        events = _kept_xid_events(ctx, new)
        if events is not None:
            readings.append(events)
    return Readout(tuple(readings), tuple(findings))


MAX_KEPT_EVENTS = 1000


def xid_events_from_answer(
    answer: Answer, *, at: datetime, buses: Mapping[int, str] | None = None
) -> list[XidEvent]:
    """The worker's events answer -> XidEvents with source "nvml" (pure). `buses` (GPU
    index -> bus id, from the GPU map) names the bus of a GPU NVML can no longer read."""
    out = []
    for line in answer.lines:
        for ev in line.get("events", ()) if isinstance(line, dict) else ():
            if not isinstance(ev, dict) or not isinstance(ev.get("xid"), int):
                continue
            pci = ev.get("pci") if isinstance(ev.get("pci"), str) else ""
            gpu = ev.get("gpu") if isinstance(ev.get("gpu"), int) else None
            if not pci and gpu is not None:
                pci = (buses or {}).get(gpu, "")
            text = f"NVML Xid {ev['xid']} on GPU {gpu} ({pci or 'unknown bus'})"
            out.append(
                XidEvent(
                    kind="xid",
                    code=ev["xid"],
                    pci_bus_id=pci,
                    bus_id=normalize_bus_id(pci) if pci else None,
                    message="reported by NVML (nvmlEventTypeXidCriticalError)",
                    line=text,
                    time=at,
                    source="nvml",
                    gpu_index=gpu,
                )
            )
    return out


def _kept_xid_events(ctx: CheckContext, events: list[XidEvent]) -> NvmlXidEvents | None:
    """The events NVML queued since the last sweep added to the ones kept so far (None when
    there are none new). A worker kept warm (the agent) sees every Xid from its start; a
    one-shot `check` only registers, and relies on the kernel log for earlier events."""
    if not events:
        return None
    kept = ctx.facts.get(NvmlXidEvents) or NvmlXidEvents()
    return NvmlXidEvents((*kept.events, *events)[-MAX_KEPT_EVENTS:])


def expected_gpus(ctx: CheckContext) -> ExpectedGpus:
    """`node.expect_gpus`, else the instance type's GPU count from the catalog, else the
    NVIDIA GPUs on the PCI bus (sysfs: a second source, so a GPU whose driver did not bind
    is still missed), else None (then only what NVML says is attached is judged).

    A PCI bus without NVIDIA GPUs gives None, not 0: a node is only GPU-less when the
    config says so (`--expect-gpus 0`), never because a broken bus shows nothing."""
    if ctx.config.expect_gpus is not None:
        return ExpectedGpus(int(ctx.config.expect_gpus), "config")
    _, entry = instance.lookup(ctx)
    if entry is not None:
        return ExpectedGpus(entry[1].gpus, f"catalog:{entry[0]}")
    on_bus = len(gpu_addresses(ctx.root))
    return ExpectedGpus(on_bus or None, "pci-bus" if on_bus else "none")


def _worker_failure(answer: Answer, inv: GpuInventory, *, timeout_s: float) -> Finding:
    done = {g.index for g in inv.gpus}
    hung = next((i for i in range(len(done) + 1) if i not in done), None) if done else None
    timeout = answer.failure == "timeout"
    return Finding(
        check="gpu",
        status=Status.FAILED,
        code="CHECK_TIMEOUT" if timeout else "CHECK_ERROR",
        component=f"gpu:{hung}" if timeout and hung is not None else "node",
        message=(
            f"NVML did not answer within {timeout_s:g} s"
            + (f" while reading GPU {hung}" if hung is not None else "")
            + "; the worker was killed"
            if timeout
            else f"the NVML worker failed: {answer.detail}"
        ),
        evidence={
            "gpus_read": sorted(done),
            "detail": answer.detail,
            "elapsed_s": round(answer.elapsed_s, 3),
        },
    )


def _without_nvml(ctx: CheckContext, error: ReadError, *, expected: ExpectedGpus) -> Readout:
    """NVML is unusable: record why (`GpuSource`), then try nvidia-smi so the node is
    still judged. The `gpu` rule says what that means (a missing binding with a working
    nvidia-smi is only a fallback; a failing NVML library or driver is DRIVER_UNAVAILABLE)."""
    from gpuvigil.node.checks.gpu import nvidia_smi

    module = ctx.config.gpu.nvml_module
    empty = GpuInventory("nvml", utcnow())
    if expected.count == 0:
        return Readout((empty, expected, GpuSource(error, "none", "no GPUs expected", module)))
    if not ctx.config.gpu.nvidia_smi_fallback:
        source = GpuSource(error, "none", "nvidia-smi fallback disabled", module)
        return Readout((empty, expected, source))
    inv, why, said = nvidia_smi.fallback_inventory(ctx)
    if inv is None:
        return Readout((empty, expected, GpuSource(error, "none", why, module, said)))
    return Readout((inv, expected, GpuSource(error, "nvidia-smi", None, module, said)))
