"""The fault model: which faults happen, how often, and what each does (the engine samples it).

Every default rate is cited in docs/simulator.md. The eleven kinds that interrupted Llama 3
pre-training take their rates from that paper's root-cause table (419 unexpected
interruptions in 54 days on 2,048 nodes x 8 H100): rate per node-day =
share x 419 / (2,048 x 54). The other kinds (degradations, tool hangs, boot noise, the
fleet-wide tool breakage) have no published rate; their defaults are labelled assumptions.

`fault` names the member of the seeded `Fault` enum (`gpuvigil.fakes.faults`) that builds
the same fault's readings for the fakes and the layer-1 rules.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from enum import StrEnum

# Llama 3 (Dubey et al. 2024, Table 5): 419 unexpected interruptions, 54 days, 16,384 GPUs.
LLAMA3_INTERRUPTIONS = 419
LLAMA3_NODES = 2048
LLAMA3_DAYS = 54
PER_SHARE = LLAMA3_INTERRUPTIONS / (LLAMA3_NODES * LLAMA3_DAYS) / 100.0  # per node-day per %


class Cause(StrEnum):
    """Root-cause categories, as the Llama 3 table groups them."""

    GPU = "gpu"
    NETWORK = "network"
    HOST = "host"
    MAINTENANCE = "maintenance"  # unplanned host maintenance
    SOFTWARE = "software"  # the paper's "dependency" category (software bugs)
    UNKNOWN = "unknown"
    TOOLING = "tooling"  # our own tools breaking: not in the paper


class Effect(StrEnum):
    """What a fault does to a job running on the node."""

    CRASH = "crash"  # the job dies at once
    HANG = "hang"  # the job stops making progress until a watchdog fires
    DEGRADE = "degrade"  # the gang runs at `slowdown` x its speed
    SILENT = "silent"  # wrong results: found by the job late, or by an active check
    NONE = "none"  # no effect on jobs (boot noise, a hung tool)


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault and its defaults.

    `persistent`: the node stays bad until repaired (hardware); otherwise the fault is
    an event that hits the job on the node and leaves the node healthy.
    `host_down`: the machine stops answering, so the cloud's instance checks see it.
    `fix`: the remediation action that cures it, with the chance that it does; a
    remediation that fails escalates to the next action (ending with REPLACE).
    """

    name: str
    fault: str
    cause: Cause
    effect: Effect
    per_node_day: float
    persistent: bool = True
    host_down: bool = False
    slowdown: float = 1.0
    fix: tuple[tuple[str, float], ...] = (("REPLACE", 1.0),)
    source: str = "assumption"
    calibrated: bool = False  # counted in the Llama 3 calibration

    @property
    def on_machine(self) -> bool:
        """The machine itself has something a repair cures (a hung tool included). A
        missing binary, a bad driver image and boot noise leave a healthy machine: taking
        it out of service for them is a false positive."""
        return self.persistent and bool(self.fix)


def _llama(share_pct: float) -> float:
    return share_pct * PER_SHARE


