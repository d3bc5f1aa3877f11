"""One sweep: every registered check once -> a NodeReport (`gpuvigil check`, preflight,
the bench; the agent schedules checks by group instead).

`load_checks()` imports every module of every domain folder under `node/checks`
(`node.checks.domain.load_domains`); those that define checks register them on import (no
list names them). `run_sweep` runs the checks whose readings other rules
use first (`gpu` puts the GPU inventory and NVML's Xid events into the node's facts, which
the `xid` rule reads beside the kernel log), then the rest concurrently, each under its own
deadline.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from gpuvigil.core import naming
from gpuvigil.core.findings import CheckRun, Finding, NodeReport, Status, utcnow
from gpuvigil.node.checks import REGISTRY, CheckContext, CheckSpec, run_check
from gpuvigil.node.checks.domain import load_domains

# Checks whose readings other checks' rules use (through `CheckContext.facts`): run first.
FIRST = ("gpu",)


def load_checks() -> None:
    load_domains()


def select(
    *, groups: Iterable[str] | None = None, names: Iterable[str] | None = None
) -> list[CheckSpec]:
    """Registered checks, optionally only some groups or names, in a stable order."""
    load_checks()
    wanted_groups = set(groups) if groups is not None else None
    wanted_names = set(names) if names is not None else None
    specs = [
        s
        for s in REGISTRY.values()
        if (wanted_groups is None or s.group in wanted_groups)
        and (wanted_names is None or s.name in wanted_names)
    ]
    return sorted(specs, key=lambda s: (s.name not in FIRST, s.name))


def _skipped(spec: CheckSpec) -> tuple[list[Finding], CheckRun]:
    finding = Finding(
        check=spec.name,
        status=Status.OK,
        code="CHECK_DISABLED",
        message="skipped for this run (--skip): not checked, not passed",
    )
    run = CheckRun(
        check=spec.name, status=Status.OK, started_at=utcnow(), duration_s=0.0, disabled=True
    )
    return [finding], run


def run_sweep(
    ctx: CheckContext,
    *,
    node: str | None = None,
    specs: list[CheckSpec] | None = None,
    skipped: Iterable[str] = (),
    max_workers: int = 8,
) -> NodeReport:
    """Run `specs` (default: every registered check) once and report. Never raises: a
    check that cannot run is a FAILED finding of its own (see `run_check`). A check named
    in `skipped` is not run and is reported as disabled (CHECK_DISABLED), not dropped."""
    specs = select() if specs is None else specs
    skip = set(skipped)
    first = [s for s in specs if s.name in FIRST and s.name not in skip]
    rest = [s for s in specs if s.name not in FIRST and s.name not in skip]
    results: list[tuple[list[Finding], CheckRun]] = [_skipped(s) for s in specs if s.name in skip]
    results += [run_check(s, ctx) for s in first]
    if rest:
        with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sweep") as pool:
            results += list(pool.map(lambda s: run_check(s, ctx), rest))
    findings = tuple(f for fs, _ in results for f in fs)
    return NodeReport(
        node=naming.node_name(node),
        findings=findings,
        checks=tuple(run for _, run in results),
    )
