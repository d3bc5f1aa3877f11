"""GPU presence and reachability (count, lost, driver, read errors), and the four rules
that judge a whole GPU inventory (`gpu`, `gpu_memory`, `gpu_thermal`, `gpu_links`). Pure.

Fed by `node.pipeline` for the NVML check, the nvidia-smi fallback, `gpuvigil analyze` and
the simulator: the same readings always get the same findings, whatever their source.
Each GPU is judged on its own readings: one that did not answer (CHECK_TIMEOUT on that
GPU) hides nothing about the others.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.catalog import gpus as gpu_catalog
from gpuvigil.node.catalog.gpus import GpuCatalog
from gpuvigil.node.checks.gpu.readings import (
    LOST_ERRORS,
    ExpectedGpus,
    GpuInventory,
    GpuReading,
    GpuSource,
    ReadError,
)
from gpuvigil.node.checks.gpu.rules import gpu_pcie, memory, thermal
from gpuvigil.node.checks.nvlink import rules as nvlink
from gpuvigil.node.config import GpuConfig
from gpuvigil.node.pipeline.registry import Inputs, rule

# Source errors that mean "the driver is not usable" (nvidia-smi's own words, mapped to
# NVML's names by `probes.nvidia_smi_errors`): DRIVER_UNAVAILABLE, not a generic error.
DRIVER_ERRORS = {"DriverNotLoaded", "LibRmVersionMismatch", "Uninitialized", "LibraryNotFound"}


def count(inv: GpuInventory, *, expect: int | None, now: datetime, check: str) -> list[Finding]:
    """GPU_COUNT_LOW when the source sees fewer GPUs than the node should have."""
    if inv.count is None and inv.errors:
        return []  # the source could not be read (CHECK_ERROR says so)
    seen = inv.count if inv.count is not None else len(inv.gpus)
    if expect is None and inv.count == 0:
        # "No devices were found" on a node whose GPU count nobody stated: never healthy.
        return [
            Finding(
                check=check,
                status=Status.FAILED,
                code="CHECK_ERROR",
                message=f"{inv.source} sees no GPU and the number this node should have is "
                "unknown: give --expect-gpus (0 for a node without GPUs) or the instance type",
                evidence={"seen": 0, "source": inv.source},
                observed_at=now,
            )
        ]
    if expect is None or seen >= expect:
        return []
    return [
        Finding(
            check=check,
            status=Status.FAILED,
            code="GPU_COUNT_LOW",
            message=f"{seen} GPU(s) visible to {inv.source}, {expect} expected",
            action=Action.REBOOT,
            fatal=True,
            evidence={
                "seen": seen,
                "expected": expect,
                "source": inv.source,
                "pci_bus_ids": sorted(b for b in inv.by_bus_id()),
            },
            observed_at=now,
        )
    ]


def reachability(gpu: GpuReading, *, now: datetime, check: str) -> list[Finding]:
    """GPU_LOST for a GPU that is lost or answers with unknown errors; CHECK_ERROR /
    CHECK_TIMEOUT for readings that failed for another reason (fail closed)."""
    ev = {"gpu_uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id}
    if gpu.lost:
        lost = [e for e in gpu.errors if e.error in LOST_ERRORS] or list(gpu.errors[:1])
        reset_only = bool(lost) and all(e.error == "ResetRequired" for e in lost)
        return [
            Finding(
                check=check,
                status=Status.FAILED,
                code="GPU_LOST",
                component=gpu.component,
                message=_lost_message(lost),
                action=Action.RESET_GPU if reset_only else Action.REBOOT,
                fatal=True,
                evidence={**ev, "errors": [_err(e) for e in lost]},
                observed_at=now,
            )
        ]
    out = []
    for code, errs in (
        ("CHECK_TIMEOUT", [e for e in gpu.errors if e.error == "Timeout"]),
        ("CHECK_ERROR", [e for e in gpu.errors if e.error != "Timeout"]),
    ):
        if errs:
            fields = ", ".join(sorted({e.field for e in errs}))
            # A hung GPU's reading says which deadline it missed: say that, not "Timeout".
            why = errs[0].message if code == "CHECK_TIMEOUT" and errs[0].message else errs[0].error
            out.append(
                Finding(
                    check=check,
                    status=Status.FAILED,
                    code=code,
                    component=gpu.component,
                    message=f"could not read {fields}: {why}",
                    evidence={**ev, "errors": [_err(e) for e in errs]},
                    observed_at=now,
                )
            )
    return out


# nvmlDeviceGpuRecoveryAction_t name -> (our action, drain now?).
_RECOVERY = {
    "GPU_RESET": (Action.RESET_GPU, False),
    "BUS_RESET": (Action.RESET_GPU, False),
    "DRAIN_P2P": (Action.RESET_GPU, True),
    "DRAIN_AND_RESET": (Action.RESET_GPU, True),
    "NODE_REBOOT": (Action.REBOOT, True),
    "SYSTEM_REBOOT": (Action.REBOOT, True),
    "RECOVER_IMEX_DOMAIN": (Action.INVESTIGATE, True),
}


def recovery(gpu: GpuReading, *, now: datetime, check: str) -> list[Finding]:
    """GPU_RECOVERY_REQUIRED when the driver itself says the GPU needs a reset, a drain or
    a reboot (NVML's recovery action; `nvidia-smi -q` "GPU Recovery Action" / "GPU Reset
    Status"). An action this catalog does not know asks for a person."""
    action = gpu.recovery_action
    if action in (None, "NONE"):
        return []
    ours, fatal = _RECOVERY.get(action, (Action.INVESTIGATE, True))
    return [
        Finding(
            check=check,
            status=Status.FAILED,
            code="GPU_RECOVERY_REQUIRED",
            component=gpu.component,
            message=f"the driver asks for recovery of this GPU: {action}",
            action=ours,
            fatal=fatal,
            evidence={"recovery_action": action, "gpu_uuid": gpu.uuid},
            observed_at=now,
        )
    ]


def inventory_errors(inv: GpuInventory, *, now: datetime, check: str) -> list[Finding]:
    """Node-wide problems of the source (truncated output, a failed device count)."""
    errors = [e for e in inv.errors if e.error not in DRIVER_ERRORS]
    if not errors:
        return []
    return [
        Finding(
            check=check,
            status=Status.FAILED,
            code="CHECK_ERROR",
            message=f"{inv.source}: " + "; ".join(e.message or e.error for e in errors),
            evidence={"source": inv.source, "errors": [_err(e) for e in errors]},
            observed_at=now,
        )
    ]


def presence(inv: GpuInventory, *, expect: int | None, now: datetime, check: str) -> list[Finding]:
    """Count, the source's own errors, and each GPU's reachability and recovery verdict."""
    out = count(inv, expect=expect, now=now, check=check)
    out += inventory_errors(inv, now=now, check=check)
    for e in inv.errors:
        if e.error in DRIVER_ERRORS:
            out += driver_unavailable(e, expect=expect, now=now, check=check)
    for gpu in inv.gpus:
        out += reachability(gpu, now=now, check=check)
        if not gpu.lost:
            out += recovery(gpu, now=now, check=check)
    return out


def _answered(inv: GpuInventory) -> list[GpuReading]:
    return [g for g in inv.gpus if not g.lost]


def _each_gpu(
    evaluate: Callable[..., list[Finding]],
    inv: GpuInventory,
    *,
    cfg: GpuConfig,
    catalog: GpuCatalog,
    now: datetime,
    check: str,
) -> list[Finding]:
    return [
        f
        for g in _answered(inv)
        for f in evaluate(g, cfg=cfg, product=catalog.lookup(g.name), now=now, check=check)
    ]


def memory_all(inv: GpuInventory, **kw: Any) -> list[Finding]:
    return _each_gpu(memory.evaluate, inv, **kw)


def thermal_all(inv: GpuInventory, **kw: Any) -> list[Finding]:
    return _each_gpu(thermal.evaluate, inv, **kw)


def links_all(
    inv: GpuInventory,
    previous: GpuInventory | None,
    *,
    cfg: GpuConfig,
    catalog: GpuCatalog,
    now: datetime,
    check: str,
) -> list[Finding]:
    out: list[Finding] = []
    for g in _answered(inv):
        product = catalog.lookup(g.name)
        out += gpu_pcie.evaluate(g, cfg=cfg, product=product, now=now, check=check)
        out += nvlink.links_down(g, product=product, now=now, check=check)
    return out + nvlink.error_rates(inv, previous, cfg=cfg, check=check)


def judge_inventory(
    inv: GpuInventory,
    *,
    cfg: GpuConfig,
    catalog: GpuCatalog,
    now: datetime,
    expect: int | None = None,
    previous: GpuInventory | None = None,
    check: str = "gpu",
) -> list[Finding]:
    """Every GPU rule over one inventory (`previous`: the last one, for NVLink rates).
    The pipeline runs the same four rules; this is for callers holding one inventory."""
    kw: dict[str, Any] = {"cfg": cfg, "catalog": catalog, "now": now, "check": check}
    return (
        presence(inv, expect=expect, now=now, check=check)
        + memory_all(inv, **kw)
        + thermal_all(inv, **kw)
        + links_all(inv, previous, **kw)
    )


# --- the rules the pipeline runs over a GpuInventory --------------------------------------


@rule(
    "gpu",
    reads=GpuInventory,
    uses=(ExpectedGpus, GpuSource),
    codes=("GPU_COUNT_LOW", "GPU_LOST", "GPU_RECOVERY_REQUIRED", "SOURCE_FALLBACK"),
)
def gpu_rule(inv: GpuInventory, on: Inputs) -> list[Finding]:
    """GPU count, lost GPUs, unreadable GPUs, the driver's recovery verdict, and whether
    NVML itself answered (else the fallback source in use, or the driver missing)."""
    expected = on.get(ExpectedGpus)
    expect = expected.count if expected is not None else None
    source = on.get(GpuSource)
    out = source_findings(source, expect=expect, now=on.now, check=on.check) if source else []
    if source is not None and source.used == "none":
        return out  # nothing was read: the source findings are the verdict
    return out + presence(inv, expect=expect, now=on.now, check=on.check)


@rule("gpu_memory", reads=GpuInventory, codes=memory.CODES)
def gpu_memory_rule(inv: GpuInventory, on: Inputs) -> list[Finding]:
    """ECC errors, retired pages and remapped rows of every GPU that answered."""
    cfg = on.config.gpu
    return memory_all(inv, cfg=cfg, catalog=gpu_catalog.load(), now=on.now, check=on.check)


@rule("gpu_thermal", reads=GpuInventory, codes=thermal.CODES)
def gpu_thermal_rule(inv: GpuInventory, on: Inputs) -> list[Finding]:
    """Temperatures against the GPU's own or the catalog's limits, and slowdown reasons."""
    cfg = on.config.gpu
    return thermal_all(inv, cfg=cfg, catalog=gpu_catalog.load(), now=on.now, check=on.check)


@rule("gpu_links", reads=GpuInventory, codes=("PCIE_DEGRADED", "NVLINK_DOWN", "NVLINK_ERRORS"))
def gpu_links_rule(inv: GpuInventory, on: Inputs) -> list[Finding]:
    """PCIe width/speed of each GPU, NVLinks down, and NVLink error rates since the
    previous inventory."""
    cfg = on.config.gpu
    return links_all(
        inv, on.previous(), cfg=cfg, catalog=gpu_catalog.load(), now=on.now, check=on.check
    )


def source_findings(
    source: GpuSource, *, expect: int | None, now: datetime, check: str
) -> list[Finding]:
    """NVML could not start: DRIVER_UNAVAILABLE (or DEPENDENCY_MISSING for a binding that
    is not installed), and SOURCE_FALLBACK when nvidia-smi stood in."""
    error = source.primary_error
    if error is None or expect == 0:
        return []
    fallback = (
        "judged from nvidia-smi instead"
        if source.used == "nvidia-smi"
        else (source.fallback_error or "nvidia-smi fallback disabled")
    )
    out: list[Finding] = []
    if source.used == "nvidia-smi":
        reason = f"{error.error}: {error.message}"
        out.append(
            Finding(
                check=check,
                status=Status.WARNING,
                code="SOURCE_FALLBACK",
                message=f"NVML unusable ({reason}); GPUs read from nvidia-smi -q -x instead",
                evidence={"primary": "nvml", "fallback": "nvidia-smi", "reason": reason},
                observed_at=now,
            )
        )
    if error.error == "ImportError":
        if source.used == "nvidia-smi":
            return out  # the driver is fine; only the Python binding is missing
        return [
            Finding(
                check=check,
                status=Status.FAILED,
                code="DEPENDENCY_MISSING",
                message=f"the NVML binding {source.module!r} cannot be imported "
                f"({error.message}); {fallback}",
                evidence={"module": source.module, "error": error.message},
                observed_at=now,
            )
        ]
    return driver_unavailable(error, expect=expect, now=now, check=check, fallback=fallback) + out


def driver_unavailable(
    error: ReadError, *, expect: int | None, now: datetime, check: str, fallback: str = ""
) -> list[Finding]:
    """NVML could not start. On a node that should have GPUs (expect None or > 0) that is
    DRIVER_UNAVAILABLE; on a node configured with no GPUs it is nothing."""
    if expect == 0:
        return []
    return [
        Finding(
            check=check,
            status=Status.FAILED,
            code="DRIVER_UNAVAILABLE",
            message=f"NVML cannot initialise ({error.error}: {error.message})"
            + (f"; {fallback}" if fallback else "")
            + (
                ". Is the NVIDIA driver installed and loaded? On a node without GPUs, "
                "use --expect-gpus 0."
            ),
            action=Action.REBOOT if error.error == "DriverNotLoaded" else Action.INVESTIGATE,
            evidence={"error": _err(error), "expected_gpus": expect},
            observed_at=now,
        )
    ]


def _lost_message(errs: list[ReadError]) -> str:
    if not errs:
        return "the GPU is lost"
    names = sorted({e.error for e in errs})
    return f"the GPU does not answer ({', '.join(names)} on {errs[0].field})"


def _err(e: ReadError) -> dict[str, str]:
    return {"field": e.field, "error": e.error, "message": e.message}
