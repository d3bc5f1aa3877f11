"""Run the active checks in a worker subprocess under deadlines, within a time budget.

The parent side: builds the worker's spec, runs it through the fail-closed runner
(`io.exec.run`: own process group, killed at the deadline, bounded output),
reads the JSON lines it printed, and turns them into measurements and findings. A check
in progress when the worker hung or died is CHECK_TIMEOUT or CHECK_ERROR; the worker is
restarted for the checks still to run while the budget lasts; checks the budget did not
reach are CHECK_TIMEOUT (never silently skipped). No torch here.
Called by `gpuvigil preflight` and `bench/active.py`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpuvigil
from gpuvigil.core.findings import Action, Finding, Status, utcnow
from gpuvigil.io import exec as execp
from gpuvigil.node.active.config import ActiveConfig
from gpuvigil.node.active.results import ACTIONS, Measurement, to_finding

MIN_START_S = 5.0  # do not start a worker with less budget than this


@dataclass
class ActiveOutcome:
    measurements: list[Measurement] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    models: list[str | None] = field(default_factory=list)
    components: list[str] = field(default_factory=list)  # gpu:N (host index) per device
    pci: list[str | None] = field(default_factory=list)
    durations_s: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0
    workers: int = 0


def _worker_env(env: dict[str, str] | None) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    src = str(Path(gpuvigil.__file__).resolve().parents[1])
    out["PYTHONPATH"] = os.pathsep.join(p for p in (src, out.get("PYTHONPATH", "")) if p)
    out.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # torch's order = the host's order
    return out


def _failed(
    check: str, code: str, message: str, component: str = "node", **evidence: Any
) -> Finding:
    return Finding(
        check=f"active.{check}",
        status=Status.FAILED,
        code=code,
        component=component,
        message=message,
        action=Action.NONE,
        evidence=evidence,
    )


def run_active(
    cfg: ActiveConfig,
    *,
    device: str = "cuda",
    budget_s: float = 120.0,
    wrapper: str | None = None,
    internode_busbw_gbs: float | None = None,
    env: dict[str, str] | None = None,
) -> ActiveOutcome:
    """Every check in `cfg.checks`, each one a measurement list or a fail-closed finding."""
    t0 = time.monotonic()
    outcome = ActiveOutcome()
    remaining = list(dict.fromkeys(cfg.checks))
    while remaining:
        left = budget_s - (time.monotonic() - t0)
        if left < MIN_START_S:
            break
        spec = {
            "device": device,
            "checks": remaining,
            "wrapper": wrapper,
            "config": cfg.model_dump(mode="json"),
            "internode_busbw_gbs": internode_busbw_gbs,
        }
        result = execp.run(
            [sys.executable, "-m", "gpuvigil.node.active.worker"],
            timeout_s=left,
            env=_worker_env(env),
            stdin=json.dumps(spec).encode(),
            max_output=16 * 1024 * 1024,
        )
        outcome.workers += 1
        done, fatal = _absorb(result, outcome)
        remaining = [c for c in remaining if c not in done]
        if fatal:
            for c in remaining:
                outcome.findings.append(_failed(c, fatal[0], fatal[1]))
            remaining = []
        elif not done:
            # Nothing started: the worker itself is broken (crash at import, garbage).
            f = execp.failure_finding(result, check="active", what="active-check worker")
            outcome.findings.append(
                f
                or execp.unparsable_finding(
                    result, check="active", problem="the worker printed no events"
                )
            )
            # A worker still importing at the deadline (a loaded machine, a slow
            # filesystem) ran out of time: that is a timeout, not a broken worker.
            code, why = (
                ("CHECK_TIMEOUT", "the active-check worker did not start before the deadline")
                if result.error == "timeout"
                else ("CHECK_ERROR", "the active-check worker did not start")
            )
            for c in remaining:
                outcome.findings.append(_failed(c, code, why, exit_status=result.returncode))
            remaining = []
    for c in remaining:
        outcome.findings.append(
            _failed(
                c,
                "CHECK_TIMEOUT",
                f"not run: the {budget_s:g} s time budget ran out first",
                budget_s=budget_s,
            )
        )
    now = utcnow()
    for m in outcome.measurements:
        f = to_finding(m, observed_at=now)
        if f is not None:
            outcome.findings.append(f)
    outcome.duration_s = time.monotonic() - t0
    return outcome


def _absorb(result: execp.ExecResult, outcome: ActiveOutcome) -> tuple[set[str], tuple | None]:
    """Read the worker's events into `outcome`; returns (checks settled, fatal or None)."""
    done: set[str] = set()
    started: str | None = None
    where = "node"  # the device the running check last touched (progress events)
    for line in result.text.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue  # a stray print from a library: not ours to judge
        if not isinstance(ev, dict):
            continue
        try:
            started, where, fatal = _event(ev, outcome, done, started, where)
        except (TypeError, ValueError, KeyError) as e:
            # A garbled event from our own worker: the check it names failed.
            check = str(ev.get("check") or started or "worker")
            outcome.findings.append(
                _failed(check, "CHECK_ERROR", f"unreadable worker event: {e}", event=line[:300])
            )
            done.add(check)
            continue
        if fatal is not None:
            return done, fatal
    if started is not None:
        # It was running when the worker ended without a word: hung past the parent's
        # deadline (timeout) or crashed (a segfault in a driver, an OOM kill).
        if result.error == "timeout":
            outcome.findings.append(
                _failed(
                    started,
                    "CHECK_TIMEOUT",
                    f"hung on {where}: killed at the preflight deadline",
                    where,
                    **result.evidence(),
                )
            )
        else:
            outcome.findings.append(
                _failed(
                    started,
                    "CHECK_ERROR",
                    f"the worker died while it ran on {where} (exit status {result.returncode}): "
                    f"{result.stderr_tail(300)}",
                    where,
                    **result.evidence(),
                )
            )
        done.add(started)
    return done, None


