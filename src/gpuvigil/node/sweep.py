"""One sweep: every registered check once -> a NodeReport (`gpuvigil check`, preflight).

`load_checks()` imports every module that registers checks: this list is the one place
that names them.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable

from gpuvigil.core.findings import CheckRun, Finding, NodeReport, Status
from gpuvigil.node.checks import REGISTRY, CheckContext, run_check

CHECK_MODULES = (
    "gpuvigil.node.probes.nvml",
    "gpuvigil.node.probes.nvidia_smi",
    "gpuvigil.node.probes.dcgm",
    "gpuvigil.node.probes.kernel_log",
    "gpuvigil.node.probes.fabric",
    "gpuvigil.node.probes.pcie",
)


def load_checks() -> None:
    for name in CHECK_MODULES:
        importlib.import_module(name)


def run_sweep(
    ctx: CheckContext,
    *,
    node: str,
    names: Iterable[str] | None = None,
    groups: tuple[str, ...] = ("fast",),
) -> NodeReport:
    """Run checks once, all at the same time, each under its own deadline -> NodeReport.

    `names` picks checks by name (unknown names are DEPENDENCY_MISSING findings, never
    silently skipped); otherwise every check of `groups`. Used by `gpuvigil npd-plugin`
    and `gpuvigil slurm-healthcheck` (added by the agent work).
    """
    load_checks()
    wanted = list(names) if names is not None else [
        n for n, s in REGISTRY.items() if s.group in groups]
    results: dict[str, tuple[list[Finding], CheckRun]] = {}
    missing = [n for n in wanted if n not in REGISTRY]

    def one(name: str) -> None:
        results[name] = run_check(REGISTRY[name], ctx)

    threads = [threading.Thread(target=one, args=(n,), daemon=True)
               for n in wanted if n in REGISTRY]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # run_check returns by each check's deadline
    findings = [f for n in wanted if n in results for f in results[n][0]]
    findings += [Finding(check=n, status=Status.FAILED, code="DEPENDENCY_MISSING",
                         message=f"no check named {n!r}; known: {', '.join(sorted(REGISTRY))}")
                 for n in missing]
    runs = [results[n][1] for n in wanted if n in results]
    return NodeReport(node=node, findings=tuple(findings), checks=tuple(runs))
