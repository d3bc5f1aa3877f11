"""The discrete-event engine: one event heap, faults -> detection -> decisions -> jobs.

Called by `sim.run` (the CLI and the bench). Periodic checks are not ticked: a fault is
seen at the next run of the check that sees it (a uniform delay within its interval), so
the cost grows with the number of faults and jobs, never with simulated time.
Random streams are split by purpose (faults, jobs, placement, delays) so every scenario
of one seed sees the same faults and the same jobs.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable

from gpuvigil.core.findings import Action
from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.sim import episodes, incidents, lifecycle, restart, serving
from gpuvigil.sim.adversity import ATTACKS
from gpuvigil.sim.detect import Layer1
from gpuvigil.sim.faults import (
    BOOT_NOISE,
    NODE_WIDE,
    Cause,
    Effect,
    FaultKind,
    FaultModel,
    Silence,
    Storm,
)
from gpuvigil.sim.fleet import FaultInstance, Fleet, Node, NodeState
from gpuvigil.sim.jobs import DAY, Job, Workload
from gpuvigil.sim.platform import Platform
from gpuvigil.sim.record import EventRecorder, Recorder
from gpuvigil.sim.results import Results, Tally
from gpuvigil.sim.scenarios import Scenario, SimConfig

FAULT, DETECT, REPAIRED, ARRIVE, JOB_END, JOB_HIT, STORM, STORM_FIX, DRAIN = range(9)
EXPIRE = 15  # after episodes' CONTROL_PASS .. SILENCE_END
OFFER = 16  # a node a GPU fault just crashed a job on is offered to the scheduler again
STORM_BATCH = 18  # a batch of a rolling rollout lands (17: sim.incidents.FLAP_EV)


class Engine(lifecycle.Lifecycle, episodes.Episodes, incidents.Incidents):
    def __init__(
        self,
        *,
        scenario: Scenario,
        nodes: int,
        days: float,
        seed: int,
        workload: Workload,
        config: SimConfig | None = None,
        model: FaultModel | None = None,
        storm: Storm | None = None,
        silence: Silence | None = None,
        breaker: bool = True,
        controller: ControllerConfig | None = None,
        layer1: Layer1 | None = None,
        recorder: Recorder | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.sc, self.cfg = scenario, config or SimConfig()
        self.horizon = days * DAY
        self.workload = workload
        self.model = model or FaultModel()
        self.storm = storm
        self.storm_hit: set[int] = set()  # nodes the storm's upgrade reached, until the fix
        self.seed = seed
        self.rng = random.Random(f"{seed}:delays")
        places, cfg = random.Random(f"{seed}:placement"), self.cfg
        self.fleet = Fleet(
            nodes, places, pool_nodes=cfg.pool_nodes, rack_nodes=cfg.rack_nodes,
            pool_label=(controller or ControllerConfig()).safety.pool_label,
        )  # fmt: skip
        self.by_name = {n.name: n.id for n in self.fleet.nodes}
        attack = ATTACKS[scenario.attack](days * DAY) if scenario.attack else None
        self.platform: Platform | None = None
        n_serving = round(nodes * workload.serving_fraction)
        self.serving: serving.Serving | None = None
        if n_serving:
            self.fleet.serve(range(nodes - n_serving, nodes))
            self.serving = serving.Serving(self, self.fleet.nodes[nodes - n_serving :])
        gate = self.serving is not None and scenario.capacity_gate
        controller = serving.controller_config(
            controller or ControllerConfig(), gpus_per_replica=self.cfg.gpus_per_replica,
            gate=gate, isolation=scenario.gpu_isolation,
        )  # fmt: skip
        sim_serving = None
        if gate and self.serving is not None:
            sim_serving = serving.SimServing(self.serving, now=lambda: self.platform_t)
        self.platform = Platform(
            machines=[(n.name, n.labels, n.facts) for n in self.fleet.nodes], config=controller,
            reset_s=self.cfg.reset_gpu_s, reboot_s=self.cfg.reboot_s,
            preflight_s=self.cfg.validate_s, breaker=breaker, events=recorder, adversity=attack,
            serving=sim_serving, gpus=self.cfg.gpus_per_node,
        ) if scenario.layer2 else None  # fmt: skip
        if self.platform is not None:
            self.platform.cluster.holders_of = self.holders_of
            self.platform.cluster.preflight_judge = self.preflight_passes
            self.platform.cluster.idle_of = self.fleet.idle_by_pool
        if self.platform is not None and self.serving is not None:
            self.platform.pods_of = self.serving.pods_named
        self.silent: set[int] | None = None  # during a silence: nodes whose report waits
        self._pass_at: float | None = None
        self.layer1 = layer1 or Layer1()
        self.rec = recorder or Recorder()
        if isinstance(self.rec, EventRecorder):  # the real controller reports node states
            self.rec.sim_states = not scenario.layer2
        self.tally = Tally()
        self.res = Results(scenario.name, nodes, days, seed, workload.name)
        self.jobs: list[Job] = workload.initial_and_arrivals(
            random.Random(f"{seed}:jobs"), nodes=nodes - n_serving, horizon_s=self.horizon,
            gpus_per_node=self.cfg.gpus_per_node,
        )  # fmt: skip
        for job in self.jobs if scenario.layer3 else ():
            job.in_process = workload.in_process
            if workload.memtier_every_steps > 0:
                restart.arm_memtier(job, self.cfg, every_steps=workload.memtier_every_steps,
                                    step_s=workload.step_s)  # fmt: skip
        self.queue: deque[int] = deque()
        self.progress = progress
        self._heap: list[tuple[float, int, int, object, int]] = []
        self._seq = 0
        self._fault_ids = 0
        for onset, kind, nid in self.model.sample(seed, nodes=nodes, horizon_s=self.horizon):
            self.push(onset, FAULT, self._instance(kind, nid, onset))
        for job in self.jobs:
            self.push(job.submit_s, ARRIVE, job)
        if self.serving is not None:
            self.fleet.on_change = self.serving.changed
            self.push(serving.HOUR, serving.SERVING_DEMAND, None)
        self.held_at: float | None = None
        if scenario.incident:
            if scenario.incident == "skew" and self.platform is not None:
                self.platform.cluster.agent_skew_s = incidents.SKEW_S
            self.plan_incident(scenario.incident, min(10 * DAY, self.horizon / 3))
        if scenario.lemon:  # a lemon: its first fault a day in, on one machine
            lemon = self.fleet.nodes[self.draws("lemon").randrange(nodes)]
            lemon.lemon = scenario.lemon
            first = min(DAY, self.horizon / 3)
            self.push(first, FAULT, self._instance(self.model.by_name[scenario.lemon],
                                                   lemon.id, first))  # fmt: skip
        if storm is not None and storm.at_s < self.horizon:
            self.push(storm.at_s, STORM, None)
            self.push(storm.at_s + storm.fixed_after_s, STORM_FIX, None)
        if silence is not None and self.platform is not None and silence.at_s < self.horizon:
            self.push(silence.at_s, episodes.SILENCE, None)
            self.push(silence.at_s + silence.duration_s, episodes.SILENCE_END, None)

    # --- the loop -----------------------------------------------------------------------
    def push(self, t: float, kind: int, obj: object, tag: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj, tag))

    def run(self) -> Results:
        handlers = {
            FAULT: self.on_fault, DETECT: self.on_detect, REPAIRED: self.on_repaired,
            ARRIVE: self.on_arrive, JOB_END: self.on_job_end, JOB_HIT: self.on_job_hit,
            STORM: self.on_storm, STORM_FIX: self.on_storm_fix, DRAIN: self.on_drain,
            episodes.CONTROL_PASS: self.control_pass,
            episodes.CONTROL_ARRIVE: self.on_control_arrive,
            episodes.CONTROL_HUMAN: self.on_control_human,
            episodes.PUBLISH: self.on_publish,
            episodes.SILENCE: self.on_silence, episodes.SILENCE_END: self.on_silence_end,
            EXPIRE: self.on_expire, OFFER: self.on_offer, incidents.FLAP_EV: self.on_flap,
            STORM_BATCH: self.on_storm_batch, serving.SERVING_READY: self.on_serving,
            serving.SERVING_DEMAND: self.on_serving_demand, episodes.GPU_SWAP: self.on_gpu_swap,
        }  # fmt: skip
        self.rec.fleet(0.0, (n.name for n in self.fleet.nodes))
        heap, events, next_report = self._heap, 0, 0.0
        while heap:
            t, _, kind, obj, tag = heapq.heappop(heap)
            if t > self.horizon:
                break
            events += 1
            handlers[kind](t, obj, tag)
            if self.progress is not None and t >= next_report:
                self.progress(t / self.horizon)
                next_report = t + self.horizon / 100
        self.finish(self.horizon)
        self.res.events = events
        if self.platform is not None:
            self.res.adversity = self.platform.adversity()
        return self.res

    @property
    def platform_t(self) -> float:
        return self.platform.t if self.platform is not None else 0.0

    def on_serving(self, t: float, _: object, __: int) -> None:
        if self.serving is not None:
            self.serving.ready_events.discard(t)
            self.serving.update(t)
            if self.serving.held and self.platform is not None:  # the gate waits on these
                self.control_pass(t)

    def on_serving_demand(self, t: float, _: object, __: int) -> None:
        """The demand's hourly step (the HPA's desiredReplicas moves)."""
        if self.serving is not None:
            self.serving.on_demand(t)
            self.push(t + serving.HOUR, serving.SERVING_DEMAND, None)

    def holders_of(self, name: str, index: int) -> list[str]:
        """The pods holding GPU `index` of the node (what PodResources would list)."""
        node = self.fleet.nodes[self.by_name[name]]
        if self.serving is not None and node.id in self.serving.ids:
            return self.serving.holders(node, index)
        return [f"{name}-job"] if node.job is not None else []

    def sync_pods(self, nodes: list[Node]) -> None:
        """The serving replicas on each node, as the controller's cluster lists its pods."""
        if self.platform is None or self.serving is None:
            return
        for node in nodes:
            self.platform.set_running(node.name, running=False)

    def _instance(self, kind: FaultKind, nid: int, onset: float) -> FaultInstance:
        self._fault_ids += 1
        gpu = self.model.gpu(self.draws("gpu", self._fault_ids), gpus=self.cfg.gpus_per_node)
        return FaultInstance(self._fault_ids, kind, nid, onset, gpu=gpu)

    # --- faults and detection -----------------------------------------------------------
    def on_fault(self, t: float, fi: FaultInstance, _: int) -> None:
        node = self.fleet.nodes[fi.node]
        kind = fi.kind
        if node.state in (NodeState.REPAIR, NodeState.DOWN) and not fi.on_arrival:
            return  # the node is out of service already; its repair covers this
        if not kind.persistent and node.job is None:
            return  # an application fault needs an application
        self.tally.faults += 1
        where = "node" if kind.fault in NODE_WIDE else f"gpu:{fi.gpu}"
        self.rec.fault(t, node.name, kind.name, where)
        if kind.persistent:
            if kind.name in node.cleared:  # repaired on this machine before, and back
                node.flaps[kind.name] = node.flaps.get(kind.name, 0) + 1
                self.tally.max_flaps = max(self.tally.max_flaps, node.flaps[kind.name])
            node.faults.append(fi)
            if kind.cause is not Cause.TOOLING:
                node.hardware_faults += 1
        if kind.host_down:
            node.state = NodeState.DOWN
            self.fleet.remove_free(node.id)
        self.fleet.mark(node, t)
        if node.job is not None:
            self.hit_job(self.jobs[node.job], fi, t)
        self.schedule_detection(fi, t)

    def schedule_detection(self, fi: FaultInstance, t: float) -> None:
        rng = self.draws("detect", fi.id)  # per fault: every scenario draws the same delays
        kind, sc, u = fi.kind, self.sc, rng.uniform
        options: list[tuple[float, str]] = []
        if kind.host_down:
            options.append((u(0, self.cfg.instance_check_s), "instance-check"))
        if sc.layer1:
            v = self.layer1.verdict(kind.fault, gpu=fi.gpu)
            if v.seen:
                options.append((u(0, v.interval_s), "layer1"))
            active = sc.layer4 and kind.effect is Effect.SILENT
            if active and self.layer1.verdict(kind.fault, gpu=fi.gpu, active=True).seen:
                options.append((u(0, self.cfg.active_check_interval_s), "active-check"))
        if kind.persistent and kind.effect is not Effect.NONE:
            mean = self.workload.human_detect_mean_s or self.cfg.human_detect_mean_s
            options.append((rng.expovariate(1 / mean), "human"))
        if options:
            delay, by = min(options)
            self.push(t + delay, DETECT, fi, _BY.index(by))

    def on_detect(self, t: float, fi: FaultInstance, by_i: int) -> None:
        by = _BY[by_i]
        node = self.fleet.nodes[fi.node]
        if fi.kind is BOOT_NOISE:
            if not self.layer1.verdict(fi.kind.fault, gpu=fi.gpu).seen:
                return  # the catalog knows this fleet's boot noise: nothing to do
            node.faults.append(fi)  # misread noise: the node looks faulty until cleared
        if fi.kind.persistent and fi not in node.faults:
            return  # repaired meanwhile
        if node.state is NodeState.REPAIR:
            return  # already being repaired; the repair clears every fault on the node
        if fi.detected_s is None:
            fi.detected_s, fi.detected_by = t, by
            if fi.kind.persistent and fi.kind.cause is not Cause.TOOLING:
                self.tally.detect.append(t - fi.onset_s)
            if by in ("layer1", "active-check") and (
                not self.sc.layer2 or not fi.kind.persistent
            ):  # with layer 2 the publish records a persistent fault's findings
                v = self.layer1.verdict(fi.kind.fault, gpu=fi.gpu, active=by == "active-check")
                self.rec.findings(t, node.name, v.findings)
                if not fi.kind.persistent:  # an Xid the rules keep for their window
                    self.push(t + episodes.lifetime_s(v.findings), EXPIRE, (node, v.findings))
        if by == "human":
            self.take_out(node, t, reason="human")
            node.last_step = "REPLACE"  # a person swaps what is broken
            self.push(t + self._human_repair(node), REPAIRED, node, node.repair_epoch)
        elif by == "instance-check":
            self.take_out(node, t, reason="instance check failed")
            first = self.layer1.cures(fi.kind, gpu=fi.gpu)[:1]
            self.remediate(node, t, Action.REBOOT if first and first[0][0] is Action.REBOOT
                           else Action.REPLACE)  # fmt: skip
        else:
            self.layer_decision(node, fi, t, active=by == "active-check")

    def _human_repair(self, node: Node) -> float:
        rng = self.draws("human", node.id, node.repair_epoch)
        return rng.expovariate(1 / self.cfg.human_repair_mean_s)

    def draws(self, *key: object) -> random.Random:
        """A random stream for one decision about one fault or node: scenarios that differ
        in what they do still draw the same numbers for the same fault (common random
        numbers), so their differences are the layers', not the dice's."""
        return random.Random(f"{self.seed}:" + ":".join(str(k) for k in key))


_BY = ("instance-check", "layer1", "active-check", "human", "boot")
