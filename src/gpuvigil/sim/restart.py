"""Layer-3 restart semantics inside the simulator, taken from the code that has them (called
by `sim.lifecycle` and `sim.episodes`).

Every interruption ends the job's processes with the exit code the real code exits with
(`exit_code`, from the one table `core.exit_codes`), and spends the job's retry budget as
the shipped Job's podFailurePolicy says (`counts_against_job`: the policy is
`core.exit_codes.pod_failure_policy`, judged by `core.exit_codes.policy_action`, Kubernetes'
own algorithm). With layer 3 (`full`): a hang ends at the training watchdog's timeout
(`training.watchdog.derive_timeout`) with its exit code, torchrun restarts the group in
place (`restart_cost_s(mode="in_place")`) when no node was taken away, and where the job
runs `training.inprocess` a crash restarts only the lost pods (`keeps_survivors`). A
restart's cost is the lab's measured phases scaled to the job's size (`sim.restart_model`).
What the simulator models instead of running code (a crash's exit code, PyTorch's
collective timeout) is listed in docs/simulator.md ("What the simulator assumes"); a test
keeps that honest.
"""

from __future__ import annotations

import signal
from enum import StrEnum

from gpuvigil.core import exit_codes
from gpuvigil.sim import restart_model
from gpuvigil.sim.jobs import Job
from gpuvigil.sim.scenarios import SimConfig
from gpuvigil.training import tier_choice
from gpuvigil.training.config import DrainConfig, WatchdogConfig
from gpuvigil.training.watchdog import derive_timeout


class Stop(StrEnum):
    """Why a job's processes stopped."""

    CRASH = "crash"  # the program died: a failed GPU's CUDA error, or a bug
    HANG = "hang"  # a collective never completed; something ended the step
    EVICTED = "evicted"  # gpuvigil's controller drained the node (DisruptionTarget, SIGTERM)
    TAKEN = "taken"  # a person or the cloud took the node (SIGTERM, no DisruptionTarget)


def restart_cost_s(
    config: SimConfig,
    *,
    nodes: int,
    ranks: int,
    mode: restart_model.Mode = "cold",
    lost_pods: int = 0,
    from_memory: bool = False,
) -> float:
    """Seconds from a (re)start to the job's first productive step, for a gang of `nodes`
    one-pod-per-node nodes and `ranks` ranks (`sim.restart_model`): every measured phase
    for a cold start; the in-place phases when torchrun restarts the group on its own
    nodes; the lost pods' phases where the survivors kept their processes. A restore from
    the in-memory tier reads at its own rate (`memtier_restore_bytes_per_s`), not DCP's."""
    rate = config.memtier_restore_bytes_per_s if from_memory else None
    return restart_model.load().cost_s(
        pods=nodes, ranks=ranks, ckpt_bytes=config.checkpoint_bytes_per_rank, mode=mode,
        lost_pods=lost_pods, read_bytes_per_s=rate,
    )  # fmt: skip


def keeps_survivors(
    stop: Stop, *, layer3: bool, in_process: bool, graceful: bool = False, memtier: bool = False
) -> bool:
    """Do the surviving ranks keep their processes (`training.inprocess`, on with
    `training.restart.in_process`)? Its wrapper re-forms the group in the same processes
    when the training function raised what a rank sees when a peer is gone (gloo's closed
    connection: `journal.classify`'s victim), which is what another rank's crash (its
    process, its GPU, its machine) gives every survivor. A drain where the in-memory tier
    holds every drained rank's copy on a rank that stays (`Run.keeps_survivors`:
    `memtier` here is `memory_tier_holds` over the drained nodes, `drain.peers_stay`'s
    rule): every rank saves the tier at the agreed step and only the signalled ranks exit
    89, so the others are survivors of a lost peer too. A hang ends
    every rank in the watchdog's exit 86, and a drain without the tier every rank in 89:
    the gang restarts. Where no free node can take a lost machine's place, the survivors
    wait `join_timeout_s` and exit 93 (the caller's fallback: a gang restart)."""
    if not (layer3 and in_process):
        return False
    return stop is Stop.CRASH or (stop is Stop.EVICTED and graceful and memtier)


