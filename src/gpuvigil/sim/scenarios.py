"""The scenario registry (which layers run, and what goes wrong) and the simulator's
settings (`SimConfig`).

Called by the engine, `sim.run` and the CLI. A scenario switches layers on and may add a
fleet event: a bad change (`storm`, a `sim.faults.Storm`) or a silence of every agent.
Each scenario is one entry of `SCENARIOS`; `gpuvigil simulate` runs them all (the fleet
events unless `--no-storm`). Every timing that is not a layer's own setting lives in
`SimConfig`, each with the reason for its default (docs/simulator.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.sim.faults import Silence, Storm

DAY = 86400.0


@dataclass(frozen=True)
class Scenario:
    """Which layers run. `baseline` is a cloud's own instance checks and job retries."""

    name: str
    layer1: bool  # node checks: faults are seen at the next check and the node cordoned
    layer2: bool  # policy + safety: drain, remediate, validate, budgets, breaker
    layer3: bool  # training: hang watchdog, warm restart, graceful drain at a checkpoint
    layer4: bool  # observability: the active-check schedule (silent corruption)
    summary: str = ""
    attack: str = ""  # sim.adversity: "split-brain" | "api-outage"
    storm: str = ""  # a bad change on day 10 (or a third in): "tool" | "driver" (sim.faults)
    storm_fraction: float = 0.25
    storm_pool: bool = False  # the fraction of one pool, not of the fleet
    silence_s: float = 0.0  # every agent silent this long, from mid-run
    breaker: bool = True  # False: the circuit breaker never trips (the storms' control run)
    wide_budget: bool = False  # a 10% disruption budget (sim.cli.storm_controller)
    lemon: str = ""  # one machine whose fault of this kind returns after every repair
    incident: str = ""  # sim.incidents: "rack" | "switch" | "flapping" | "held" | "skew"
    storm_batch: int = 0  # a rolling rollout: this many nodes per batch ...
    storm_batch_every_s: float = 0.0  # ... this far apart
    storm_fixed_after_s: float = 6 * 3600.0  # the rollback lands this long after it began
    # layer 2's two per-workload guards (issue #23), on wherever the controller runs except
    # in `platform`, which shows the controller without them
    gpu_isolation: bool = True  # one bad GPU costs one GPU (`platform.isolation`)
    capacity_gate: bool = True  # no repair takes serving below its demand (`platform.capacity`)

    @property
    def fleet_event(self) -> bool:
        return bool(self.storm or self.silence_s or self.lemon or self.incident)

    def storm_for(self, days: float) -> Storm | None:
        if not self.storm:
            return None
        return Storm(at_s=min(10.0, days / 3) * DAY, fraction=self.storm_fraction,
                     kind=self.storm, pool=self.storm_pool, batch=self.storm_batch,
                     batch_every_s=self.storm_batch_every_s,
                     fixed_after_s=self.storm_fixed_after_s)  # fmt: skip

    def silence_for(self, days: float) -> Silence | None:
        return Silence(at_s=days / 2 * DAY, duration_s=self.silence_s) if self.silence_s else None


