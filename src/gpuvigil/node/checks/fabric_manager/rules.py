"""Pure rule: a Fabric Manager log -> findings.

- The service's last word decides its state: the last of started / stopped / failed.
  Failed is FABRIC_MANAGER_FAILED (FAILED): on an NVSwitch system no GPU can join the
  NVLink fabric, so CUDA work fails (`cudaErrorSystemNotReady`). Stopped and not started
  again is FABRIC_MANAGER_STOPPED (WARNING: a shutdown stops it too).
- NVSwitch errors FM reports ("detected NVSwitch fatal error 20034 ...") are SXID_<n>,
  judged by the SXid catalog like the kernel's SXid lines; a code it does not know takes
  FM's own word (fatal: FAILED + REBOOT, non-fatal: WARNING).
- Any other line that says an error is FABRIC_MANAGER_ERROR (WARNING): never healthy.
"""

from __future__ import annotations

from gpuvigil.core import codes
from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.catalog.xid import load_catalog
from gpuvigil.node.checks.fabric_manager.readings import (
    FabricManagerLog,
    FabricRegistration,
    FmEvent,
    GpuFabricStates,
)
from gpuvigil.node.pipeline.registry import Inputs, rule

LIFECYCLE = ("started", "stopped", "failed")
MAX_LINES = 5  # lines kept as evidence per finding


@rule(
    "fabric_manager",
    reads=FabricManagerLog,
    codes=(
        "FABRIC_MANAGER_ERROR",
        "FABRIC_MANAGER_FAILED",
        "FABRIC_MANAGER_STOPPED",
        codes.ANY_SXID,
    ),
)
def fabric_manager_rule(log: FabricManagerLog, on: Inputs) -> list[Finding]:
    """Fabric Manager: started/stopped/failed, NVSwitch SXid errors, logged errors."""
    out: list[Finding] = []

    def add(status: Status, code: str, message: str, events: list[FmEvent], **kw) -> None:
        out.append(
            Finding(
                check=on.check,
                status=status,
                code=code,
                component=kw.pop("component", "fabric_manager"),
                message=message,
                action=kw.pop("action", Action.INVESTIGATE),
                fatal=kw.pop("fatal", False),
                evidence={
                    "lines": [e.line for e in events[-MAX_LINES:]],
                    "count": len(events),
                    "source": log.source,
                    **kw,
                },
                observed_at=on.now,
            )
        )

    if log.lines_read == 0:
        return [
            Finding(
                check=on.check,
                status=Status.FAILED,
                code="CHECK_ERROR",
                component="fabric_manager",
                message="no Fabric Manager line in this input (nv-fabricmanager journal, "
                "fabricmanager.log or systemctl status): nothing was judged",
                evidence={"source": log.source},
                observed_at=on.now,
            )
        ]
    life = [e for e in log.events if e.kind in LIFECYCLE]
    if life and life[-1].kind == "failed":
        add(
            Status.FAILED,
            "FABRIC_MANAGER_FAILED",
            "Fabric Manager failed: NVSwitch GPUs cannot join the NVLink fabric",
            [e for e in life if e.kind == "failed"],
        )
    elif life and life[-1].kind == "stopped":
        add(
            Status.WARNING,
            "FABRIC_MANAGER_STOPPED",
            "Fabric Manager was stopped and the log shows no later start",
            [life[-1]],
            action=Action.NONE,
        )
    out += _sxids(log, on)
    errors = [e for e in log.events if e.kind == "error"]
    if errors:
        add(
            Status.WARNING,
            "FABRIC_MANAGER_ERROR",
            f"Fabric Manager logged {len(errors)} error line(s)",
            errors,
        )
    return out


def _sxids(log: FabricManagerLog, on: Inputs) -> list[Finding]:
    catalog = load_catalog()
    seen: dict[tuple[int, str | None], list[FmEvent]] = {}
    for e in log.events:
        if e.sxid is not None:
            seen.setdefault((e.sxid, e.switch), []).append(e)
    out = []
    for (code, switch), events in seen.items():
        entry = catalog.rule("sxid", code)
        fm_fatal = any(e.kind == "sxid_fatal" for e in events)
        outcome = entry.outcome_for(events[-1].line) if entry.known else None
        status = outcome.status if outcome else (Status.FAILED if fm_fatal else Status.WARNING)
        action = outcome.action if outcome else (Action.REBOOT if fm_fatal else Action.NONE)
        if fm_fatal and status is not Status.FAILED:
            status, action = Status.FAILED, Action.REBOOT  # FM itself called it fatal
        out.append(
            Finding(
                check=on.check,
                status=status,
                code=codes.sxid(code),
                component=f"nvswitch:{switch}" if switch else "nvswitch",
                message=f"Fabric Manager: NVSwitch {'fatal' if fm_fatal else 'non-fatal'} "
                f"error {code} ({entry.name}) x{len(events)}",
                action=action,
                fatal=fm_fatal or bool(outcome and outcome.fatal),
                evidence={
                    "lines": [e.line for e in events[-MAX_LINES:]],
                    "count": len(events),
                    "in_catalog": entry.known,
                    "source": log.source,
                },
                observed_at=on.now,
            )
        )
    return out


_DONE_STATES = ("completed", "n/a", "")
_DONE_STATUSES = ("success", "n/a", "")


@rule("gpu_fabric_registration", reads=GpuFabricStates, codes=("GPU_FABRIC_NOT_REGISTERED",))
def gpu_fabric_registration(states: GpuFabricStates, on: Inputs) -> list[Finding]:
    """Each GPU's NVLink fabric registration (nvidia-smi -q `Fabric`: State, Status).

    `In Progress` or `Not Started` means Fabric Manager (or NVLSM on NVL5+) has not
    registered the GPU, and CUDA fails with cudaErrorSystemNotReady; a Status other than
    Success is a failed registration. GPUs without NVSwitch print N/A."""
    out = []
    unplaced = sum(1 for g in states.gpus if g.index < 0 and not g.bus_id)
    for g in states.gpus:
        state, status = (g.state or "").lower(), (g.status or "").lower()
        if state in _DONE_STATES and status in _DONE_STATUSES:
            continue
        out.append(
            Finding(
                check=on.check,
                status=Status.FAILED,
                code="GPU_FABRIC_NOT_REGISTERED",
                component=_component(g, unplaced),
                message=f"GPU fabric registration: State {g.state}, Status {g.status}",
                action=Action.INVESTIGATE,
                evidence={"state": g.state, "status": g.status, "pci_bus_id": g.bus_id},
                observed_at=on.now,
            )
        )
    return out


def _component(g: FabricRegistration, unplaced: int) -> str:
    """`gpu:N`; a GPU the output does not place: its bus id, else `gpu:?` (`gpu:?k`, the
    k-th section, when the paste holds several)."""
    if g.index >= 0:
        return f"gpu:{g.index}"
    if g.bus_id:
        return f"gpu:{g.bus_id}"
    return "gpu:?" if unplaced == 1 else f"gpu:?{-g.index}"
