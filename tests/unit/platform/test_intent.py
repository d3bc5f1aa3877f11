"""The controller publishes what it decides (`platform.intent`): a dry run walks the live
controller's path, and `gpuvigil nodes --json` shows it, node by node."""

from __future__ import annotations

from typing import Any

from helpers import FATAL, INVESTIGATE, NONFATAL

from gpuvigil.commands.nodes import node_row
from gpuvigil.platform import intent
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.safety import SafetyConfig

# one disruption at a time, so the second fatal node is held by the budget
CFG = ControllerConfig(
    policy=PolicyConfig(fatal_grace_s=120, suspect_grace_s=600, cooldown_s=0),
    safety=SafetyConfig(max_disrupted=1, max_disrupted_percent=100),
)


def cluster() -> MemoryCluster:
    c = MemoryCluster()
    for i in range(20):  # few enough faults that the breaker stays closed
        c.add_node(f"n{i}", pods=2, protected_pods=1)  # a PDB pod keeps DRAINING draining
    return c


def rows(c: MemoryCluster) -> dict[str, dict[str, Any]]:
    return {v.name: node_row(v) for v in c.list_nodes()}


def shown(row: dict[str, Any]) -> tuple[Any, ...]:
    d = row["decision"] or {}
    return (row["state"], row["reason"], [h["to"] for h in row["history"]],
            d.get("next", ""), d.get("held_by", ""))  # fmt: skip


def test_dry_run_shows_what_the_live_controller_did() -> None:
    live, dry = cluster(), cluster()
    ctl_live = Controller(live, config=CFG, clock=live.clock.now)
    ctl_dry = Controller(dry, config=CFG.model_copy(update={"dry_run": True}), clock=dry.clock.now)
    faults = {"n1": [FATAL], "n2": [FATAL]}
    for c in (live, dry):
        for name, found in faults.items():
            c.set_findings(name, found)
    seen_held = seen_draining = False
    for _ in range(4):  # SUSPECT at once, DRAINING after the fatal grace, n2 held
        ctl_live.reconcile()
        ctl_dry.reconcile()
        lrows, drows = rows(live), rows(dry)
        for name in lrows:
            assert drows[name]["dry_run"] is (name in faults), name
            assert shown(drows[name]) == shown(lrows[name]), name
            assert drows[name]["stored_state"] == "HEALTHY"  # a dry run never acts
        seen_held |= lrows["n2"]["held_by"] == "budget"
        seen_draining |= lrows["n1"]["state"] == "DRAINING"
        for c in (live, dry):
            c.advance(70)
    assert seen_held and seen_draining
    assert "disruption budget" in rows(dry)["n2"]["held"]
    assert not any(dry.calls[op] for op in ("store", "block", "drain", "request"))
    assert rows(dry)["n0"]["decision"] is None  # healthy and nothing to say: no write


def test_next_and_held_by_in_words() -> None:
    c = cluster()
    ctl = Controller(c, config=CFG, clock=c.clock.now)
    c.set_findings("n1", [FATAL])
    ctl.reconcile()
    row = rows(c)["n1"]
    assert row["state"] == "SUSPECT" and row["next"].startswith("drain at ")
    c.set_findings("n4", [INVESTIGATE])
    ctl.reconcile()
    assert rows(c)["n4"]["next"].startswith("quarantine for a person at ")  # blocked first
    c.advance(CFG.policy.fatal_grace_s + 1)
    ctl.reconcile()
    assert rows(c)["n4"]["next"] == "nothing: a person releases it (gpuvigil release n4)"


def test_an_unchanged_decision_is_published_once() -> None:
    c = cluster()
    ctl = Controller(c, config=CFG, clock=c.clock.now)
    c.set_findings("n1", [NONFATAL])
    ctl.reconcile()
    first = c.calls["publish"]
    for _ in range(3):
        c.advance(10)
        ctl.reconcile()
    assert first == 1 and c.calls["publish"] == 1


def test_held_by_names_the_mechanism() -> None:
    assert intent.held_by("disruption budget of pool a in use (1/1)") == "budget"
    assert intent.held_by("circuit breaker holds XID_79 (suspected change: x)") == "breaker"
    assert intent.held_by("cooldown (12 s left)") == "cooldown"
    assert intent.held_by("rate limit (5 per 600 s)") == "rate"
    assert intent.held_by("") == ""


def test_explain_tells_the_story_in_time_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpuvigil.commands.explain import story
    from gpuvigil.core.events import EventWriter
    from gpuvigil.observe.events import read_events

    c = cluster()
    log = tmp_path / "ev.jsonl"
    cfg = CFG.model_copy(update={"dry_run": True})
    with EventWriter(log) as w:
        ctl = Controller(c, config=cfg, clock=c.clock.now, events=w)
        c.set_findings("n1", [FATAL])
        c.set_findings("n2", [FATAL])
        for _ in range(4):
            ctl.reconcile()
            c.advance(70)
    lines = story(c.get_node("n2"), read_events([log]), node="n2")
    what = [w for _, _, w in lines]
    assert [t for t, _, _ in lines] == sorted(t for t, _, _ in lines)
    first = next(i for i, w in enumerate(what) if "would move HEALTHY -> SUSPECT" in w)
    held = next(i for i, w in enumerate(what) if w.startswith("held: disruption budget"))
    decided = [w for w in what if w.startswith("decided ")]
    assert first < held and len(decided) == 1
    assert "decided SUSPECT" in decided[0] and "held (budget)" in decided[0]
    assert any(w == "reports FAILED XID_79 gpu:3" for w in what)
    assert not any("n1" in w for w in what)  # another node's story is not this one's