_FULL = (True, True, True, True)
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("baseline", False, False, False, False,
                 "cloud instance checks only: dead machines replaced, failed jobs retried"),
        Scenario("node", True, False, False, False, "layer 1: node checks + cordon"),
        Scenario("platform", True, True, False, False,
                 "layers 1-2: + policy, safety, remediation (whole-node, no capacity gate)",
                 gpu_isolation=False, capacity_gate=False),
        Scenario("full", *_FULL, "layers 1-4: + training resilience, observe; per-GPU "
                 "isolation and the serving capacity gate"),
        Scenario("storm+breaker", *_FULL, "an upgrade drops a binary on 25% of the fleet",
                 storm="tool", wide_budget=True),
        Scenario("storm-no-breaker", *_FULL, "the same, the breaker never trips",
                 storm="tool", breaker=False, wide_budget=True),
        Scenario("driver-storm+breaker", *_FULL,
                 "a bad driver makes healthy GPUs read lost on 25% of the fleet",
                 storm="driver", wide_budget=True),
        Scenario("driver-storm-no-breaker", *_FULL, "the same, the breaker never trips",
                 storm="driver", breaker=False, wide_budget=True),
        Scenario("pool-rollout", *_FULL, "a bad driver on 75% of one pool (default budget)",
                 storm="driver", storm_fraction=0.75, storm_pool=True),
        Scenario("silence", *_FULL, "every agent silent for 2 h mid-run (an API outage)",
                 silence_s=2 * 3600.0),
        Scenario("lemon", *_FULL,
                 "one machine's Xid 79 returns 5 min after each time it is back in service",
                 lemon="gpu_lost"),
        Scenario("rack-fault", *_FULL, "EFA down on the 4 nodes of one rack within 30 s",
                 incident="rack"),
        Scenario("switch-fault", *_FULL,
                 "EFA down on the 16 nodes under one leaf switch within 30 s", incident="switch"),
        Scenario("slow-rollout", *_FULL,
                 "the bad driver rolled to 2 nodes every 11 min (128 nodes in 11.7 h)",
                 storm="driver", storm_batch=2, storm_batch_every_s=660.0,
                 storm_fixed_after_s=18 * 3600.0),
        Scenario("staggered-new-xid", *_FULL,
                 "a new kernel's unknown Xid (INVESTIGATE) on one healthy node every 30 s",
                 storm="xid", storm_batch=1, storm_batch_every_s=30.0),
        Scenario("flapping", *_FULL, "one machine's fatal Xid 79: 60 s on, 540 s off, 12 h",
                 incident="flapping"),
        Scenario("clock-skew", *_FULL,
                 "every agent's clock 6 s ahead; a real GPU lost a third in", incident="skew"),
        Scenario("fault-while-held", *_FULL,
                 "the bad-driver storm, and a real GPU lost on a node it reached 30 min in",
                 storm="driver", incident="held"),
        Scenario("split-brain", *_FULL,
                 "two controllers 20 s apart; the leader stalls mid-pass every 6 h",
                 attack="split-brain"),
        Scenario("api-outage", *_FULL, "the API server down 30 min mid-run",
                 attack="api-outage"),
    )
}  # fmt: skip
LAYERS = ("baseline", "node", "platform", "full")  # the four layer scenarios


