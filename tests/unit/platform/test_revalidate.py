"""Preflight runs again after a repair or a release (`Cluster.revalidate`), once per
validation, even across controller restarts; the memory cluster runs preflight only on a
new node or when asked, as the preflight DaemonSet does."""

from __future__ import annotations

from datetime import timedelta

from helpers import FATAL

from gpuvigil.platform.clusters.base import Unavailable
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import release
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.state import State

CFG = ControllerConfig(safety=SafetyConfig(max_disrupted=5, max_disrupted_percent=100))


def revalidations(c: MemoryCluster, name: str) -> int:
    return sum(1 for op, _ in c.nodes[name].actions if op == "revalidate")


def run_until(c: MemoryCluster, ctl: Controller, name: str, state: State, passes: int = 40) -> None:
    for _ in range(passes):
        ctl.reconcile()
        rec = c.get_node(name).record
        if rec is not None and rec.state is state:
            return
        c.advance(10)
    raise AssertionError(f"{name} never reached {state}: {c.get_node(name).record}")


def test_reset_then_validating_triggers_preflight_once_and_returns_to_service() -> None:
    c = MemoryCluster()
    c.add_node("n0")
    c.set_findings("n0", [FATAL])  # cleared by a GPU reset
    ctl = Controller(c, config=CFG, clock=c.clock.now)
    run_until(c, ctl, "n0", State.VALIDATING)
    rec = c.get_node("n0").record
    assert rec is not None and rec.step is not None and rec.step.value == "RESET_GPU"
    assert rec.preflight_for == rec.since  # remembered on the node in the same pass
    assert revalidations(c, "n0") == 1
    # A restarted controller (nothing in memory) does not ask again for this validation.
    ctl = Controller(c, config=CFG, clock=c.clock.now)
    run_until(c, ctl, "n0", State.HEALTHY)
    assert revalidations(c, "n0") == 1
    assert c.calls["revalidate"] == 1
    pf = c.get_node("n0").preflight
    assert pf is not None and pf.passed and pf.at >= rec.since


def test_without_the_trigger_the_node_would_wait_for_ever() -> None:
    """The gap this closes: the preflight pod ran when the node joined, so nothing newer
    than the validation's start comes unless preflight is run again."""
    c = MemoryCluster()
    c.add_node("n0")
    rec = release(None, now=c.clock.now(), who="t")
    c.store("n0", rec)
    c.advance(3600)
    assert c.get_node("n0").preflight is None  # nobody asked: no run
    c.revalidate("n0", since=rec.since)  # type: ignore[arg-type]
    assert c.revalidate("n0", since=rec.since) == 0  # type: ignore[arg-type]  # once
    c.advance(c.preflight_s)
    pf = c.get_node("n0").preflight
    assert pf is not None and pf.passed


def test_released_node_is_revalidated() -> None:
    c = MemoryCluster()
    c.add_node("n0")
    c.store("n0", release(None, now=c.clock.now(), who="alice"))
    ctl = Controller(c, config=CFG, clock=c.clock.now)
    run_until(c, ctl, "n0", State.HEALTHY)
    assert revalidations(c, "n0") == 1


def test_a_failed_trigger_is_retried_next_pass_and_new_nodes_are_triggered_once() -> None:
    c = MemoryCluster()
    c.add_node("n0")
    c.add_node("new", unvalidated=True)  # its first preflight is started like any other
    c.store("n0", release(None, now=c.clock.now(), who="alice"))
    ctl = Controller(c, config=CFG, clock=c.clock.now)
    c.fail_next("revalidate", Unavailable, node="n0")
    r = ctl.reconcile()
    assert "n0" in r.errors
    assert c.get_node("n0").record.preflight_for is None  # type: ignore[union-attr]
    c.advance(10)
    run_until(c, ctl, "n0", State.HEALTHY)
    run_until(c, ctl, "new", State.HEALTHY)
    assert revalidations(c, "n0") == 1
    assert revalidations(c, "new") == 1


def test_dry_run_never_triggers() -> None:
    c = MemoryCluster()
    c.add_node("n0")
    c.store("n0", release(None, now=c.clock.now(), who="alice"))
    ctl = Controller(c, config=CFG.model_copy(update={"dry_run": True}), clock=c.clock.now)
    for _ in range(3):
        ctl.reconcile()
        c.advance(60)
    assert c.calls["revalidate"] == 0


def test_defaults_match_the_shipped_preflight_template() -> None:
    from pathlib import Path

    import yaml

    from gpuvigil.platform.clusters.settings import KubernetesSettings

    root = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
    tmpl = yaml.safe_load((root / "preflight" / "podtemplate.yaml").read_text())
    s = KubernetesSettings()
    assert tmpl["kind"] == "PodTemplate"
    assert tmpl["metadata"]["name"] == s.preflight_template
    cm = yaml.safe_load((root / "controller" / "configmap.yaml").read_text())
    k8s = yaml.safe_load(cm["data"]["config.yaml"])["controller"]["kubernetes"]
    assert k8s["preflight_namespace"] == s.preflight_namespace == "gpuvigil"
    assert k8s["preflight_template"] == s.preflight_template


def test_every_adapter_implements_the_new_operations() -> None:
    from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
    from gpuvigil.platform.clusters.slurm import SlurmCluster

    for cls in (KubernetesCluster, SlurmCluster, MemoryCluster):
        for op in ("revalidate", "mark_released"):
            assert callable(getattr(cls, op, None)), (cls.__name__, op)
    s = SlurmCluster()
    assert s.revalidate("gpu1", since=MemoryCluster().clock.now()) == 0  # no-op, no command
    c = MemoryCluster()
    c.add_node("n0")
    c.mark_released("n0", at=c.clock.now())
    assert c.nodes["n0"].released_at == c.clock.now()


def test_a_validation_a_leader_20s_ahead_began_is_validated_by_the_next_one() -> None:
    """The skewed leader wrote `since` 20 s past the end of the run in this controller's
    time and started the run for it; the result is dated by this clock (before `since`),
    yet it is that validation's own run: the node returns to service, with no second run
    and no wait (it waited for ever: the run is never repeated for the same `since`)."""
    c = MemoryCluster()
    c.add_node("n0")
    ahead = c.clock.now() + timedelta(seconds=c.preflight_s + 20)
    rec = release(None, now=ahead, who="skewed leader")
    c.store("n0", rec)
    assert rec.since is not None
    c.revalidate("n0", since=rec.since)  # what the skewed leader asked, before it lost the lease
    c.store("n0", rec.model_copy(update={"preflight_for": rec.since}))
    ctl = Controller(c, config=CFG, clock=c.clock.now)
    c.advance(c.preflight_s)
    for _ in range(2):
        ctl.reconcile()
        c.advance(1)
    got = c.get_node("n0")
    assert got.record is not None and got.record.state is State.HEALTHY, got.record
    assert revalidations(c, "n0") == 1
