"""The remediation controller's reconcile loop (`gpuvigil controller`). Settings: `controller:`.

Level-based: every pass lists the nodes, reads each one's stored record and health summary
from the cluster, asks the pure policy (`platform.policy.decide`) what the node should be,
and makes it so (`platform.apply`). Nothing is remembered between passes that matters for
correctness (the breaker's hysteresis, which events were already said, and a memo of
decisions whose inputs have not changed), so a killed controller resumes exactly where the
records on the nodes say it was.

A pass decides again only for nodes whose inputs changed (`platform.memo`): a node whose
view (the adapter's `NodeView`, resourceVersion included) and `Fleet` are as last time keeps
its no-op decision while the policy, asked ahead, gives the same answer.

Every write passes the leader elector's fence (`platform.leader`): a replica that is not
the leader, or whose leadership may have lapsed, sends nothing and stops the pass. The
disruption budget is taken and given back in the budget ledger (`platform.budget`) by one
compare-and-swap per pass, between the pass's other writes and its new disruptions.

Called by `commands/controller.py` (the loop), by the tests and the benchmark (one
`reconcile()` at a time against `clusters.memory`), and by the simulator.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.events import EventWriter
from gpuvigil.core.findings import utcnow
from gpuvigil.platform import intent
from gpuvigil.platform import spares as spares_mod
from gpuvigil.platform.announce import Announcer
from gpuvigil.platform.apply import apply
from gpuvigil.platform.breaker import Breaker
from gpuvigil.platform.budget import Ledger
from gpuvigil.platform.clusters.base import (
    Cluster,
    ClusterError,
    Conflict,
    Fenced,
    NodeView,
    Sparing,
    Unavailable,
)
from gpuvigil.platform.clusters.settings import KubernetesSettings, SlurmSettings
from gpuvigil.platform.gpu_path import IsolationConfig, converge, gpu_pass
from gpuvigil.platform.isolation import decode_isolation
from gpuvigil.platform.leader import LeaderElector, LeaseSettings
from gpuvigil.platform.memo import DecisionMemo
from gpuvigil.platform.metrics import ControllerMetrics
from gpuvigil.platform.observed import Observed
from gpuvigil.platform.policy import Decision, Fleet, OpKind, PolicyConfig, decide
from gpuvigil.platform.replacements import Replacements
from gpuvigil.platform.safety import Gate, SafetyConfig, excluded, pool_of
from gpuvigil.platform.serving_hook import ServingGuard
from gpuvigil.platform.serving_pool import ServingConfig
from gpuvigil.platform.state import Episode, Intent, State

log = logging.getLogger("gpuvigil.controller")
T = TypeVar("T")


class ControllerConfig(StrictModel):
    """`controller:` in the config file. Every field and default: docs/controller.md."""

    cluster: Literal["kubernetes", "slurm"] = "kubernetes"
    interval_s: float = Field(10.0, gt=0)  # between reconcile passes
    apply_workers: int = Field(8, ge=1)  # nodes acted on at once (bounded by the adapter)
    dry_run: bool = False  # decide and record (events, metrics, log), never act
    events_path: Path | None = None  # JSONL event log (core.events); None: none written
    metrics_port: int = Field(9403, ge=0, le=65535)  # 0: no metrics endpoint
    metrics_address: str = "0.0.0.0"  # where /metrics and /healthz listen; 127.0.0.1: local
    leader_election: bool = True  # one acting replica (Kubernetes Lease; Slurm lease files)
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    recheck_s: float = Field(60.0, gt=0)  # an unchanged node's no-op decision is reused this long
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    safety: SafetyConfig = Field(default_factory=SafetyConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)  # capacity gate: docs/serving.md
    isolation: IsolationConfig = Field(default_factory=IsolationConfig)  # one bad GPU, one GPU
    spares: spares_mod.SpareConfig = Field(default_factory=spares_mod.SpareConfig)  # hot spares
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)


@dataclass
class PassResult:
    """What one reconcile pass did (for tests, the benchmark and the simulator)."""

    at: datetime
    decisions: dict[str, Decision] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    listed: bool = True
    breaker_open: bool = False
    decided: int = 0  # nodes the policy ran for (the rest reused an unchanged decision)
    fenced: bool = False  # the pass stopped: this replica may not act
    isolated: dict[str, str] = field(default_factory=dict)  # node -> its isolated GPU's step
    spares: spares_mod.Plan | None = None  # the pass's hot-spare plan (None: spares off)


Work = tuple[NodeView, Decision, Fleet]


class Controller:
    def __init__(
        self,
        cluster: Cluster,
        *,
        config: ControllerConfig | None = None,
        clock: Callable[[], datetime] = utcnow,
        metrics: ControllerMetrics | None = None,
        events: EventWriter | None = None,
        identity: str = "controller",
        elector: LeaderElector | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.cluster = cluster
        self.config = config or ControllerConfig()
        self.clock = clock
        self.metrics = metrics
        self.identity = identity
        policy, safety = self.config.policy, self.config.safety
        label = getattr(cluster, "pool_label", safety.pool_label)
        if label != safety.pool_label:  # budgets and the adapter's grace would part ways
            raise ValueError(
                f"the cluster adapter reads pools from the label {label!r} but "
                f"safety.pool_label is {safety.pool_label!r}: open it with "
                "open_cluster(..., pool_label=config.safety.pool_label)"
            )
        self.breaker = Breaker(safety, heartbeat_stale_s=policy.heartbeat_stale_s)
        self.replacements = Replacements(timeout_s=policy.replace_timeout_s)
        self.voice = Announcer(cluster, dry_run=self.config.dry_run, metrics=metrics, events=events)
        if self.config.spares.enabled and not isinstance(cluster, Sparing):
            raise ValueError(
                f"controller.spares is set but the {getattr(cluster, 'name', '?')} adapter "
                "cannot keep spares"
            )
        if self.config.serving.pools and getattr(cluster, "serving", None) is None:
            raise ValueError(
                f"controller.serving.pools is set but the {getattr(cluster, 'name', '?')} "
                "adapter cannot read serving pools (Kubernetes only)"
            )
        self.guard = ServingGuard(cluster, self.config.serving, voice=self.voice,
                                  metrics=metrics, dry_run=self.config.dry_run)  # fmt: skip
        store = getattr(cluster, "lease_store", None)
        if elector is None and store is not None:  # a lone controller: never fenced
            elector = LeaderElector(store(), identity=identity, elect=False)
        self.elector = elector
        self.ledger: Ledger | None = None
        if elector is not None:
            cluster.fence = elector.fence
            grace = 2 * self.config.lease.duration_s  # past any write of a deposed leader
            # durations on the controller's own clock when it was given one (virtual time)
            mono = monotonic or (time.monotonic if clock is utcnow else lambda: clock().timestamp())
            self.ledger = Ledger(elector, orphan_grace_s=grace, monotonic=mono)
        self._memo = DecisionMemo(recheck_s=self.config.recheck_s)
        self.observed = Observed()
        # provider id -> the machine's episodes as its node's record last showed them: a
        # node renamed (a new Node object for the same machine) starts from them. In memory
        # only: the records are the durable copy (docs/controller.md, machine memory).
        self.machines: dict[str, tuple[Episode, ...]] = {}
        self._skewed = 0  # nodes over the skew tolerance last pass (logged when it rises)
        self._fenced = threading.Event()  # set when a write hit the fence mid-pass
        self._busy: dict[str, datetime] = {}  # node -> when to try it as a spare again
        self.last_pass_at = time.time()  # wall clock of the last finished pass (/healthz)

    # ---- one pass -------------------------------------------------------------------

    def reconcile(self) -> PassResult:
        started = time.perf_counter()
        now = self.clock()
        result = PassResult(at=now)
        self._fenced.clear()
        try:
            self.cluster.fence()  # a replica that may not act does not even look
            nodes = self.cluster.list_nodes()
            slots = self.ledger.read() if self.ledger is not None else {}
        except ClusterError as e:  # act on nothing we could not read
            self.voice.api_error(e)
            log.warning("cannot list nodes: %s", e)
            result.listed, result.fenced = False, isinstance(e, Fenced)
            return result
        if self.config.dry_run:  # decide from the records a live controller would have
            nodes = [intent.shadow(n) for n in nodes]
        self.observed.apply(nodes, now)  # reports dated by when this controller saw them
        self._export_skew()
        self.guard.begin()
        self.voice.observed(nodes, now)
        for change in self.breaker.update(nodes, now=now):
            self.voice.breaker_changed(self.breaker, change, now)
        result.breaker_open = self.breaker.status.open
        safety = self.config.safety
        for gone in self.replacements.observe(nodes, now=now, pool_of=lambda v: pool_of(v, safety)):
            log.warning("node %s was given back for replacement at %s and no new machine "
                        "joined pool %s since", gone.node, gone.at, gone.pool)  # fmt: skip
        for v in nodes:  # each machine's episodes, by provider id: kept across renames
            rec = v.record
            if rec is not None and rec.episodes and v.provider_id:
                self.machines[v.provider_id] = rec.episodes
        gate = Gate(
            safety, nodes, now=now, breaker=self.breaker, replacements=self.replacements,
            reserved=slots, machines=self.machines,
            room_stale_s=self.config.policy.heartbeat_stale_s,
        )  # fmt: skip
        held = 0
        work: list[Work] = []
        for seen in nodes:
            node = seen
            if excluded(node, self.config.safety):
                self.voice.say(node.name, "excluded by label: observed, never acted on", now)
                continue
            fleet = gate.fleet_for(node)
            try:  # one GPU's ladder first: it may take the node's problem off its plate
                if not self.config.dry_run:
                    node = gpu_pass(self.cluster, node, fleet=fleet, now=now,
                                    policy=self.config.policy, config=self.config.isolation,
                                    voice=self.voice, guard=self.guard)  # fmt: skip
                    converge(self.cluster, node, config=self.config.isolation)
            except Fenced as e:
                self._fenced.set()
                self.voice.api_error(e)
                break
            except ClusterError as e:  # the isolation record says where it was: next pass
                self.voice.api_error(e)
                result.errors[node.name] = f"{e.kind}: {e}"
                log.info("node %s: per-GPU path: %s (%s); next pass retries", node.name, e,
                         e.kind)  # fmt: skip
                continue
            gone = decode_isolation(node.isolation_text)
            if gone is not None:
                result.isolated[node.name] = gone.step
            d = self._decide(node, fleet, now, result)
            result.decisions[node.name] = d
            if d.disruptive:
                gate.consume(node)
            elif node.record and node.record.in_budget and not d.record.in_budget:
                gate.release(node)
            was = node.record.state if node.record else State.HEALTHY
            if d.state is State.QUARANTINED and was is not State.QUARANTINED:
                gate.quarantined()
            if d.held:
                held += 1
                self.voice.say(node.name, f"held: {d.held}", now)
            if d.store or d.ops:
                work.append((node, d, fleet))
        self._memo.forget_absent({n.name for n in nodes})
        # Everything but new disruptions first (a node leaving the budget frees its slot
        # in this pass), then one compare-and-swap of the budget ledger, then the
        # disruptions it admitted.
        now_work = [w for w in work if not w[1].disruptive]
        applied = self._apply_all(now_work, now, result)
        disruptions = self._settle(
            work, applied=applied, nodes=nodes, slots=slots, gate=gate, now=now, result=result
        )
        self._apply_all(disruptions, now, result)
        self._follow_spare_moves(result)
        self._keep_spares(nodes, now, result)
        self._restore(nodes, now, {n: d.state for n, d in result.decisions.items()})
        self._publish(nodes, now, result)
        self.voice.export(
            nodes, result, gate=gate, breaker=self.breaker, held=held, started=started,
            policy=self.config.policy,
        )  # fmt: skip
        self.guard.export()
        result.fenced = self._fenced.is_set()
        self.last_pass_at = time.time()
        return result

    def _follow_spare_moves(self, result: PassResult) -> None:
        """An adapter that moves a requeued gang job onto the spares over several passes
        (Slurm: `follow_spare_moves`) takes its next step here; the step is read back from
        the cluster each pass, so nothing is kept here. Runs with spares off too: a
        reservation made by hand is followed the same way."""
        follow = getattr(self.cluster, "follow_spare_moves", None)
        if follow is None or self.config.dry_run or self._fenced.is_set():
            return
        for line in self._spare_write(follow, "spare-moves", result) or ():
            log.info("hot spares: %s", line)

    def _keep_spares(self, nodes: list[NodeView], now: datetime, result: PassResult) -> None:
        """Hot spares (`platform.spares`): give back used, unfit and surplus spares, then
        refill short pools with fit idle nodes. After the decisions, so a node decided out
        of service this pass is no spare; under the fence like every write."""
        config = self.config.spares
        if not config.enabled or self._fenced.is_set():
            return
        safety = self.config.safety
        plan = spares_mod.plan(
            nodes, config=config, now=now, breaker_open=self.breaker.status.open,
            states={k: d.state for k, d in result.decisions.items()},
            pool_of={v.name: pool_of(v, safety) for v in nodes},
        )  # fmt: skip
        cluster: Sparing = self.cluster  # type: ignore[assignment]  # checked in __init__
        for name, why in plan.unmake:
            log.info("node %s: no longer a hot spare: %s", name, why)
            if not self.config.dry_run:
                self._spare_write(lambda n=name: cluster.unmake_spare(n), name, result)
        self._busy = {k: t for k, t in self._busy.items() if t > now}

        def make(name: str) -> bool:
            if self.config.dry_run or self._fenced.is_set():
                log.info("node %s: would be made a hot spare (dry run)", name)
                return False
            ok = self._spare_write(lambda: cluster.make_spare(name), name, result) is True
            if ok:
                log.info("node %s: made a hot spare", name)
            return ok

        kept, busy = spares_mod.fill(
            plan, make, max_tries=4 * config.max_new_per_pass, skip=self._busy
        )
        for name in busy if not (self.config.dry_run or self._fenced.is_set()) else ():
            self._busy[name] = now + timedelta(seconds=config.busy_recheck_s)  # holds work
        result.spares = dataclasses.replace(plan, spares=kept)
        if plan.held:
            log.info("hot spares: pools short and held: %s", plan.held)
        if self.metrics:
            for pool, want in plan.wanted.items():
                self.metrics.spares.labels(pool).set(kept.get(pool, 0))
                self.metrics.spares_wanted.labels(pool).set(want)

    def _spare_write(self, call: Callable[[], T], name: str, result: PassResult) -> T | None:
        try:
            return call()
        except Fenced as e:
            self._fenced.set()
            self.voice.api_error(e)
        except ClusterError as e:  # level-based: the next pass plans again from the nodes
            self.voice.api_error(e)
            result.errors[name] = f"{e.kind}: {e}"
            log.info("node %s: hot spare: %s (%s); next pass retries", name, e, e.kind)
        return None

    def _restore(self, nodes: list[NodeView], now: datetime, after: dict[str, State]) -> None:
        """Serving replicas a make-before-break added go back once its node is repaired."""
        if self._fenced.is_set():
            return
        try:
            self.guard.restore(nodes, now=now, after=after)
        except Fenced as e:
            self._fenced.set()
            self.voice.api_error(e)

    def _publish(self, nodes: list[NodeView], now: datetime, result: PassResult) -> None:
        """Put each node's decision on it (`platform.intent`) where it changed, so
        `gpuvigil nodes` shows what the controller decided, would do next and why it is
        held; a healthy node with nothing published is left alone (no write per node).
        Concurrent where the adapter allows, as the decisions' own writes are."""
        said: list[tuple[str, Intent]] = []
        for node in nodes:
            d = result.decisions.get(node.name)
            if d is None or not node.intent_supported:
                continue
            it = intent.intent_of(
                node, d, now=now, dry_run=self.config.dry_run, config=self.config.policy
            )
            if not it.same(node.intent) and not (node.intent is None and intent.quiet(it)):
                said.append((node.name, it))

        def one(item: tuple[str, Intent]) -> None:
            if self._fenced.is_set():
                return
            try:
                self.cluster.publish(*item)
            except Fenced as e:
                self._fenced.set()
                self.voice.api_error(e)
            except ClusterError as e:  # for people only: the next pass says it again
                self.voice.api_error(e)
                log.info("node %s: cannot publish the decision: %s", item[0], e)

        self._each(one, said, "publish")

    def _each(self, one: Callable[[T], None], items: list[T], name: str) -> None:
        """`one` over `items`, on as many threads as the config and the cluster allow."""
        workers = min(self.config.apply_workers, getattr(self.cluster, "max_concurrency", 1))
        if workers > 1 and len(items) > 1:
            with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
                list(pool.map(one, items))
        else:
            for item in items:
                one(item)

    def _export_skew(self) -> None:
        skew = self.observed.skew
        if skew.nodes > self._skewed:
            log.warning("clock skew: %d nodes' reports are dated more than %.0f s off this "
                        "controller's clock (worst %s: %+.0f s); judged by when they were "
                        "seen to change", skew.nodes, self.observed.tolerance.total_seconds(),
                        skew.worst, skew.max_s)  # fmt: skip
        self._skewed = skew.nodes
        if self.metrics:
            self.metrics.clock_skew.set(skew.max_s)
            self.metrics.clock_skewed.set(skew.nodes)

    def _given_back(self, node: NodeView, now: datetime) -> None:
        """A machine goes back for replacement: the ledger waits for a new one to join."""
        self.replacements.given_back(node, pool=pool_of(node, self.config.safety), now=now)

    def _decide(self, node: NodeView, fleet: Fleet, now: datetime, result: PassResult) -> Decision:
        """The policy's decision, or the memo's when the node's inputs are unchanged."""
        d = self._memo.get(node, fleet, now)
        if d is not None:
            return d
        policy = self.config.policy
        d = decide(node, fleet=fleet, now=now, config=policy)
        result.decided += 1
        self._memo.put(
            node, fleet, now, d, lambda v, t: decide(v, fleet=fleet, now=t, config=policy)
        )
        return d

    def _apply_all(self, work: list[Work], now: datetime, result: PassResult) -> list[Work]:
        """Apply decisions (concurrently where the adapter allows); returns what was applied
        (the decision that was, after a conflict's re-read)."""
        done: list[Work] = []

        def one(w: Work) -> None:
            node, d, fleet = w
            if self._fenced.is_set():
                return
            try:
                applied = apply(
                    self.cluster, node, d, fleet=fleet, now=now, policy=self.config.policy,
                    voice=self.voice, dry_run=self.config.dry_run, given_back=self._given_back,
                    guard=self.guard,
                )  # fmt: skip
            except Fenced as e:
                self._fenced.set()
                self.voice.api_error(e)
                result.errors[node.name] = f"{e.kind}: {e}"
                log.warning("stopping the pass: %s", e)
                return
            except ClusterError as e:
                self.voice.api_error(e)
                result.errors[node.name] = f"{e.kind}: {e}"
                log.info("node %s: %s (%s); next pass retries", node.name, e, e.kind)
                return
            if applied is not None:
                result.decisions[node.name] = applied
                done.append((node, applied, fleet))

        self._each(one, work, "apply")
        return done

    def _settle(
        self,
        work: list[Work],
        *,
        applied: list[Work],
        nodes: list[NodeView],
        slots: dict[str, str],
        gate: Gate,
        now: datetime,
        result: PassResult,
    ) -> list[Work]:
        """One compare-and-swap of the budget ledger: give back the slots of nodes whose
        stored record left the budget, adopt and drop what the records say, and take a
        slot for each new disruption. Returns the disruptions that got one; the others are
        decided again as held."""
        disruptive = [w for w in work if w[1].disruptive]
        if self.ledger is None or self.config.dry_run or self._fenced.is_set():
            return [] if self._fenced.is_set() else disruptive
        safety = self.config.safety
        admit = {n.name: pool_of(n, safety) for n, _, _ in disruptive}
        # records that left the budget; and replaced machines: gone (a node still there is
        # in the budget by its record and adopted again next pass)
        left = {
            n.name
            for n, d, _ in applied
            if (d.store and not d.record.in_budget)
            or any(op.kind is OpKind.REPLACE for op in d.ops)
        }
        in_budget = {
            n.name: pool_of(n, safety)
            for n in nodes
            if n.record is not None and n.record.in_budget and n.name not in left
        }
        adopt = {k: v for k, v in in_budget.items() if k not in slots}
        drop = self.ledger.orphans(slots, set(in_budget) | set(admit)) | (left & set(slots))
        admitted: set[str] = set()
        if admit or adopt or drop:
            try:
                admitted = self.ledger.settle(
                    admit=admit, adopt=adopt, drop=drop,
                    limits={p: gate.limit(p) for p in gate.size},
                )  # fmt: skip
            except Fenced as e:
                self._fenced.set()
                self.voice.api_error(e)
                return []
            except ClusterError as e:  # no slot without the ledger: hold this pass's
                self.voice.api_error(e)
                log.warning(
                    "the budget ledger (the leader Lease) cannot be written: %s; no new "
                    "disruption until it can",
                    e,
                )
        out: list[Work] = []
        for node, d, fleet in disruptive:
            if node.name in admitted:
                out.append((node, d, fleet))
                continue
            why = "disruption budget: no slot in the budget ledger (another replica took it)"
            held = decide(node, fleet=dataclasses.replace(fleet, may_disrupt=False, why_not=why),
                          now=now, config=self.config.policy)  # fmt: skip
            result.decisions[node.name] = held
            if held.store or held.ops:
                self._apply_all([(node, held, fleet)], now, result)
        return out

    # ---- the loop ---------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else True

    def run(self, stop: threading.Event) -> None:
        """Reconcile every `interval_s` while leader, until `stop` is set."""
        while not stop.is_set():
            leader = self.is_leader()
            if self.metrics:
                self.metrics.is_leader.set(1 if leader else 0)
            if leader:
                try:
                    self.reconcile()
                except Exception:  # keep the loop alive; the next pass starts from the level
                    log.exception("reconcile pass failed")
            # A standby looks again within a second, so it takes over as soon as it leads.
            stop.wait(self.config.interval_s if leader else min(1.0, self.config.interval_s))


__all__ = ["Conflict", "Controller", "ControllerConfig", "PassResult", "Unavailable", "pool_of"]