class SimConfig(StrictModel):
    """Timings of the simulated world (seconds). Defaults and their reasons:"""

    gpus_per_node: int = Field(8, ge=1, description="H100/H200/A100 servers carry 8 GPUs.")
    pool_nodes: int = Field(
        64,
        ge=1,
        description="Nodes per pool (node group or partition: the disruption "
        "budget's unit and a rollout's): a 512-node fleet has 8 (assumption).",
    )
    rack_nodes: int = Field(
        4, ge=1, description="8-GPU servers per rack: ~10 kW each in ~40 kW racks (assumption)."
    )
    instance_check_s: float = Field(
        300.0,
        description="Cloud instance status checks run every minute; an instance is marked "
        "impaired after a few failed checks: ~5 min until replacement starts.",
    )
    human_detect_mean_s: float = Field(
        12 * 3600.0,
        description="Without node checks, a bad but reachable machine is found when someone "
        "triages failed jobs: half a working day on average (assumption).",
    )
    human_repair_mean_s: float = Field(
        8 * 3600.0,
        description="Hands-on repair once a human owns a node (ticket, swap, re-image): "
        "a shift (assumption).",
    )
    checkpoint_bytes_per_rank: float = Field(
        346e6,
        ge=0,
        description="Checkpoint bytes each rank reads on a restart, the size term of the "
        "restore phase (sim/restart_phases.yaml): a 405B-parameter model's bf16 weights, "
        "fp32 master weights and two fp32 Adam moments (14 B a parameter) over 16,384 "
        "ranks (assumption: Meta does not publish its checkpoint's size).",
    )
    memtier_copy_bytes_per_s: float = Field(
        2.25e9,
        gt=0,
        description="How fast one rank's in-memory tier copy holds the training thread, in "
        "checkpoint bytes a second: the snapshot into a host buffer (the hash, the tmpfs "
        "writes and the peer exchange run on the tier's own thread). bench/memtier.py, 2 "
        "ranks on gloo, 200 MB a rank: the median training-thread stall, 0.093 s "
        "(1.8-2.7 GB/s; 2026-12-07, 2-core machine). The whole copy took 0.75-0.91 s there: "
        "far less than the copy interval, so the next save never waits for it; were it "
        "longer than the interval, the stall would be that wait.",
    )
    memtier_restore_bytes_per_s: float = Field(
        100e6,
        gt=0,
        description="How fast a restore from the in-memory tier reads a rank's copy (read, "
        "verify, maybe fetch from the peer, unpack, all on the training thread): the rate "
        "the synchronous copy of the same work had in bench/memtier.py (68-105 MB/s, 2-core "
        "machine, load 3-5; 2026-12-07). Not measured on its own.",
    )
    nccl_timeout_s: float = Field(
        600.0, description="PyTorch's default collective timeout (10 min) ends a hung job."
    )
    step_p99_s: float = Field(
        10.0,
        description="p99 step time of a large job; layer 3's watchdog derives its hang "
        "timeout from it (factor x p99, training.config.WatchdogConfig).",
    )
    sdc_job_detect_s: float = Field(
        6 * 3600.0,
        description="A job notices silent corruption (loss spike, NaN) hours later (assumption).",
    )
    active_check_interval_s: float = Field(
        86400.0, description="Layer 4 schedules a short active check on every node daily."
    )
    reset_gpu_s: float = Field(300.0, description="nvidia-smi -r plus checks: minutes.")
    reboot_s: float = Field(1200.0, description="An 8-GPU server takes 10-20 min to reboot.")
    replace_s: float = Field(
        3600.0, description="Cloud: terminate + launch a new instance + preflight: ~1 h."
    )
    replacement_faulty_rate: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Share of replacement machines that arrive with a hardware fault, "
        "drawn as the fleet's own persistent hardware faults are (by their rates); the "
        "real preflight verdict must catch it. 0 unless set: no published figure "
        "(assumption).",
    )
    validate_s: float = Field(
        600.0, description="Preflight (active checks) before a remediated node takes work."
    )
    requeue_delay_s: float = Field(
        60.0, description="Scheduler back-off before a failed job is placed again."
    )
    pod_failure_backoff_s: float = Field(
        10.0, description="Where the survivors stay (in-process restart), the lost rank's "
        "pod is recreated by the Job controller: a failed pod after its back-off, 10 s "
        "(doubling per failure in a row, reset once none fail: the Kubernetes Job docs; the "
        "real 1.20.2 controller recreated a first failure at once and a second in a row "
        "after 10.2 s, tests/integration/controller/test_spares_kubernetes.py: 10 s is the later "
        "versions' first delay); a drained (deleted) pod at once (0.02 s measured there), "
        "which the measured `survivors_kept` reschedule phase covers.",
    )  # fmt: skip
    remediation_retry_s: float = Field(
        600.0, description="How long a held remediation (budget, breaker) waits to retry."
    )
    gpus_per_replica: int = Field(
        2, ge=1, description="A serving replica's GPUs: a 70B model in FP8 on 2 H100s "
        "(tensor parallel 2; assumption).",
    )  # fmt: skip
    replica_start_s: float = Field(
        600.0, description="A new serving replica is Ready once its container has started "
        "and its weights are loaded (~140 GB from the node's cache): ~10 min (assumption).",
    )  # fmt: skip
    serving_low: float = Field(
        0.45, ge=0, le=1, description="Serving demand at night, as a share of the serving "
        "pool's replica slots (assumption: a day's peak about 1.7x its trough).",
    )  # fmt: skip
    serving_high: float = Field(
        0.75, ge=0, le=1, description="Serving demand at the day's peak, the same share: the "
        "pool keeps a quarter spare (assumption).",
    )  # fmt: skip