K = FaultKind
DEFAULT_KINDS: tuple[FaultKind, ...] = (
    # --- the Llama 3 table (shares of 419 unexpected interruptions) ---------------------
    K(
        "gpu_lost",
        "GPU_OFF_BUS",
        Cause.GPU,
        Effect.CRASH,
        _llama(20.1),
        fix=(("REBOOT", 0.5), ("REPLACE", 1.0)),
        source="llama3:faulty-gpu(2/3)",
        calibrated=True,
    ),
    K(
        "nvlink_down",
        "NVLINK_DOWN",
        Cause.GPU,
        Effect.CRASH,
        _llama(10.0),
        fix=(("REBOOT", 0.5), ("REPLACE", 1.0)),
        source="llama3:faulty-gpu(1/3)",
        calibrated=True,
    ),
    K(
        "hbm_ecc",
        "ECC_UNCORRECTABLE",
        Cause.GPU,
        Effect.CRASH,
        _llama(17.2),
        fix=(("RESET_GPU", 0.9), ("REPLACE", 1.0)),
        source="llama3:hbm3",
        calibrated=True,
    ),
    K(
        "sram_ecc",
        "SRAM_ECC",
        Cause.GPU,
        Effect.CRASH,
        _llama(4.5),
        fix=(("RESET_GPU", 0.95), ("REPLACE", 1.0)),
        source="llama3:sram",
        calibrated=True,
    ),
    K(
        "gsp_error",
        "GSP_ERROR",
        Cause.GPU,
        Effect.CRASH,
        _llama(4.1),
        fix=(("REBOOT", 0.9), ("REPLACE", 1.0)),
        source="llama3:gsp",
        calibrated=True,
    ),
    K(
        "sdc",
        "SDC",
        Cause.GPU,
        Effect.SILENT,
        _llama(1.4),
        source="llama3:sdc",
        calibrated=True,
    ),
    K(
        "thermal_fault",
        "HW_SLOWDOWN",
        Cause.GPU,
        Effect.CRASH,
        _llama(1.4),
        source="llama3:thermal-interface+sensor",
        calibrated=True,
    ),
    K(
        "fabric_link",
        "EFA_DOWN",
        Cause.NETWORK,
        Effect.CRASH,
        _llama(8.4),
        fix=(("REBOOT", 0.3), ("REPLACE", 1.0)),
        source="llama3:switch/cable",
        calibrated=True,
    ),
    K(
        "host_maintenance",
        "HOST_DOWN",
        Cause.MAINTENANCE,
        Effect.CRASH,
        _llama(7.6),
        host_down=True,
        fix=(("REBOOT", 1.0),),
        source="llama3:host-maintenance",
        calibrated=True,
    ),
    K(
        "host_failure",
        "HOST_DOWN",
        Cause.HOST,
        Effect.CRASH,
        _llama(5.1),
        host_down=True,
        source="llama3:nic+ssd+psu+chassis+io+cpu+memory",
        calibrated=True,
    ),
    K(
        "software_bug",
        "APP_XID_13",
        Cause.SOFTWARE,
        Effect.CRASH,
        _llama(13.4),
        persistent=False,
        source="llama3:software-bug+dependency",
        calibrated=True,
    ),
    K(
        "nccl_hang",
        "NCCL_HANG",
        Cause.UNKNOWN,
        Effect.HANG,
        _llama(1.7),
        persistent=False,
        source="llama3:nccl-watchdog",
        calibrated=True,
    ),
    K(
        "unlisted",
        "APP_XID_43",
        Cause.UNKNOWN,
        Effect.CRASH,
        _llama(5.1),
        persistent=False,
        source="llama3:rows-not-listed (100% - 94.9%)",
        calibrated=True,
    ),
    # --- no published rate: assumptions (docs/simulator.md says why each) ----------------
    K(
        "thermal_slowdown",
        "THERMAL_SLOWDOWN",
        Cause.GPU,
        Effect.DEGRADE,
        0.3e-3,
        slowdown=0.85,
        fix=(("REBOOT", 0.5), ("REPLACE", 1.0)),
    ),
    K(
        "pcie_degraded",
        "PCIE_DEGRADED",
        Cause.GPU,
        Effect.DEGRADE,
        0.2e-3,
        slowdown=0.9,
        fix=(("REBOOT", 0.7), ("REPLACE", 1.0)),
    ),
    K(
        "efa_missing",
        "EFA_MISSING",
        Cause.NETWORK,
        Effect.DEGRADE,
        0.3e-3,
        slowdown=0.75,
        fix=(("REBOOT", 0.7), ("REPLACE", 1.0)),
    ),
    K("tool_hang", "TOOL_HANG", Cause.TOOLING, Effect.NONE, 0.2e-3, fix=(("REBOOT", 1.0),)),
)
del K

# Not sampled by rate: boot noise follows a reboot, the missing tool comes with a Storm.
BOOT_NOISE = FaultKind("boot_noise", "BOOT_NOISE", Cause.TOOLING, Effect.NONE, 0.0,
                       persistent=False, fix=())  # fmt: skip
TOOL_MISSING = FaultKind("tool_missing", "TOOL_MISSING", Cause.TOOLING, Effect.NONE, 0.0, fix=())
# A bad driver push: healthy GPUs read as lost (GPU_LOST + Xid 79 findings, fatal), a
# storm that looks like hardware; nothing but the rollback cures it.
BAD_DRIVER = FaultKind("bad_driver", "GPU_OFF_BUS", Cause.TOOLING, Effect.NONE, 0.0, fix=())
# A bad driver that really breaks what runs on the GPUs it reaches: jobs crash there (the
# machine itself is fine: nothing but the rollback cures it).
BREAKING_DRIVER = FaultKind("breaking_driver", "GPU_OFF_BUS", Cause.TOOLING, Effect.CRASH, 0.0,
                            fix=())  # fmt: skip
