"""Pure rules: Xid/SXid events + catalog + GPU map + now -> XID_<n> / SXID_<n> findings.

Registered as the `xid` rule over a KernelLog reading: `node.pipeline` feeds it for the
kernel_log check, the agent's stream (with the events its /dev/kmsg follower and NVML's
event loop collected), `gpuvigil analyze`, the simulator and replay. Never reads the clock
or the world: the boot id, driver load time, the GPU map, NVML's events, the remediator's
GPU resets (`GpuResets`) and a person's release (`Release`) come in as typed facts.

What it decides, per event and then per (code, component):
- reconciliation: an NVML event and a kernel-log event of the same code on the same GPU
  within `match_s` are one event (the kernel line is kept as evidence; both sources are
  named); the same line read twice (two sources, two reads) counts once;
- clearing: an event stops counting once what it calls for has happened - a reboot after
  it (a different boot id) for actions up to REBOOT, a GPU reset after it (a reset of that
  GPU or a driver load) for actions up to RESET_GPU, or, for NONE/RESTART_APP, when its
  window has passed; REPLACE/INVESTIGATE stay until a person releases the node;
- boot noise, "only when alone" (Xid 45) and count-in-window escalation from the catalog.
See docs/kernel-log.md for the same rules in prose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from gpuvigil.core import codes
from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.catalog.xid import CatalogOverrides, Outcome, Rule, XidCatalog, load_catalog
from gpuvigil.node.checks.gpu.readings import (
    GpuInventory,
    GpuRef,
    GpuResets,
    KnownGpus,
    NvmlXidEvents,
    gpus_by_bus,
)
from gpuvigil.node.checks.kernel_log.readings import KernelLog, Release, XidEvent
from gpuvigil.node.checks.kernel_log.rules.xid_reconcile import MATCH_S, Seen, reconcile
from gpuvigil.node.pipeline.registry import Inputs, rule

EVIDENCE_LINES = 5  # the first and the latest lines are kept; the count says the rest

# What "what it calls for has happened" means for each action.
_CLEARED_BY_RESET = frozenset({Action.NONE, Action.RESTART_APP, Action.RESET_GPU})
_CLEARED_BY_REBOOT = _CLEARED_BY_RESET | {Action.REBOOT}
_WINDOWED = frozenset({Action.NONE, Action.RESTART_APP})


def evaluate(
    events: Iterable[XidEvent],
    *,
    catalog: XidCatalog,
    now: datetime,
    gpus: Mapping[str, GpuRef] | None = None,
    boot_id: str | None = None,
    driver_loaded_at: datetime | None = None,
    resets: GpuResets | None = None,
    released_at: datetime | None = None,
    check: str = "kernel_log",
    match_s: float = MATCH_S,
) -> list[Finding]:
    """Findings for `events` as of `now`, one per (code, component), worst first.

    `gpus` maps normalized PCI bus ids to GPUs; `resets` are this boot's successful GPU
    resets; `released_at` is when a person last released the node.
    """
    gpus = gpus or {}
    resets = resets or GpuResets()
    seen = reconcile([_placed(ev, gpus) for ev in events], match_s=match_s)
    groups: dict[tuple[str, int, str], list[Seen]] = {}
    for s in seen:
        groups.setdefault((s.event.kind, s.event.code, _component(s.event, gpus)), []).append(s)
    xid_times = _times_by_component(groups)

    out = []
    for (kind, code, component), members in groups.items():
        ref = _gpu(members[0].event, gpus)
        family = ref.family if ref else None
        rule = catalog.rule(kind, code, family)
        noise = catalog.boot_noise(family) if kind == "xid" else frozenset()
        live = [
            s
            for s in members
            if not _cleared(
                s.event,
                rule,
                boot_id=boot_id,
                driver_loaded_at=driver_loaded_at,
                reset=resets.latest(s.event.bus_id, gpus) if s.event.kind == "xid" else None,
                released_at=released_at,
            )
            and not _boot_noise(s.event, noise, driver_loaded_at, catalog.boot_noise_window_s)
            and not _accompanied(s.event, rule, xid_times.get(component, []))
        ]
        finding = _finding(live, rule, component, ref, now=now, check=check)
        if finding is not None:
            out.append(finding)
    out.sort(key=lambda f: (-f.status.rank, -f.action.rank, f.code, f.component))
    return out


def evaluate_log(
    log: KernelLog,
    *,
    catalog: XidCatalog,
    now: datetime,
    gpus: Mapping[str, GpuRef] | None = None,
    extra_events: Sequence[XidEvent] = (),
    resets: GpuResets | None = None,
    released_at: datetime | None = None,
    check: str = "kernel_log",
) -> list[Finding]:
    """`evaluate` over a KernelLog reading (plus e.g. NVML's events, which were collected
    during this boot, so they take the log's boot id when they carry none)."""
    extra = [
        e if e.boot_id or not log.boot_id else e.with_(boot_id=log.boot_id) for e in extra_events
    ]
    return evaluate(
        [*log.events, *extra],
        catalog=catalog,
        now=now,
        gpus=gpus,
        boot_id=log.boot_id,
        driver_loaded_at=log.driver_loaded_at,
        resets=resets,
        released_at=released_at,
        check=check,
    )


_CATALOGS: dict[str, XidCatalog] = {}


def catalog_of(config: Any) -> XidCatalog:
    """The Xid catalog with the node config's overrides, built once per distinct set of
    overrides (the agent's stream judges on every publish)."""
    overrides: CatalogOverrides | None = getattr(config, "kernel_log", None)
    if overrides is None:
        return load_catalog()
    key = overrides.model_dump_json(exclude_unset=True)
    found = _CATALOGS.get(key)
    if found is None:
        if len(_CATALOGS) > 16:
            _CATALOGS.clear()
        found = _CATALOGS[key] = load_catalog(overrides)
    return found


@rule(
    "xid",
    reads=KernelLog,
    uses=(GpuInventory, KnownGpus, NvmlXidEvents, GpuResets, Release),
    codes=(codes.ANY_XID, codes.ANY_SXID),
)
def xid_rule(log: KernelLog, on: Inputs) -> list[Finding]:
    """Xid/SXid events of this boot (and those kept from earlier ones), reconciled with
    NVML's, cleared by what each calls for: a GPU reset, a reboot, a person's release."""
    nvml = on.get(NvmlXidEvents)
    release = on.get(Release)
    return evaluate_log(
        log,
        catalog=catalog_of(on.config),
        now=on.now,
        gpus=gpus_by_bus(on.get(GpuInventory), on.get(KnownGpus)),
        extra_events=nvml.events if nvml is not None else (),
        resets=on.get(GpuResets),
        released_at=release.at if release is not None else None,
        check=on.check,
    )


def outlives_reboot(
    ev: XidEvent, *, catalog: XidCatalog, gpus: Mapping[str, GpuRef] | None = None
) -> bool:
    """True when no reboot clears what `ev` calls for (REPLACE, INVESTIGATE, also through
    escalation): only a person's release does. The agent keeps such events across reboots
    (`node.xid_state`), because the kernel log it reads starts empty at every boot."""
    ref = _gpu(ev, gpus or {})
    rule = catalog.rule(ev.kind, ev.code, ref.family if ref else None)
    action = Action.worst([rule.outcome_for(ev.message).action, _escalated_action(rule)])
    return action not in _CLEARED_BY_REBOOT


# --- clearing and suppression -------------------------------------------------------------


def _cleared(
    ev: XidEvent,
    rule: Rule,
    *,
    boot_id: str | None,
    driver_loaded_at: datetime | None,
    reset: datetime | None,
    released_at: datetime | None,
) -> bool:
    action = Action.worst([rule.outcome_for(ev.message).action, _escalated_action(rule)])
    t = ev.time
    if released_at is not None and t is not None and t <= released_at:
        return True
    rebooted = ev.boot_id is not None and boot_id is not None and ev.boot_id != boot_id
    if rebooted and action in _CLEARED_BY_REBOOT:
        return True
    if action in _CLEARED_BY_RESET and t is not None:
        if driver_loaded_at is not None and driver_loaded_at > t:
            return True
        if reset is not None and reset > t:
            return True
    return False


def _escalated_action(rule: Rule) -> Action:
    return rule.escalate.action if rule.escalate is not None else Action.NONE


def _boot_noise(
    ev: XidEvent, noise: frozenset[int], loaded: datetime | None, window_s: float
) -> bool:
    if ev.code not in noise or loaded is None or ev.time is None:
        return False
    return timedelta(0) <= ev.time - loaded <= timedelta(seconds=window_s)


def _times_by_component(
    groups: Mapping[tuple[str, int, str], list[Seen]],
) -> dict[str, list[tuple[int, datetime]]]:
    out: dict[str, list[tuple[int, datetime]]] = {}
    for (kind, code, component), members in groups.items():
        if kind != "xid":
            continue
        out.setdefault(component, []).extend(
            (code, s.event.time) for s in members if s.event.time is not None
        )
    return out


def _accompanied(ev: XidEvent, rule: Rule, others: list[tuple[int, datetime]]) -> bool:
    """For "only when alone" codes (Xid 45): another Xid on the same GPU close by."""
    if rule.only_alone_s is None or ev.time is None:
        return False
    span = timedelta(seconds=rule.only_alone_s)
    return any(code != ev.code and abs(t - ev.time) <= span for code, t in others)


# --- the finding --------------------------------------------------------------------------


def _finding(
    live: list[Seen],
    rule: Rule,
    component: str,
    ref: GpuRef | None,
    *,
    now: datetime,
    check: str,
) -> Finding | None:
    if not live:
        return None
    window = timedelta(seconds=rule.window_s)
    active, outcomes = [], []
    for s in live:
        o = rule.outcome_for(s.event.message)
        t = s.event.time
        if o.action in _WINDOWED and t is not None and now - t > window:
            continue  # done what it called for: its window has passed
        active.append(s)
        outcomes.append(o)
    escalated = _escalation(live, rule, now)
    if escalated is not None:
        outcomes.append(escalated)
    if not active and escalated is None:
        return None
    shown = active or live
    outcome = _worst(outcomes)
    first, last = shown[0].event, shown[-1].event
    times = [s.event.time for s in shown if s.event.time is not None]
    sources = sorted({src for s in shown for src in s.sources})
    where = f"GPU {ref.index}" if ref else (first.device or "PCI")
    label = "SXid" if rule.kind == "sxid" else "Xid"
    what = rule.description or rule.name
    if not rule.known:
        what = f"not in the catalog ({first.message or 'no text'})"
    message = (
        f"{label} {rule.code} on {where} ({first.pci_bus_id}): {what}; "
        f"seen {len(shown)}x, calls for {outcome.action.value}"
    )
    if escalated is not None and rule.escalate is not None:
        message += f" (escalated: >= {rule.escalate.count} in {rule.escalate.window_s:g} s)"
    evidence: dict[str, Any] = {
        "lines": _lines(shown),
        "count": len(shown),
        "first_seen": first.timestamp,
        "last_seen": last.timestamp,
        "first_seen_at": min(times).isoformat() if times else None,
        "last_seen_at": max(times).isoformat() if times else None,
        "pci_bus_id": first.pci_bus_id,
        "sources": sources,
        "mnemonic": rule.name,
        "in_catalog": rule.known,
        "clears_on": _clears_on(outcome.action),
    }
    if ref is not None:
        evidence |= {"gpu": ref.index, "family": ref.family, "uuid": ref.uuid}
    if outcome.action in _WINDOWED and times:
        evidence["expires_at"] = (max(times) + window).isoformat()
    if escalated is not None:
        evidence["escalated"] = True
    return Finding(
        check=check,
        status=outcome.status,
        code=f"{'S' if rule.kind == 'sxid' else ''}XID_{rule.code}",
        component=component,
        message=message,
        action=outcome.action,
        fatal=outcome.fatal,
        evidence=evidence,
        observed_at=max(times) if times else now,
    )


def _escalation(live: list[Seen], rule: Rule, now: datetime) -> Outcome | None:
    esc = rule.escalate
    if esc is None:
        return None
    since = now - timedelta(seconds=esc.window_s)
    times = sorted(s.event.time for s in live if s.event.time is not None and s.event.time >= since)
    undated = sum(1 for s in live if s.event.time is None)
    if len(times) + undated < esc.count:
        return None
    return Outcome(status=esc.status, action=esc.action, fatal=esc.fatal)


def _worst(outcomes: list[Outcome]) -> Outcome:
    return Outcome(
        status=Status.worst(o.status for o in outcomes),
        action=Action.worst(o.action for o in outcomes),
        fatal=any(o.fatal for o in outcomes),
    )


def _lines(shown: list[Seen]) -> list[str]:
    lines = [s.event.line or s.event.message for s in shown]
    if len(lines) <= EVIDENCE_LINES:
        return lines
    return [*lines[: EVIDENCE_LINES - 1], lines[-1]]


def _clears_on(action: Action) -> str:
    if action in _WINDOWED:
        return "window"
    if action is Action.RESET_GPU:
        return "gpu_reset"
    if action is Action.REBOOT:
        return "reboot"
    return "release"


def _gpu(ev: XidEvent, gpus: Mapping[str, GpuRef]) -> GpuRef | None:
    return gpus.get(ev.bus_id or "") if ev.kind == "xid" else None


def _placed(ev: XidEvent, gpus: Mapping[str, GpuRef]) -> XidEvent:
    """An NVML event that named its GPU's index but no bus (a GPU fallen off the bus
    answers nothing) gets that GPU's bus: it then reconciles with the kernel's line for
    the same Xid, and a reset of that GPU clears it, as for any other event."""
    if ev.bus_id or ev.gpu_index is None or ev.kind != "xid":
        return ev
    ref = next((g for g in gpus.values() if g.index == ev.gpu_index), None)
    return ev.with_(bus_id=ref.bus_id, pci_bus_id=ref.bus_id) if ref else ev


def _component(ev: XidEvent, gpus: Mapping[str, GpuRef]) -> str:
    """gpu:<index>, nvswitch:<n>, pci:<bus>, or `node` when the event names none of them:
    never an empty `pci:`, which attribution and the node's summary cannot place."""
    bus = ev.bus_id or ev.pci_bus_id
    if ev.kind == "sxid":
        if ev.device and ev.device.startswith("nvidia-nvswitch"):
            return f"nvswitch:{ev.device.removeprefix('nvidia-nvswitch')}"
        return f"pci:{bus}" if bus else "node"
    ref = _gpu(ev, gpus)
    if ref is not None:
        return f"gpu:{ref.index}"
    if ev.gpu_index is not None:  # a GPU the map does not hold: still the GPU NVML named
        return f"gpu:{ev.gpu_index}"
    return f"pci:{bus}" if bus else "node"