def _event(
    ev: dict[str, Any],
    outcome: ActiveOutcome,
    done: set[str],
    started: str | None,
    where: str,
) -> tuple[str | None, str, tuple[str, str] | None]:
    """Apply one worker event; returns (check running, its device, fatal or None)."""
    kind, check = ev.get("event"), str(ev.get("check", ""))
    if kind == "devices":
        outcome.devices = [str(n) for n in ev.get("names") or []]
        outcome.models = [m if isinstance(m, str) else None for m in ev.get("models") or []]
        outcome.components = [str(c) for c in ev.get("components") or []]
        outcome.pci = [p if isinstance(p, str) else None for p in ev.get("pci") or []]
    elif kind == "start":
        started, where = check, "node"
    elif kind == "progress":
        where = str(ev.get("component", "node"))
    elif kind == "result":
        parsed = [Measurement.from_json(m) for m in ev["measurements"]]  # all or nothing
        outcome.measurements += parsed
        seconds = ev.get("duration_s")
        outcome.durations_s[check] = float(seconds) if isinstance(seconds, int | float) else 0.0
        done.add(check)
        started = None
    elif kind == "error":
        code = str(ev.get("code", "CHECK_ERROR"))
        outcome.findings.append(
            Finding(
                check=f"active.{check}",
                status=Status.FAILED,
                code=code,
                component=str(ev.get("component", where)),
                message=str(ev.get("message", ""))[:500],
                action=ACTIONS.get(code, (Action.NONE, False))[0],
                fatal=ACTIONS.get(code, (Action.NONE, False))[1],
                evidence={"traceback": ev.get("traceback", "")},
            )
        )
        done.add(check)
        started = None
    elif kind == "timeout":
        outcome.findings.append(
            _failed(
                check,
                "CHECK_TIMEOUT",
                f"did not finish within {ev.get('timeout_s')} s (killed; last on {where})",
                where,
                timeout_s=ev.get("timeout_s"),
            )
        )
        done.add(check)
        started = None
    elif kind == "fatal":
        return started, where, (str(ev.get("code", "CHECK_ERROR")), str(ev.get("message", "")))
    return started, where, None
