"""The engine's side of layer 2: publish what a node's agent sees, apply what the controller did.

`Episodes` is mixed into `sim.engine.Engine` for the `platform` and `full` scenarios;
`sim.platform.Platform` holds the real controller and cluster. A pass runs when an agent
publishes, and again at the time the controller said its next step is due.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuvigil.core.findings import Action, Finding, NodeReport
from gpuvigil.platform.isolation import decode_isolation
from gpuvigil.platform.state import State
from gpuvigil.sim import devices
from gpuvigil.sim.detect import sample_fixed_by
from gpuvigil.sim.faults import BAD_DRIVER, BOOT_NOISE, LEMON_RETURN_S, Cause, Effect
from gpuvigil.sim.fleet import Node, NodeState
from gpuvigil.sim.platform import SLACK_S, Wake

if TYPE_CHECKING:
    from gpuvigil.platform.clusters.memory import MemNode
    from gpuvigil.sim.engine import Engine

# How a fault was found for the agent to publish it (the others: a person, a cloud check).
SEEN_BY_AGENT = ("layer1", "active-check", "boot")
OUT = (State.DRAINING, State.REMEDIATING, State.VALIDATING)
BLOCKED = (State.SUSPECT, State.QUARANTINED)


class Episodes:
    def visible_findings(self: Engine, node: Node) -> list[Finding]:
        out: list[Finding] = []
        for fi in node.faults:
            if fi.detected_by in SEEN_BY_AGENT:
                out += self.layer1.verdict(
                    fi.kind.fault, gpu=fi.gpu, active=fi.detected_by == "active-check"
                ).findings
        return out

    def publish(self: Engine, node: Node, t: float) -> None:
        """The node's agent reports every fault on it that a check has seen so far."""
        if self.silent is not None:  # its report waits for the silence to end
            self.silent.add(node.id)
            return
        findings: list[Finding] = []
        fixed: list[Action | None] = []
        for fi in node.faults:
            if fi.detected_by not in SEEN_BY_AGENT:
                continue
            v = self.layer1.verdict(
                fi.kind.fault, gpu=fi.gpu, active=fi.detected_by == "active-check"
            )
            findings += v.findings
            cures = self.layer1.cures(fi.kind, gpu=fi.gpu)
            if fi.fixed_by is None and cures:
                fi.fixed_by = sample_fixed_by(cures, self.draws("fix", fi.id))
            fixed.append(fi.fixed_by)
        if not findings:
            return
        worst = None if None in fixed else max(fixed, key=lambda a: a.rank)  # type: ignore[union-attr]
        self.platform.at(t)
        self.platform.publish(node.name, findings, fixed_by=worst, running=node.job is not None)
        self.plugin_sees(node, findings, t)
        self.rec.findings(t, node.name, findings)
        self.control_pass(t)

    def plugin_sees(self: Engine, node: Node, findings: list[Finding], t: float) -> None:
        """The device plugin takes GPUs with a critical Xid out of allocatable."""
        out = devices.plugin_marks_out(findings)
        if out == node.gpus_out:
            return
        node.gpus_out = out
        if out:
            self.fleet.remove_free(node.id)
        elif node.state is NodeState.UP and node.job is None:
            self.fleet.add_free(node.id)
        if self.platform is not None:
            self.platform.gpus_out(node.name, out)
        self.fleet.mark(node, t)

    def gpu_evicted(self: Engine, wake: Wake, t: float) -> None:
        """The controller evicted one GPU's holders (the node stays in service), and the
        GPUs it isolates now; a person swaps a GPU isolated for good."""
        for name, pods in wake.evicted.items():
            node = self.fleet.nodes[self.by_name[name]]
            if self.serving is not None and node.id in self.serving.ids:
                self.serving.evict(node, pods, t)
            elif node.job is not None and f"{name}-job" in pods:
                self.interrupt(self.jobs[node.job], t, node.faults[0] if node.faults else None,
                               reason="drain: controller", graceful=self.sc.layer3,
                               node=node)  # fmt: skip
        if self.serving is not None:
            isolated = {}
            for name in wake.isolated:
                rec = decode_isolation(self.platform.cluster.nodes[name].isolation_raw)
                if rec is not None:
                    isolated[self.by_name[name]] = {rec.index}
            self.serving.isolate(isolated, t)
        for name, step in wake.isolated.items():
            node = self.fleet.nodes[self.by_name[name]]
            if step == "isolated" and not node.swap_due:
                node.swap_due = True
                self.push(t + self._human_repair(node), GPU_SWAP, node, node.repair_epoch)

    def on_gpu_swap(self: Engine, t: float, node: Node, epoch: int) -> None:
        """A person swaps the isolated GPU: the machine goes down for it (its work is
        drained, no gate: a person's drain), and comes back whole a reboot later."""
        node.swap_due = False
        if node.repair_epoch != epoch or node.state is not NodeState.UP or not node.faults:
            return
        if node.job is not None:
            self.interrupt(self.jobs[node.job], t, node.faults[0], reason="drain: human")
        self.set_state(node, NodeState.REPAIR, t)
        self.rec.remediation(t, node.name, "REPLACE", reason="a person swaps the isolated GPU")
        node.last_step = "REPLACE"
        self.push(t + self.cfg.reboot_s, REPAIRED_EV, node, node.repair_epoch)

    def control_pass(self: Engine, t: float, *_: Any) -> None:
        self.platform.at(t)
        for name in self.platform.cluster.active:
            nid = self.by_name.get(name)
            if nid is not None:
                self.platform.set_running(name, running=self.fleet.nodes[nid].job is not None)
                if self.platform.faults_cleared(name):
                    self.log_cure(self.fleet.nodes[nid], t)
        wake = self.platform.reconcile()
        self.tally.remediations += wake.steps
        self.gpu_evicted(wake, t)
        for name in wake.drained:
            node = self.fleet.nodes[self.by_name[name]]
            if node.job is not None:
                graceful = self.sc.layer3 and not any(f.kind.effect is Effect.CRASH
                                                      for f in node.faults)  # fmt: skip
                if wake.states.get(name) is not State.QUARANTINED:
                    # a quarantined node's work moved off (a slowed node) stays blocked for
                    # its person: the repair they will make keeps its epoch
                    self.set_state(node, NodeState.REPAIR, t)
                self.interrupt(self.jobs[node.job], t, node.faults[0] if node.faults else None,
                               reason="drain: controller", graceful=graceful,
                               node=node)  # fmt: skip
        for name in wake.replaced:
            node = self.fleet.nodes[self.by_name[name]]
            if not node.machine_fault and node.flapping_until <= t:  # between flaps: faulty
                self.tally.false["replace"] += 1
            self.set_state(node, NodeState.REPAIR, t)
            self.clear_faults(node, t)  # a new machine
            self.replaced_machine(node)
            self.push(t + self.cfg.replace_s, CONTROL_ARRIVE, node, 0)
        for name in wake.quarantined:
            node = self.fleet.nodes[self.by_name[name]]
            if not node.machine_fault and node.flapping_until <= t:
                self.tally.false["quarantine"] += 1
            node.quarantines += 1
            self.tally.max_quarantines = max(self.tally.max_quarantines, node.quarantines)
            self.push(t + self._human_repair(node), CONTROL_HUMAN, node, node.repair_epoch)
        for name, state in wake.states.items():
            node = self.fleet.nodes[self.by_name[name]]
            if name in wake.replaced:
                continue
            if state is State.DRAINING and self.platform.cluster.nodes[name].pods:
                # blocked, its pods still running: the capacity gate holds the drain
                self.set_state(node, NodeState.CORDONED, t)
            elif state in OUT:
                self.set_state(node, NodeState.REPAIR, t)
                if state is State.VALIDATING:
                    self.preflight_finds(node, t)
            elif state in BLOCKED:
                self.set_state(node, NodeState.CORDONED, t)
            elif not self.platform.cluster.nodes[name].our_taints:
                if self.platform.faults_cleared(name):
                    self.clear_faults(node, t)
                    if node.state is NodeState.UP and node.recovering:  # cured in service
                        self.back_in_service(node, t)  # (its GPU's reset): MTTR ends here
                self.set_state(node, NodeState.UP, t)
        if wake.at is not None and (self._pass_at is None or wake.at < self._pass_at
                                    or self._pass_at <= t):  # fmt: skip
            self._pass_at = wake.at
            self.push(wake.at, CONTROL_PASS, None, 0)

    def preflight_finds(self: Engine, node: Node, t: float) -> None:
        """Preflight runs the active checks before a node takes work again: silent
        corruption the passive checks missed shows here (its findings go out next pass)."""
        hidden = [fi for fi in node.faults if fi.kind.effect is Effect.SILENT
                  and fi.detected_s is None]  # fmt: skip
        for fi in hidden:
            if self.layer1.verdict(fi.kind.fault, gpu=fi.gpu, active=True).seen:
                fi.detected_s, fi.detected_by = t, "active-check"
                self.tally.detect.append(t - fi.onset_s)
                self.push(t + self.cfg.validate_s, PUBLISH, node, 0)

    def preflight_passes(self: Engine, mem: MemNode) -> bool:
        """The node's preflight run (`MemoryCluster.preflight_judge`): the real verdict
        (`NodeReport.exit_code`, as `node.preflight` passes on 0) over the node checks' and
        the active checks' findings for every fault the steps run did not cure. Not merely
        "no published fault remains": silent corruption no agent has reported fails it, and
        a remaining fault no check sees passes it, as the real run would."""
        node = self.fleet.nodes[self.by_name[mem.name]]
        step = _latest_step(mem)
        findings: list[Finding] = []
        for fi in node.faults:
            if fi.detected_by in SEEN_BY_AGENT:
                left = bool(mem.faults)  # the cluster clears them all at the step that cures
            else:  # unpublished: its own cure step, drawn as publish would draw it
                if fi.fixed_by is None:
                    cures = self.layer1.cures(fi.kind, gpu=fi.gpu)
                    fi.fixed_by = sample_fixed_by(cures, self.draws("fix", fi.id))
                fixed = fi.fixed_by
                left = not isinstance(fixed, Action) or step is None or step.rank < fixed.rank
            if left:
                findings += self.layer1.verdict(fi.kind.fault, gpu=fi.gpu).findings
                if fi.kind.effect is Effect.SILENT:  # what the active checks model (matmul)
                    findings += self.layer1.verdict(fi.kind.fault, gpu=fi.gpu,
                                                    active=True).findings  # fmt: skip
        return NodeReport(node=mem.name, findings=tuple(findings)).exit_code() == 0

    def on_publish(self: Engine, t: float, node: Node, _: int) -> None:
        self.publish(node, t)

    def on_expire(self: Engine, t: float, obj: tuple[Node, tuple[Finding, ...]], _: int) -> None:
        """The agent drops the findings of a transient fault when their window ends."""
        node, findings = obj
        self.rec.findings(t, node.name, findings, cleared=True)

    def on_control_arrive(self: Engine, t: float, node: Node, _: int) -> None:
        self.platform.at(t)
        self.platform.arrive(node.name)
        self.maybe_boot_noise(node, t)
        if self.storm is not None and self.storm.kind == "driver" and node.id in self.storm_hit:
            # the new machine boots the image the upgrade pushed: its GPUs read lost too,
            # from the agent's first sweep, until the rollback
            fi = self._instance(BAD_DRIVER, node.id, t)
            fi.detected_s, fi.detected_by = t, "layer1"
            node.faults.append(fi)
            self.publish(node, t)
        self.faulty_on_arrival(node, t)
        self.control_pass(t)

    def faulty_on_arrival(self: Engine, node: Node, t: float) -> None:
        """A replacement that arrives broken (`replacement_faulty_rate`): one of the fleet's
        persistent hardware faults, picked by their rates, present from its first boot;
        only the checks, the real preflight verdict among them, keep it out of work."""
        rate = self.cfg.replacement_faulty_rate
        rng = self.draws("faulty-replacement", node.id, t)
        if rate <= 0 or rng.random() >= rate:
            return
        # a host dead on arrival never registers (the cloud's launch check takes it back)
        kinds = [k for k in self.model.kinds if k.persistent and not k.host_down
                 and k.cause is not Cause.TOOLING and k.effect is not Effect.NONE
                 and k.per_node_day > 0]  # fmt: skip
        if not kinds:
            return
        kind = rng.choices(kinds, weights=[k.per_node_day for k in kinds])[0]
        fi = self._instance(kind, node.id, t)
        fi.on_arrival = True
        self.tally.faulty_replacements += 1
        self.on_fault(t, fi, 0)

    def on_control_human(self: Engine, t: float, node: Node, epoch: int) -> None:
        if node.repair_epoch != epoch:
            return
        if node.job is not None:  # the person drains it first
            self.interrupt(self.jobs[node.job], t, node.faults[0] if node.faults else None,
                           reason="drain: human")  # fmt: skip
        self.clear_faults(node, t)
        self.platform.at(t)
        self.platform.release(node.name)
        self.control_pass(t)

    def went_out(self: Engine, node: Node, to: NodeState) -> None:
        """Count an out-of-service episode of a machine with nothing a repair cures: a
        cordon, or a drain once its work is moved off (a cordon that drains is a drain)."""
        if node.state is NodeState.UP:
            node.out = "" if node.machine_fault else ("drain" if to is NodeState.REPAIR
                                                      else "cordon")  # fmt: skip
        elif node.out and to is NodeState.REPAIR:
            node.out = "drain"

    def came_back(self: Engine, node: Node) -> None:
        if node.out:
            self.tally.false[node.out] += 1
            node.out = ""

    def set_state(self: Engine, node: Node, state: NodeState, t: float) -> None:
        was = node.state
        if was is state or was is NodeState.DOWN:
            return
        if state is NodeState.UP:
            self.came_back(node)
        else:
            self.went_out(node, state)
        node.state = state
        if state is NodeState.UP:
            if node.job is None:
                self.fleet.add_free(node.id)
            self.back_in_service(node, t)
            if was is NodeState.REPAIR:
                self.maybe_boot_noise(node, t)
            self.schedule(t)
        else:
            self.fleet.remove_free(node.id)
        if state is NodeState.REPAIR:
            node.repair_epoch += 1
        self.fleet.mark(node, t)

    def clear_faults(self: Engine, node: Node, t: float) -> None:
        """The hardware is fixed; MTTR counts when the node is back in service."""
        self.log_cure(node, t)
        for fi in node.faults:
            fi.repaired_s = t
            if fi.kind.cause is not Cause.TOOLING:
                node.recovering.append(fi)
            if fi.kind.persistent:
                node.cleared.add(fi.kind.name)
        node.faults.clear()
        if node.gpus_out:  # the device plugin restarts with the repaired GPUs
            node.gpus_out = set()
            if self.platform is not None:
                self.platform.gpus_out(node.name, set())
            if node.state is NodeState.UP and node.job is None:
                self.fleet.add_free(node.id)
        self.fleet.mark(node, t)

    def log_cure(self: Engine, node: Node, t: float) -> None:
        """The agent reports a cured fault's findings cleared at its next sweep after the
        cure (a reset or reboot that worked), not when the node returns to service: the
        event log then shows what a real agent's would, and `replay` sees the cure when
        the controller validated the node."""
        for fi in node.faults:
            if fi.detected_by in SEEN_BY_AGENT and not fi.cleared_logged:
                fi.cleared_logged = True
                v = self.layer1.verdict(
                    fi.kind.fault, gpu=fi.gpu, active=fi.detected_by == "active-check"
                )
                self.rec.findings(t, node.name, v.findings, cleared=True)

    def back_in_service(self: Engine, node: Node, t: float) -> None:
        for fi in node.recovering:
            self.tally.repair.append(t - fi.onset_s)
        node.recovering.clear()
        self.rec.state(t, node.name, "HEALTHY", "back in service")
        if node.lemon and not node.faults:  # a lemon's fault returns after every repair
            kind, back = self.model.by_name[node.lemon], t + LEMON_RETURN_S
            self.push(back, FAULT_EV, self._instance(kind, node.id, back))

    def replaced_machine(self: Engine, node: Node) -> None:
        """A new machine takes the node's place: a lemon replaced is a lemon gone."""
        if node.lemon:
            self.tally.lemons_replaced += 1
        node.new_machine()

    # --- a silence: every agent stops reporting, then comes back ---------------------------
    def on_silence(self: Engine, t: float, *_: Any) -> None:
        self.silent = set()
        self.platform.at(t)
        self.platform.silence(n.name for n in self.fleet.nodes)
        stale = self.platform.config.policy.heartbeat_stale_s
        self.push(t + stale + SLACK_S, CONTROL_PASS, None, 0)  # the reports turn stale

    def on_silence_end(self: Engine, t: float, *_: Any) -> None:
        waiting, self.silent = self.silent or set(), None
        self.platform.at(t)
        self.platform.speak()
        for nid in sorted(waiting):
            self.publish(self.fleet.nodes[nid], t)
        self.control_pass(t)

    def maybe_boot_noise(self: Engine, node: Node, t: float) -> None:
        noise = self.draws("boot", node.id, node.repair_epoch).random()
        if self.sc.layer1 and noise < self.model.boot_noise_probability:
            self.push(t + 30.0, DETECT_EV, self._instance(BOOT_NOISE, node.id, t), 4)


def lifetime_s(findings: tuple[Finding, ...], *, default_s: float = 3600.0) -> float:
    """How long the agent keeps a transient fault's findings: until the window the Xid rules
    gave them ends (their `expires_at`)."""
    spans = []
    for f in findings:
        end, seen = f.evidence.get("expires_at"), f.evidence.get("last_seen_at")
        if isinstance(end, str) and isinstance(seen, str):
            spans.append(
                (datetime.fromisoformat(end) - datetime.fromisoformat(seen)).total_seconds()
            )
    return max(spans, default=default_s)


CONTROL_PASS, CONTROL_ARRIVE, CONTROL_HUMAN, PUBLISH, SILENCE, SILENCE_END = 9, 10, 11, 12, 13, 14
FAULT_EV, DETECT_EV, REPAIRED_EV = 0, 1, 2
GPU_SWAP = 21  # a person swaps an isolated GPU (after sim.serving's 19, 20)


def _latest_step(mem: MemNode) -> Action | None:
    """The step the node's agent ran last (its answer names it): the ladder escalates, so
    the strongest of this episode."""
    if mem.result is None or not mem.result.succeeded:
        return None
    try:
        return Action(mem.result.detail)
    except ValueError:
        return None