def hang_timeout_s(
    config: SimConfig, *, layer3: bool, watchdog: WatchdogConfig | None = None
) -> float:
    """How long a hung job sits before something ends it: PyTorch's collective timeout, or
    the training watchdog's own timeout over a run of steps at the p99 step time."""
    if not layer3:
        return config.nccl_timeout_s
    wd = watchdog or WatchdogConfig()
    return derive_timeout([config.step_p99_s] * wd.warmup_steps, wd)


def exit_code(
    stop: Stop, *, layer3: bool, graceful: bool = False, software: bool = True
) -> int | None:
    """The exit code the job's workers end with, where the code that ends them sets one
    (`core.exit_codes`): layer 3's hang watchdog exits HANG, its drain (finish the step, save
    on SIGTERM) DRAINED, and a program that fails on healthy hardware its own error (1).
    None where the workers are killed (PyTorch's collective timeout aborts them, a SIGTERM
    nothing handles, a machine that dies): only other evidence can say why."""
    if stop is Stop.HANG:
        return exit_codes.HANG if layer3 else None
    if stop in (Stop.EVICTED, Stop.TAKEN):
        return exit_codes.DRAINED if graceful else None
    return 1 if software else None


def drain_keeps_work(*, layer3: bool) -> bool:
    """Does an evicted job save before it leaves? Where training's drain is on (its default,
    `training.drain`): on SIGTERM the ranks finish the step, save and exit DRAINED. The
    save is assumed to fit the pod's grace period (assumption 5)."""
    return layer3 and DrainConfig().enabled


def counts_against_job(stop: Stop, code: int | None, *, layer2: bool) -> bool:
    """Does this interruption use up one of the job's retries? Under gpuvigil (layer 2 on)
    the job runs with the shipped podFailurePolicy: a pod the controller evicted carries
    DisruptionTarget, and the table's IGNORE codes are spared; otherwise every failure
    counts. Workers killed without a code of their own read as SIGKILL's."""
    if not layer2:
        return True
    status = exit_codes.pod_status(
        exit_codes.SIGNAL_BASE + signal.SIGKILL if code is None else code,
        disrupted=stop is Stop.EVICTED,
        container="trainer",
    )
    policy = exit_codes.pod_failure_policy(container="trainer")
    return exit_codes.policy_action(policy, status) != "Ignore"


def restarts_in_place(stop: Stop, *, node_fine: bool, layer3: bool) -> bool:
    """torchrun (`--max-restarts`, made reliable by `training.launch`) restarts the group
    on the same nodes when the program failed on nodes that are fine (a bug, a hang); a
    node fault or a node taken away needs the scheduler."""
    return layer3 and node_fine and stop in (Stop.CRASH, Stop.HANG)


def stop_of(reason: str, *, hang: bool) -> Stop:
    """The engine's interruption reasons, as what stopped the processes."""
    if reason == "drain: controller":
        return Stop.EVICTED
    if reason.startswith("drain") or reason == "repair":
        return Stop.TAKEN
    return Stop.HANG if hang else Stop.CRASH


def arm_memtier(job: Job, config: SimConfig, *, every_steps: int, step_s: float) -> None:
    """Give a job training's in-memory tier: a copy every `every_steps` steps, each holding
    the training thread for the checkpoint's bytes at the measured stall rate (the
    snapshot; the rest of the copy runs on the tier's thread), which the job's speed pays."""
    job.memtier_s = every_steps * step_s
    copy_s = config.checkpoint_bytes_per_rank / config.memtier_copy_bytes_per_s
    job.copy_speed = job.memtier_s / (job.memtier_s + copy_s)


def memory_tier_holds(job: Job, lost_nodes: list[int]) -> bool:
    """Does the in-memory tier survive losing these of the job's nodes (by position in the
    gang: their processes and their host memory)? `training.tier_choice`'s rule: every
    lost rank's peer, one node of ranks away, must still be up."""
    if job.memtier_s <= 0:
        return False
    per = job.gpus_per_node
    lost = [n * per + r for n in lost_nodes for r in range(per)]
    offset = tier_choice.peer_offset(job.gpus, per)
    return tier_choice.survives(lost, job.gpus, offset)