# A new kernel makes the driver print an Xid our catalog does not know (FAILED, INVESTIGATE)
# on healthy machines.
NEW_XID = FaultKind("new_xid", "XID_999", Cause.TOOLING, Effect.NONE, 0.0, fix=())
STORM_KINDS = {"tool": TOOL_MISSING, "driver": BAD_DRIVER, "driver-crash": BREAKING_DRIVER,
               "xid": NEW_XID}  # fmt: skip
# Faults of the whole node, not of one GPU (the `fault` event's component is `node`).
NODE_WIDE = frozenset(
    {"HOST_DOWN", "EFA_DOWN", "EFA_MISSING", "TOOL_HANG", "TOOL_MISSING", "NCCL_HANG"}
)

# A lemon (scenario `lemon`): its fault (Xid 79, the GPU off the bus) returns this long after
# each time the machine is back in service, until the machine is replaced (the case).
LEMON_RETURN_S = 300.0

# Boot noise: benign Xids logged while the driver loads, on this share of boots (assumption).
BOOT_NOISE_PROBABILITY = 0.2


@dataclass(frozen=True)
class Storm:
    """A bad change: an upgrade drops a binary (a new OS image) or ships a bad driver on a
    fraction of the fleet (or of one pool), until the rollback lands. The nodes it reaches
    carry the new image or driver version, as their labels would say."""

    at_s: float = 10 * 86400.0
    fraction: float = 0.25
    fixed_after_s: float = 6 * 3600.0  # the rollback lands after this long
    kind: str = "tool"  # "tool": a binary is missing (fail closed); "driver": GPUs read lost
    pool: bool = False  # True: the fraction of one pool (a per-pool rollout), not the fleet
    batch: int = 0  # nodes per batch of a rolling rollout (0: all at once)
    batch_every_s: float = 0.0  # between batches

    @property
    def change(self) -> tuple[str, str]:
        """The node attribute the upgrade changes, and its new value."""
        return STORM_CHANGES[self.kind]


# What each storm's upgrade changes on the nodes it reaches (sim.fleet.BASE_FACTS before).
STORM_CHANGES = {"tool": ("os-image", "Ubuntu 22.04.5 LTS (2026-01 image)"),
                 "driver": ("driver-version", "560.35.03"),
                 "driver-crash": ("driver-version", "560.35.03"),
                 "xid": ("kernel-version", "5.15.0-1060-aws")}  # fmt: skip


@dataclass(frozen=True)
class Silence:
    """Every agent's reports stop reaching the controller for a while (an API outage, an
    agent rollout gone wrong, a partition): the machines and their jobs are fine."""

    at_s: float
    duration_s: float = 2 * 3600.0


@dataclass
class FaultModel:
    """The kinds in play and a rate multiplier (`scale`), sampled per kind fleet-wide."""

    kinds: tuple[FaultKind, ...] = DEFAULT_KINDS
    scale: float = 1.0
    boot_noise_probability: float = BOOT_NOISE_PROBABILITY
    by_name: dict[str, FaultKind] = field(init=False)

    def __post_init__(self) -> None:
        self.by_name = {k.name: k for k in self.kinds}

    def sample(
        self, seed: object, *, nodes: int, horizon_s: float
    ) -> list[tuple[float, FaultKind, int]]:
        """Onsets of every fault over the horizon: (time, kind, node), sorted by time.

        Each kind is a fleet-wide Poisson process (rate x nodes); onsets land on nodes
        uniformly. Each kind draws from its own stream (`seed`:faults:`name`), so adding,
        removing or rescaling one kind leaves every other kind's faults as they were.
        Cost is proportional to the number of faults, not to the horizon.
        """
        out: list[tuple[float, FaultKind, int]] = []
        days = horizon_s / 86400.0
        for kind in self.kinds:
            rng = kind_stream(seed, kind.name)
            mean = kind.per_node_day * self.scale * nodes * days
            for _ in range(_poisson(rng, mean)):
                out.append((rng.uniform(0.0, horizon_s), kind, rng.randrange(nodes)))
        out.sort(key=lambda e: (e[0], e[2], e[1].name))
        return out

    def gpu(self, rng: random.Random, *, gpus: int) -> int:
        """Which GPU of its node a fault strikes: any of them alike (a node-wide fault,
        such as a dead host or a missing tool, ignores it)."""
        return rng.randrange(gpus)


def kind_stream(seed: object, name: str) -> random.Random:
    """The random stream of one fault kind's onsets under one seed."""
    return random.Random(f"{seed}:faults:{name}")


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw: Knuth for small means, the normal approximation for large ones."""
    if mean <= 0:
        return 0
    if mean > 500:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
