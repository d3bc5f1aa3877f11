"""The one registry of node checks, and the wrapper that runs any check fail-closed.

A check is a small function under `@check(...)`, which says how it runs: its group
(schedule), interval, timeout and what it needs. A probe's check returns a `Readout`: the
typed readings it took plus findings about the probe itself (a tool that hung, a source
that fell back); `run_check` puts the readings into the node's `Facts` and has
`node.pipeline` judge them, so no probe calls a rule. A site check may return findings
directly. `run_check` turns a missing need into DEPENDENCY_MISSING, an exception into
CHECK_ERROR and an overrun into CHECK_TIMEOUT.
Called by `gpuvigil check`, the agent, preflight and the simulator.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuvigil.core.findings import Action, CheckRun, Finding, Status, utcnow
from gpuvigil.io.exec import resolve
from gpuvigil.node.capture import error_text
from gpuvigil.node.checks.gpu.readings import GpuSource
from gpuvigil.node.pipeline.facts import Facts
from gpuvigil.node.pipeline.judge import judge


@dataclass(frozen=True)
class Needs:
    """What a check cannot run without. Absent needs are findings, never skips."""

    binaries: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()  # relative to the context's root (e.g. "sys/class/infiniband")
    modules: tuple[str, ...] = ()  # importable Python modules (e.g. "pynvml")


@dataclass
class CheckContext:
    """Where a check reads the world; every source can be pointed elsewhere for tests."""

    config: Any  # gpuvigil.node.config.NodeConfig
    root: Path = Path("/")  # sysfs and /dev are read below this root
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    # The node's typed facts: every probe's latest reading (and the one before, for
    # rates), the remediator's GPU resets, a person's release. Shared by every check,
    # the kernel-log stream and the sinks of one agent.
    facts: Facts = field(default_factory=Facts)

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")


@dataclass(frozen=True)
class Readout:
    """What a probe's check took: typed readings for the rules, and findings about the
    probe itself (its tool hung, its source fell back) that no rule could know."""

    readings: tuple[object, ...] = ()
    findings: tuple[Finding, ...] = ()


CheckFn = Callable[[CheckContext], "list[Finding] | Readout"]


@dataclass(frozen=True)
class CheckSpec:
    name: str
    fn: CheckFn
    group: str  # "fast" | "slow" | "diag" | "stream" | "active"
    interval_s: float
    timeout_s: float
    needs: Needs
    description: str
    required: bool = (
        True  # False: an absent need is reported as disabled, not failed (opt-in tools)
    )


REGISTRY: dict[str, CheckSpec] = {}


def check(
    name: str,
    *,
    group: str,
    interval_s: float,
    timeout_s: float,
    needs: Needs = Needs(),
    description: str = "",
) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if name in REGISTRY:
            raise ValueError(f"check {name!r} registered twice")
        REGISTRY[name] = CheckSpec(
            name=name,
            fn=fn,
            group=group,
            interval_s=interval_s,
            timeout_s=timeout_s,
            needs=needs,
            description=description or _first_line(fn.__doc__),
        )
        return fn

    return register


def _first_line(doc: str | None) -> str:
    lines = (doc or "").strip().splitlines()
    return lines[0] if lines else ""


def missing_needs(spec: CheckSpec, ctx: CheckContext) -> list[Finding]:
    out = []
    for b in spec.needs.binaries:
        if resolve(b, path=ctx.env.get("PATH")) is None:
            out.append(
                _failed(spec, "DEPENDENCY_MISSING", f"binary {b!r} not found on PATH", need=b)
            )
    for p in spec.needs.paths:
        if not ctx.path(p).exists():
            out.append(_failed(spec, "DEPENDENCY_MISSING", f"{ctx.path(p)} does not exist", need=p))
    for m in spec.needs.modules:
        try:
            __import__(m)
        except ImportError as e:
            out.append(_failed(spec, "DEPENDENCY_MISSING", f"Python module {m!r}: {e}", need=m))
    return out


def run_check(spec: CheckSpec, ctx: CheckContext) -> tuple[list[Finding], CheckRun]:
    """Run one check under its deadline. Never raises; never returns an empty verdict for
    a check that could not run."""
    started_at, t0 = utcnow(), time.monotonic()
    findings = missing_needs(spec, ctx)
    if not findings:
        findings = _call_with_deadline(spec, ctx)
    run = CheckRun(
        check=spec.name,
        status=Status.worst(f.status for f in findings),
        started_at=started_at,
        duration_s=time.monotonic() - t0,
        # A check that reports only that it is switched off (an optional tool absent).
        disabled=bool(findings) and all(f.code == "CHECK_DISABLED" for f in findings),
    )
    return findings, run


def call(spec: CheckSpec, ctx: CheckContext) -> list[Finding]:
    """The check's own code, here and now, its outcome as findings; never raises. No
    deadline: `run_check` puts a thread around it, the agent's scheduler its own threads."""
    try:
        value = spec.fn(ctx)
    except Exception as e:  # noqa: BLE001 - any failure of a check is a finding
        return [
            _failed(
                spec,
                "CHECK_ERROR",
                f"check raised {type(e).__name__}: {e}",
                traceback=traceback.format_exc(limit=5),
            )
        ]
    if isinstance(value, Readout):
        return _judged(spec, ctx, value)
    if not isinstance(value, list):
        return [
            _failed(spec, "CHECK_ERROR", f"check returned {type(value).__name__}, not findings")
        ]
    return value


def timed_out(spec: CheckSpec) -> Finding:
    return _failed(spec, "CHECK_TIMEOUT", f"check did not finish within {spec.timeout_s:g} s")


def _call_with_deadline(spec: CheckSpec, ctx: CheckContext) -> list[Finding]:
    box: dict[str, list[Finding]] = {}

    def target() -> None:
        box["value"] = call(spec, ctx)

    # A daemon thread can be abandoned: probes that block in C (NVML) run in a worker
    # process of their own, so an abandoned thread here only ever waits on a subprocess
    # that the runner's own timeout will kill.
    t = threading.Thread(target=target, name=f"check:{spec.name}", daemon=True)
    t.start()
    t.join(spec.timeout_s)
    if t.is_alive() or "value" not in box:
        return [timed_out(spec)]
    return box["value"]


def _judged(spec: CheckSpec, ctx: CheckContext, readout: Readout) -> list[Finding]:
    """The rules' findings over the probe's readings, then the probe's own."""
    for reading in readout.readings:
        ctx.facts.put(reading)
    judged = judge(
        readout.readings, config=ctx.config, now=utcnow(), check=spec.name, facts=ctx.facts
    )
    return [*judged, *_unexplained_text(spec, readout, judged), *readout.findings]


def _unexplained_text(spec: CheckSpec, readout: Readout, judged: list[Finding]) -> list[Finding]:
    """Error phrases in a fallback tool's output that no rule explained: ERROR_TEXT, the
    same reader and verdict `analyze` gives that text (`capture.error_text`)."""
    out: list[Finding] = []
    for reading in readout.readings:
        if isinstance(reading, GpuSource) and reading.said:
            out += error_text.unexplained(
                reading.said,
                kind=GpuSource.SAID_KIND,
                findings=judged,
                check=spec.name,
                input_name="nvidia-smi",
            )
    return out


def _failed(spec: CheckSpec, code: str, message: str, **evidence: Any) -> Finding:
    return Finding(
        check=spec.name,
        status=Status.FAILED,
        code=code,
        message=message,
        action=Action.NONE,
        evidence=evidence,
    )
