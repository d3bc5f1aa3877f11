"""From readings to findings: every registered rule whose reading is present.

The one place readings meet rules, for every path that judges a node: the checks
(`node.checks.run_check`: `gpuvigil check`, the agent's scheduled checks, preflight,
npd-plugin, slurm-healthcheck), the agent's kernel-log stream (`node.kernel_watch`),
`gpuvigil analyze`, the simulator (`sim.hardware`) and `gpuvigil replay`. Each caller
hands over its readings; the facts a rule declared in `uses` come from the node's
`Facts` (or are absent). Rules register on import: `load_rules` imports every module of every
domain folder under `node/checks` (`node.checks.domain.load_domains`), so no list names them.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.checks.domain import load_domains
from gpuvigil.node.pipeline.facts import Facts
from gpuvigil.node.pipeline.registry import RULES, Inputs, RuleSpec

_loaded = False


def load_rules() -> dict[str, RuleSpec]:
    global _loaded
    if not _loaded:  # judge() runs on every check and publish: import once
        load_domains()
        _loaded = True
    return RULES


def rules_for(reading_type: type) -> list[RuleSpec]:
    return [s for s in load_rules().values() if s.reads is reading_type]


def judge(
    readings: Iterable[object],
    *,
    config: Any,
    now: datetime,
    check: str,
    facts: Facts | None = None,
) -> list[Finding]:
    """Findings of every rule that reads one of `readings`. Facts named in a rule's `uses`
    come from `readings` first, then from `facts`; the rule's previous reading (for rates)
    from `facts`. Never raises: a rule that raises is a CHECK_ERROR finding of `check`."""
    given = {type(r): r for r in readings}
    out: list[Finding] = []
    for spec in load_rules().values():
        reading = given.get(spec.reads)
        if reading is None:
            continue
        latest = {
            cls: given[cls] if cls in given else (facts.get(cls) if facts else None)
            for cls in spec.uses
        }
        previous = {spec.reads: facts.previous(spec.reads) if facts else None}
        inputs = Inputs(spec, now=now, config=config, check=check, latest=latest, previous=previous)
        try:
            out += spec.fn(reading, inputs)
        except Exception as e:  # noqa: BLE001 - a rule bug must fail closed, not pass
            out.append(
                Finding(
                    check=check,
                    status=Status.FAILED,
                    code="CHECK_ERROR",
                    message=f"rule {spec.name} raised {type(e).__name__}: {e}",
                    action=Action.NONE,
                    evidence={"rule": spec.name, "traceback": traceback.format_exc(limit=5)},
                    observed_at=now,
                )
            )
    return out
