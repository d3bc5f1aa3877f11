"""What happens to nodes and jobs after a fault is seen: the engine's second half.

`Lifecycle` is mixed into `sim.engine.Engine` (which owns the heap, the fleet and the
tallies): layer-1/2 decisions, taking nodes out and repairing them, and the jobs'
start, interruption (layer-3 restart semantics) and end.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.platform.state import LADDER, pool_of_labels
from gpuvigil.sim import restart
from gpuvigil.sim.detect import cure_probability
from gpuvigil.sim.faults import STORM_KINDS, Cause, Effect
from gpuvigil.sim.fleet import BASE_FACTS, FaultInstance, Node, NodeState
from gpuvigil.sim.jobs import Job, JobState

if TYPE_CHECKING:
    from gpuvigil.sim.engine import Engine

STORMS = tuple(STORM_KINDS.values())


class Lifecycle:
    # --- layer 1 alone (cordon) or layers 1-2 (policy + safety) --------------------------
    def layer_decision(self: Engine, node: Node, fi: FaultInstance, t: float, *,
                       active: bool = False) -> None:  # fmt: skip
        v = self.layer1.verdict(fi.kind.fault, gpu=fi.gpu, active=active)
        if not v.seen:
            return
        if not self.sc.layer2:  # layer 1 alone: the agent cordons (NPD + a cordon hook)
            if v.could_not_run or v.action.rank >= Action.RESET_GPU.rank:
                self.cordon(node, t, reason=v.findings[0].code)
                node.last_step = "REPLACE"  # a person swaps what is broken
                self.push(t + self._human_repair(node), REPAIRED_EV, node, node.repair_epoch)
            return
        self.publish(node, t)

    def on_drain(self: Engine, t: float, obj: tuple[Node, Action | None], epoch: int) -> None:
        node, step = obj
        if node.repair_epoch != epoch or node.state is not NodeState.CORDONED or not node.faults:
            return
        self.take_out(node, t, reason="drain", graceful=self.sc.layer3)
        self.remediate(node, t, step or Action.REBOOT)

    def cordon(self: Engine, node: Node, t: float, *, reason: str) -> None:
        if node.state is not NodeState.UP:
            return
        self.went_out(node, NodeState.CORDONED)
        node.state = NodeState.CORDONED
        self.fleet.remove_free(node.id)
        self.fleet.mark(node, t)
        self.rec.state(t, node.name, "SUSPECT", reason, self._blocking(node))

    def _blocking(self: Engine, node: Node) -> list[Finding]:
        """What the agent reported on the node that blocks it (a fault a person or a cloud
        check found has none: the event names no code, as the controller's would not)."""
        return [f for f in self.visible_findings(node) if f.status is Status.FAILED]

    def take_out(self: Engine, node: Node, t: float, *, reason: str,
                 graceful: bool = False) -> None:  # fmt: skip
        self.went_out(node, NodeState.REPAIR)
        node.state = NodeState.REPAIR
        node.repair_epoch += 1
        self.fleet.remove_free(node.id)
        self.fleet.mark(node, t)
        self.rec.state(t, node.name, "REMEDIATING", reason, self._blocking(node))
        if node.job is not None:
            fi = node.faults[0] if node.faults else None
            self.interrupt(self.jobs[node.job], t, fi, reason=f"drain: {reason}",
                           graceful=graceful, node=node)  # fmt: skip

    def remediate(self: Engine, node: Node, t: float, step: Action) -> None:
        """Run the ladder from `step` until the node's faults are cured; schedule the end."""
        cfg = self.cfg
        self.tally.remediations += 1
        duration = {Action.RESET_GPU: cfg.reset_gpu_s, Action.REBOOT: cfg.reboot_s,
                    Action.REPLACE: cfg.replace_s}  # fmt: skip
        total, human = 0.0, False
        for fi in node.faults:
            spent, s = 0.0, step if step in LADDER else Action.REBOOT
            while True:
                spent += duration[s] + cfg.validate_s
                chance = cure_probability(self.layer1.cures(fi.kind, gpu=fi.gpu), s)
                if self.draws("cure", fi.id, s.value).random() < chance:
                    break
                if s is Action.REPLACE:
                    human = True  # the ladder is spent: quarantine for a person
                    break
                s = LADDER[LADDER.index(s) + 1]
            total = max(total, spent)
        if human:
            total += self._human_repair(node)
        if any(f.kind in STORMS for f in node.faults) and self.storm is not None:
            total = max(total, self.storm.at_s + self.storm.fixed_after_s - t)
        node.last_step = step.value
        self.rec.remediation(t, node.name, step.value, reason="cloud instance check")
        self.push(t + total, REPAIRED_EV, node, node.repair_epoch)

    def on_repaired(self: Engine, t: float, node: Node, epoch: int) -> None:
        if node.repair_epoch != epoch or node.state is NodeState.UP:
            return
        if node.job is not None:
            fi = node.faults[0] if node.faults else None
            self.interrupt(self.jobs[node.job], t, fi, reason="repair")
        self.rec.remediation(t, node.name, node.last_step, result="succeeded", reason="repaired")
        self.clear_faults(node, t)
        if node.last_step == "REPLACE":  # a new machine, or a person swapped the broken part
            self.replaced_machine(node)
        self.came_back(node)
        node.state = NodeState.UP
        self.fleet.add_free(node.id)
        self.fleet.mark(node, t)
        if self.platform is not None:  # the controller hears the node is fine again
            self.platform.at(t)
            self.platform.clear(node.name)
        self.back_in_service(node, t)
        self.maybe_boot_noise(node, t)
        self.schedule(t)

    # --- the storm ----------------------------------------------------------------------
    def on_storm(self: Engine, t: float, _: Any, __: int) -> None:
        """The upgrade lands: on a fraction of the fleet, or of one pool (a rollout); the
        nodes it reaches carry the new image or driver version from now on."""
        if self.storm is None:
            return
        rng = self.draws("storm")
        ids = [n.id for n in self.fleet.nodes]
        if self.storm.pool:
            label = self.fleet.pool_label
            pools = sorted({pool_of_labels(n.labels, label=label) for n in self.fleet.nodes})
            pool = pools[rng.randrange(len(pools))]
            ids = [n.id for n in self.fleet.nodes if pool_of_labels(n.labels, label=label) == pool]
        hit = rng.sample(ids, int(self.storm.fraction * len(ids)))
        if self.storm.batch:  # a rolling rollout: batch after batch, the hit list's order
            for i in range(0, len(hit), self.storm.batch):
                at = t + (i // self.storm.batch) * self.storm.batch_every_s
                self.push(at, STORM_BATCH_EV, hit[i : i + self.storm.batch])
            return
        self.on_storm_batch(t, hit, 0)

    def on_storm_batch(self: Engine, t: float, hit: list[int], _: int) -> None:
        """These nodes get the upgrade now (before the rollback only)."""
        if self.storm is None or t >= self.storm.at_s + self.storm.fixed_after_s:
            return
        self.storm_hit |= set(hit)
        self.relabel(hit, new=True)
        for nid in sorted(hit):
            self.push(t, FAULT_EV, self._instance(STORM_KINDS[self.storm.kind], nid, t))

    def relabel(self: Engine, ids: list[int], *, new: bool) -> None:
        """The upgrade (or its rollback) changes what these nodes run."""
        assert self.storm is not None
        attribute, value = self.storm.change
        for nid in ids:
            node = self.fleet.nodes[nid]
            node.facts[attribute] = value if new else BASE_FACTS[attribute]
        if self.platform is not None:
            self.platform.recount()

    def on_storm_fix(self: Engine, t: float, _: Any, __: int) -> None:
        """The rollback lands: the tool is back on every node."""
        self.relabel(sorted(self.storm_hit), new=False)
        self.storm_hit = set()
        for node in self.fleet.nodes:
            if any(f.kind in STORMS for f in node.faults):
                node.faults = [f for f in node.faults if f.kind not in STORMS]
                self.fleet.mark(node, t)
                if self.platform is not None:  # the agent reports healthy; the controller decides
                    self.platform.at(t)
                    self.platform.publish(
                        node.name,
                        self.visible_findings(node),
                        fixed_by=None,
                        running=node.job is not None,
                    )
                elif node.state in (NodeState.CORDONED, NodeState.REPAIR) and not node.faults:
                    node.repair_epoch += 1
                    self.push(t, REPAIRED_EV, node, node.repair_epoch)
        if self.platform is not None:
            self.control_pass(t)

    # --- jobs ---------------------------------------------------------------------------
    def on_arrive(self: Engine, t: float, job: Job, requeue: int) -> None:
        if requeue:
            self.queue.appendleft(job.id)  # a retried job keeps its place at the front
        else:
            self.queue.append(job.id)
            self.rec.submit(t, job)
        self.schedule(t)

    def schedule(self: Engine, t: float) -> None:
        free = self.fleet.free_count
        if not self.queue or free == 0:
            return
        started = []
        for i, jid in enumerate(self.queue):
            job = self.jobs[jid]
            if job.size <= free:
                self.start(job, t)
                free -= job.size
                started.append(jid)
                if free == 0:
                    break
            if i > 256:
                break
        for jid in started:
            self.queue.remove(jid)

    def start(self: Engine, job: Job, t: float) -> None:
        job.nodes = self.fleet.take(job.size)
        for nid in job.nodes:
            self.fleet.nodes[nid].job = job.id
        job.state = JobState.RUNNING
        job.alloc_since = t
        self._run(job, t)

    def _run(self: Engine, job: Job, t: float, *, lost_pods: int = 0) -> None:
        """The job's processes (re)start at t on the nodes it holds: every pod's, or, where
        the survivors kept theirs (`lost_pods`), only the lost pods'."""
        if lost_pods:
            mode = "survivors_kept"
        else:
            mode = "in_place" if job.restarts > 0 and job.in_place else "cold"
        cost = restart.restart_cost_s(
            self.cfg, nodes=job.size, ranks=job.gpus, mode=mode, lost_pods=lost_pods,
            from_memory=job.from_memory,
        )  # fmt: skip
        job.from_memory = False
        job.restarts += 1
        job.run_start = job.seg_start = t + cost
        job.start_secured = job.seg_done
        job.hung_since = None
        job.speed = self.gang_speed(job)
        job.epoch += 1
        self.push(job.finish_time(t), JOB_END_EV, job, job.epoch)
        if job.started_s is None:
            job.started_s = t
        self.rec.job_start(t, job)
        for nid in job.nodes:
            for fi in self.fleet.nodes[nid].faults:
                if fi.kind.effect in (Effect.CRASH, Effect.SILENT):
                    self.hit_job(job, fi, job.run_start)

    def gang_speed(self: Engine, job: Job) -> float:
        speed = job.copy_speed  # the in-memory tier's copies hold the training thread
        for nid in job.nodes:
            for fi in self.fleet.nodes[nid].faults:
                if fi.kind.effect is Effect.DEGRADE:
                    speed = min(speed, fi.kind.slowdown)
        return speed

    def hit_job(self: Engine, job: Job, fi: FaultInstance, t: float) -> None:
        effect = fi.kind.effect
        if effect is Effect.CRASH:
            self.push(t, JOB_HIT_EV, (job, fi), job.restarts)
        elif effect is Effect.HANG:
            if job.hung_since is None and t >= job.run_start:
                job.rebase(t, job.speed)
                job.hung_since = t
            timeout = restart.hang_timeout_s(self.cfg, layer3=self.sc.layer3)
            self.push(t + timeout, JOB_HIT_EV, (job, fi), job.restarts)
        elif effect is Effect.SILENT:
            self.push(t + self.cfg.sdc_job_detect_s, JOB_HIT_EV, (job, fi), job.restarts)
        elif effect is Effect.DEGRADE:
            job.rebase(t, self.gang_speed(job))
            self.push(job.finish_time(t), JOB_END_EV, job, job.epoch)

    def on_job_hit(self: Engine, t: float, obj: tuple[Job, FaultInstance], run: int) -> None:
        job, fi = obj
        if job.restarts != run or job.state is not JobState.RUNNING:
            return
        if fi.kind.persistent and fi.repaired_s is not None and fi.repaired_s <= t:
            return
        if fi.kind.effect is Effect.HANG and self.sc.layer3:  # the watchdog ends the step
            timeout = restart.hang_timeout_s(self.cfg, layer3=True)
            self.rec.hang(t, job, node=f"node-{fi.node:05d}", timeout_s=timeout)
        self.interrupt(job, t, fi, reason=fi.kind.name)

    def interrupt(self: Engine, job: Job, t: float, fi: FaultInstance | None, *, reason: str,
                  graceful: bool = False, node: Node | None = None) -> None:  # fmt: skip
        """`node`: the node a drain took out of the job (its ranks leave, the others may stay)."""
        if job.state is not JobState.RUNNING:
            return
        layer2, layer3 = self.sc.layer2, self.sc.layer3
        stop = restart.stop_of(reason, hang=fi is not None and fi.kind.effect is Effect.HANG)
        # A drain keeps the work only where training saves on SIGTERM (sim.restart).
        graceful = graceful and stop is restart.Stop.EVICTED and restart.drain_keeps_work(
            layer3=layer3)  # fmt: skip
        software = fi is None or not fi.kind.persistent
        code = restart.exit_code(stop, layer3=layer3, graceful=graceful, software=software)
        keep = job.done_at(t) if graceful else job.secured_at(t)
        # the in-memory tier, where the lost machines leave every rank's copy somewhere
        lost = self.lost_nodes(job, t, fi)
        memory = not graceful and restart.memory_tier_holds(job, lost)
        job.from_memory = memory  # the next restore reads the tier, not the DCP files
        if memory:
            keep = max(keep, job.secured_at(t, job.memtier_s))
        corrupt = self.corrupted_since(job, t) if graceful else None
        if corrupt is not None:  # the drain's save holds wrong results: good up to before
            keep = job.secured_at(max(corrupt, job.run_start))
        progressed = keep > job.start_secured + 1e-6
        gone = list(lost)  # and the node a drain takes out
        if node is not None and node.id in job.nodes and job.nodes.index(node.id) not in gone:
            gone.append(job.nodes.index(node.id))
        kept = restart.keeps_survivors(
            stop, layer3=layer3, in_process=job.in_process, graceful=graceful,
            memtier=restart.memory_tier_holds(job, gone),
        ) and len(gone) <= self.fleet.free_count  # fmt: skip
        if kept:  # only the lost machines leave the gang; the survivors wait in process
            self._replace(job, t, gone)
            job.from_memory |= graceful  # a kept drain's replacement fetches its peer's copy
        else:
            self._settle(job, t)
        if fi is not None and fi.kind.persistent and fi.kind.effect is Effect.CRASH:
            self.withhold(self.fleet.nodes[fi.node], t)
        job.seg_done = job.ckpt_done = keep
        job.hung_since = None
        job.epoch += 1
        job.interruptions += 1
        job.in_place = restart.restarts_in_place(
            stop, node_fine=fi is None or not fi.kind.persistent, layer3=layer3)  # fmt: skip
        cause = fi.kind.cause.value if fi is not None else "drain"
        self.tally.interruption(cause=cause, kind=fi.kind.name if fi else "drain")
        if fi is not None and not fi.interrupted_job:
            fi.interrupted_job = True
            self.tally.fault_interruption(cause=cause, calibrated=fi.kind.calibrated)
        if progressed:
            job.failures_in_row = 0
        if restart.counts_against_job(stop, code, layer2=layer2):
            job.failures_in_row += 1
        blamed = f"node-{fi.node:05d}" if fi is not None else None
        # A drain that saved loses nothing; a job stopped while still starting (t before
        # run_start: requeue, load) had no work since its checkpoint to lose.
        saved = max(job.last_checkpoint(t), job.last_checkpoint(t, job.memtier_s) if memory else 0)
        lost_s = 0.0 if graceful else max(0.0, t - saved)
        if corrupt is not None:  # back to the last checkpoint before the corruption
            lost_s = max(0.0, t - job.last_checkpoint(max(corrupt, job.run_start)))
        self.rec.job_restart(t, job, reason=reason, lost_s=lost_s, node=blamed,
                             exit_code=code)  # fmt: skip
        if job.failures_in_row >= self.workload.max_failures_in_row:
            job.state = JobState.FAILED
            self.tally.failed += 1
            self.tally.failed_work += job.work_s * job.gpus
            self.tally.wall(job, t)
            self.rec.job_end(t, job, ok=False, productive_s=0.0, exit_code=code)
        elif kept:  # the lost ranks' pods: a failed one after the Job controller's back-off
            delay = 0.0 if graceful else self.cfg.pod_failure_backoff_s
            self._run(job, t + delay, lost_pods=max(1, len(gone)))
        else:
            job.state = JobState.QUEUED
            self.push(t + self.cfg.requeue_delay_s, ARRIVE_EV, job, 1)
        self.schedule(t)

    def _replace(self: Engine, job: Job, t: float, gone: list[int]) -> None:
        """The lost machines' places in the gang go to free nodes (a spare); the survivors
        keep theirs, and their held time is counted up to now."""
        held = (t - job.alloc_since) * job.size
        job.allocated_s += held
        self.tally.allocated_s += held
        job.alloc_since = t
        old = [job.nodes[pos] for pos in gone]
        for nid in old:
            self.fleet.release(nid)
            self.withhold(self.fleet.nodes[nid], t)  # a broken machine is not taken back
        for pos, new in zip(gone, self.fleet.take(len(gone)), strict=True):
            job.nodes[pos] = new
            self.fleet.nodes[new].job = job.id

    def lost_nodes(self: Engine, job: Job, t: float, fi: FaultInstance | None) -> list[int]:
        """The gang positions of the job's machines gone with their host memory at t: the
        one whose fault stopped the job unless the fault was the program's, and every other
        node of the job that a hardware crash holds at that instant (correlated faults)."""
        out = []
        for pos, nid in enumerate(job.nodes):
            faults = self.fleet.nodes[nid].faults
            if any(f.kind.persistent and f.kind.effect is Effect.CRASH and f.onset_s <= t
                   for f in faults):  # fmt: skip
                out.append(pos)
        if fi is not None and fi.kind.persistent and fi.node in job.nodes:
            pos = job.nodes.index(fi.node)
            if pos not in out:
                out.append(pos)
        return out

    def corrupted_since(self: Engine, job: Job, t: float) -> float | None:
        """When silent corruption began on one of the job's nodes (the earliest onset at
        or before t), or None: a drain then saves wrong results, so the work since is
        lost, whatever the save on SIGTERM kept."""
        onsets = [fi.onset_s for nid in job.nodes for fi in self.fleet.nodes[nid].faults
                  if fi.kind.effect is Effect.SILENT and fi.onset_s <= t]  # fmt: skip
        return min(onsets) if onsets else None

    def withhold(self: Engine, node: Node, t: float) -> None:
        """The node whose fault just crashed a job is not handed to the next job at that
        instant: the GPU's device plugin marks a GPU that raised a fatal Xid unhealthy, and
        a crashed pod's node waits the scheduler's back-off (`requeue_delay_s`), by when the
        agent's check (30-60 s) has reported it. Without this a gang waiting in the queue
        took the broken node in the same instant and crashed on it at start: under
        `split-brain` at 1,024 nodes a 128-node job failed three times so and gave up
        (GPU-h lost 216k against `full`'s 74.5k; the fence was never at fault)."""
        if node.job is None and node.state is NodeState.UP:
            self.fleet.remove_free(node.id)
            self.push(t + self.cfg.requeue_delay_s, OFFER_EV, node, node.repair_epoch)

    def on_offer(self: Engine, t: float, node: Node, _: int) -> None:
        if node.job is None and node.state is NodeState.UP:
            self.fleet.add_free(node.id)
            self.schedule(t)

    def _settle(self: Engine, job: Job, t: float) -> None:
        held = (t - job.alloc_since) * job.size
        job.allocated_s += held
        self.tally.allocated_s += held
        for nid in job.nodes:
            self.fleet.release(nid)
        job.nodes = []

    def on_job_end(self: Engine, t: float, job: Job, epoch: int) -> None:
        if job.epoch != epoch or job.state is not JobState.RUNNING or math.isinf(t):
            return
        self._settle(job, t)
        job.state = JobState.DONE
        self.tally.finished += 1
        self.tally.finished_work += job.work_s * job.gpus
        self.tally.productive_s += job.work_s * job.size
        self.tally.wall(job, t)
        self.rec.job_end(t, job, ok=True, productive_s=job.work_s)
        self.schedule(t)

    def finish(self: Engine, t: float) -> None:
        for job in self.jobs:
            if job.state is JobState.RUNNING:
                done = job.done_at(t)
                self._settle(job, t)
                self.tally.productive_s += done * job.size
                self.tally.censored += 1
                self.tally.wall(job, t)
            elif job.state is JobState.QUEUED and job.restarts:
                self.tally.productive_s += job.seg_done * job.size
                self.tally.censored += 1
                self.tally.wall(job, t)
        for node in self.fleet.nodes:  # episodes still open count as they stand
            if node.out:
                self.tally.false[node.out] += 1
        self.fleet.close(t)
        self.tally.broken_in_service_s = self.fleet.broken_in_service_s
        if self.serving is not None:
            self.tally.serving_below_min = self.serving.finish(t)
            self.tally.kept_gpu_s = self.serving.kept_gpu_s
        self.res.faults_undetected = sum(
            1 for n in self.fleet.nodes for f in n.faults
            if f.detected_s is None and f.kind.cause is not Cause.TOOLING
        )  # fmt: skip
        if self.platform is not None:
            self.res.breaker_trips = self.platform.controller.breaker.status.trips
        self.tally.finish(self.res, unavailable_s=self.fleet.unavailable_s,
                          gpus_per_node=self.cfg.gpus_per_node)  # fmt: skip
        self.rec.finish(t, self.res)


FAULT_EV, DETECT_EV, REPAIRED_EV, ARRIVE_EV, JOB_END_EV, JOB_HIT_EV, _, _, DRAIN_EV = range(9)
OFFER_EV, STORM_BATCH_EV = 16, 18  # sim.engine.OFFER, STORM_BATCH
