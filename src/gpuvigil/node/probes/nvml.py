"""The `gpu` check: GPUs through NVML, every call in a worker process that can be killed.

NVML calls can block forever inside the driver (a wedged GPU, a driver in recovery), so
they run in the NVML worker (`probes.nvml_client`), kept warm between sweeps. A hang is
CHECK_TIMEOUT naming the GPU that did not answer; NVML failing to initialise on a node
that should have GPUs is DRIVER_UNAVAILABLE, after which `nvidia-smi -q -x` is tried as
the fallback (SOURCE_FALLBACK). The readings go to the pure rules (`rules.gpu`); the GPU
map and NVML's Xid events go to the kernel-log check through `CheckContext.extras`.

Called through the registry by `gpuvigil check`, the agent, preflight and the bench.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from gpuvigil.core.findings import Finding, Status, utcnow
from gpuvigil.node.catalog import gpus as gpu_catalog
from gpuvigil.node.checks import CheckContext, check
from gpuvigil.node.probes import instance
from gpuvigil.node.probes.nvml_client import Answer, NvmlClient, client_for, close_all
from gpuvigil.node.probes.pcie import read_pcie
from gpuvigil.node.readings import GpuInventory, ReadError, XidEvent, normalize_bus_id
from gpuvigil.node.rules import gpu as gpu_rules

__all__ = ["Answer", "NvmlClient", "client_for", "close_all", "gpu_check"]


# --- The check -----------------------------------------------------------------------------
PREVIOUS_KEY = "gpu.previous_inventory"


@check(
    "gpu",
    group="fast",
    interval_s=30,
    timeout_s=60,
    description="GPUs via NVML: count, lost, ECC, remapped rows, thermal, PCIe, NVLink",
)
def gpu_check(ctx: CheckContext) -> list[Finding]:
    cfg = ctx.config.gpu
    expect = expected_gpus(ctx)
    now = utcnow()
    client = client_for(cfg.nvml_module, ctx.env)
    inv, answer = client.snapshot(timeout_s=cfg.nvml_timeout_s, max_links=cfg.nvlink_max_links)
    if answer.failure == "init" and answer.init_error is not None:
        return _without_nvml(ctx, answer.init_error, expect=expect)
    out: list[Finding] = []
    if answer.failure:
        out.append(_worker_failure(answer, inv, timeout_s=cfg.nvml_timeout_s))
        # A GPU cut short by the hang is not "missing": judge count only on a full answer.
        expect = None
    previous = ctx.extras.get(PREVIOUS_KEY)
    if not answer.failure:
        ctx.extras[PREVIOUS_KEY] = inv
    out += gpu_rules.judge_inventory(
        inv,
        cfg=cfg,
        catalog=gpu_catalog.load(),
        now=now,
        expect=expect,
        previous=previous if isinstance(previous, GpuInventory) else None,
        check="gpu",
    )
    ctx.extras["gpu.inventory"] = inv
    known = ctx.extras.get("gpu_map")  # last sweep's: a GPU lost since keeps its bus id
    ctx.extras["gpu_map"] = inv.gpu_map(known=known if isinstance(known, dict) else None)
    if not answer.failure:
        out += _drain_xid_events(client, ctx, timeout_s=cfg.nvml_timeout_s)
    return out


XID_EVENTS_KEY = "nvml_xid_events"  # the kernel_log check reconciles these with the log
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
                )
            )
    return out


def _drain_xid_events(client: NvmlClient, ctx: CheckContext, *, timeout_s: float) -> list[Finding]:
    """Collect Xid events NVML queued since the last sweep (the first call registers).

    A worker kept warm (the agent) sees every Xid from its start; a one-shot `check`
    only registers, and relies on the kernel log for earlier events.
    """
    answer = client.request({"op": "events", "timeout_ms": 0}, timeout_s=timeout_s)
    if answer.failure:
        return [_worker_failure(answer, GpuInventory("nvml", utcnow()), timeout_s=timeout_s)]
    refs = ctx.extras.get("gpu_map")
    buses = {r.index: r.bus_id for r in refs.values()} if isinstance(refs, dict) else None
    events = xid_events_from_answer(answer, at=utcnow(), buses=buses)
    if events:
        kept = [*ctx.extras.get(XID_EVENTS_KEY, ()), *events][-MAX_KEPT_EVENTS:]
        ctx.extras[XID_EVENTS_KEY] = kept
    return []


def expected_gpus(ctx: CheckContext) -> int | None:
    """`node.expect_gpus`, else the instance type's GPU count from the catalog, else the
    NVIDIA GPUs on the PCI bus (sysfs: a second source, so a GPU whose driver did not bind
    is still missed), else None (then only what NVML says is attached is judged).

    A PCI bus without NVIDIA GPUs gives None, not 0: a node is only GPU-less when the
    config says so (`--expect-gpus 0`), never because a broken bus shows nothing."""
    if ctx.config.expect_gpus is not None:
        return int(ctx.config.expect_gpus)
    _, entry = instance.lookup(ctx)
    if entry is not None:
        return entry[1].gpus
    on_bus = sum(1 for link in read_pcie(ctx.root).links if link.role == "gpu")
    return on_bus or None


def _worker_failure(answer: Answer, inv: GpuInventory, *, timeout_s: float) -> Finding:
    done = {g.index for g in inv.gpus}
    hung = next((i for i in range(len(done) + 1) if i not in done), None)
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


def _without_nvml(ctx: CheckContext, error: ReadError, *, expect: int | None) -> list[Finding]:
    """NVML is unusable: say so, then try nvidia-smi so the node is still judged.

    A missing Python binding (ImportError) with a working nvidia-smi is only a fallback
    (the driver is fine); a failing NVML library or driver is DRIVER_UNAVAILABLE.
    """
    from gpuvigil.node.probes import nvidia_smi

    if expect == 0:
        return []
    now = utcnow()
    fallback: list[Finding] = []
    note = "nvidia-smi fallback disabled"
    if ctx.config.gpu.nvidia_smi_fallback:
        reason = f"{error.error}: {error.message}"
        fallback, note = nvidia_smi.fallback_findings(ctx, reason=reason, expect=expect)
    if error.error == "ImportError":
        if fallback:
            return fallback
        return [
            Finding(
                check="gpu",
                status=Status.FAILED,
                code="DEPENDENCY_MISSING",
                message=f"the NVML binding {ctx.config.gpu.nvml_module!r} cannot be imported "
                f"({error.message}); {note}",
                evidence={"module": ctx.config.gpu.nvml_module, "error": error.message},
                observed_at=now,
            )
        ]
    unavailable = gpu_rules.driver_unavailable(
        error, expect=expect, now=now, check="gpu", fallback=note
    )
    return unavailable + fallback
