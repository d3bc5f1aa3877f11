"""The controller's per-node values: the record stored on the node, and `NodeView` (what a
cluster adapter reads about one node). The policy states are core's (`core.states.State`,
re-exported here).

Pure data, no I/O: the policy (`platform.policy`) reads these, the cluster adapters
(`platform.clusters.*`) build and store them, the simulator and `gpuvigil nodes` show them.

The record lives on the node itself (Kubernetes annotation `STATE_ANNOTATION`; Slurm: the
node's Comment field, with `Record.tag()` as the drain reason), so a controller killed at
any moment resumes from it: every field needed to continue a step without repeating it
(the request id, the boot id seen when a reboot was asked for) is written before the step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuvigil.core import states
from gpuvigil.core.findings import Action, Status
from gpuvigil.core.states import State
from gpuvigil.core.wire import DOMAIN, HealthSummary

STATE_ANNOTATION = f"{DOMAIN}/state"
INTENT_ANNOTATION = f"{DOMAIN}/intent"  # the controller's latest decision (`Intent`)
TAG_PREFIX = states.TAG_PREFIX  # Slurm drain reasons written by gpuvigil start with this
HISTORY_LIMIT = 12  # transitions kept on the node (annotation size stays ~2 KB)
# The node label naming a node's pool (budgets, eviction grace), unless `safety.pool_label`
# names another; a node without it is in pool DEFAULT_POOL.
POOL_LABEL = f"{DOMAIN}/pool"
DEFAULT_POOL = "default"

# The remediation ladder: each step is tried once per episode, in this order.
LADDER: tuple[Action, ...] = (Action.RESET_GPU, Action.REBOOT, Action.REPLACE)


class Transition(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    at: datetime
    to: State
    reason: str = ""
    step: Action | None = None


EPISODE_LIMIT = 16  # episodes kept per machine (each ~150 bytes on the node)


class Episode(BaseModel):
    """One time a machine left HEALTHY, kept in its history (`Record.episodes`): what it
    showed, which steps ran, and how it ended: `cured:<STEP>` (validated after that
    step), `cleared` (gone by itself, no step), `quarantined`, `gpu-isolated` (one GPU
    taken out until replaced, `platform.isolation`); `released_by` who ended a
    quarantine; `gpu` the uuid of the one GPU the episode was confined to ("" for the
    whole node's)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    start: datetime
    end: datetime
    codes: tuple[str, ...] = ()
    steps: tuple[Action, ...] = ()
    outcome: str = ""
    released_by: str = ""
    gpu: str = ""


class Record(BaseModel):
    """gpuvigil's memory of one node, stored on the node (never in the controller)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    v: int = 1
    state: State = State.HEALTHY
    since: datetime | None = None  # when `state` began
    # When the node last left HEALTHY (None while HEALTHY): the clock of "out of service
    # too long", which later state changes in the same episode do not restart.
    left_service: datetime | None = None
    reason: str = ""  # for people: why the node is in this state
    code: str = ""  # the finding code that drove the latest transition
    fatal: bool = False  # the episode began with a fatal finding
    step: Action | None = None  # the ladder step in progress (REMEDIATING) or last taken
    request_id: str = ""  # id of the request for `step`: the agent acts once per id
    issued: str = ""  # the request id the controller confirmed it sent (not re-sent after)
    boot_id: str = ""  # the node's boot id when a step was requested (verifies a reboot)
    provider_id: str = ""  # the machine's provider id when a step was requested (a REPLACE
    # counts only when another machine stands behind the node: docs/controller.md)
    replaces: str = ""  # this new machine answers the replacement of that node (it counts
    # when this one passes validation)
    # The circuit breaker's signature (check, code, attribute, value) that holds this node's
    # findings: a restarted controller reopens it from the nodes that still show it.
    hold: tuple[str, ...] = ()
    failures: int = 0  # failed steps in this episode (quarantine after K)
    last_step_done_at: datetime | None = None  # escalation: did the problem come back soon?
    last_action_at: datetime | None = None  # per-node cooldown
    # The validation (its `since`) for which a fresh preflight run is under way: a new
    # node's first preflight pod, or the run the controller triggered (`Cluster.revalidate`)
    # after a step or a release. Stored so a restarted controller does not trigger it again.
    preflight_for: datetime | None = None
    history: tuple[Transition, ...] = ()
    # The machine's memory (platform.policy's lemon, flapping and useless-step rules):
    # the provider id (or serial) it belongs to, its past episodes, and the steps of
    # this one. A release wipes none of it; the controller carries it over a rename.
    machine: str = ""
    episodes: tuple[Episode, ...] = ()
    tried: tuple[Action, ...] = ()

    @property
    def in_budget(self) -> bool:
        """Holds a disruption-budget slot: from drain start until back in service (or
        quarantined), including the validation after a step."""
        if self.state is State.VALIDATING:
            return self.step is not None
        return self.state.disruptive

    def tag(self) -> str:
        """Short form for Slurm drain reasons and logs: `gpuvigil:<state>:<step>:<code>`."""
        return states.tag(self.state, self.step.value if self.step else None, self.code)

    def encode(self) -> str:
        return self.model_dump_json(exclude_defaults=True)

    def moved(self, to: State, *, at: datetime, reason: str, **changes: object) -> Record:
        """A copy in state `to` (history appended); same-state calls only apply `changes`."""
        if to is self.state:
            return self.model_copy(update=changes)
        hist = (*self.history, Transition(at=at, to=to, reason=reason, step=changes.get("step")))
        update: dict[str, object] = {
            "state": to,
            "since": at,
            "reason": reason,
            "history": hist[-HISTORY_LIMIT:],
        }
        if to is State.HEALTHY:
            update["left_service"] = None
        elif self.state is State.HEALTHY or self.left_service is None:
            update["left_service"] = self.out_of_service_since() or at
        update.update(changes)
        return self.model_copy(update=update)

    def out_of_service_since(self) -> datetime | None:
        """When this episode out of service began; None while HEALTHY. A record stored
        before `left_service` existed: the start of the trailing non-HEALTHY run of its
        history (later than the truth when the history was cut, never earlier)."""
        if self.state is State.HEALTHY:
            return None
        if self.left_service is not None:
            return self.left_service
        start = self.since
        for t in reversed(self.history):
            if t.to is State.HEALTHY:
                break
            start = t.at
        return start


class Intent(BaseModel):
    """What the controller last decided for a node, published on the node for people
    (`gpuvigil nodes`, `gpuvigil explain`); the policy never reads it. A dry-run controller
    also keeps there the record it would have stored (`record`), and decides from it, so
    it follows the live controller's path and `gpuvigil nodes` shows that path."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    at: datetime
    dry_run: bool = False
    state: State = State.HEALTHY  # the state decided (dry run: that it would be in)
    reason: str = ""
    next: str = ""  # what it does (would do) next, in words
    held: str = ""  # a disruption the node needs that safety held back: why
    held_by: str = ""  # budget | breaker | capacity | cooldown | stale | rate | ""
    record: Record | None = None  # dry run only: the record it would have stored

    def encode(self) -> str:
        return self.model_dump_json(exclude_defaults=True)

    def same(self, other: Intent | None) -> bool:
        """The same decision, whenever it was taken (a re-publish would say nothing new)."""
        return other is not None and self.model_copy(update={"at": other.at}) == other


def decode_intent(text: str | None) -> Intent | None:
    """Intent from its stored JSON; None for absent or garbage (never raises)."""
    if not text:
        return None
    try:
        return Intent.model_validate(json.loads(text))
    except (ValueError, ValidationError, TypeError):
        return None


def episode_start(record: Record | None) -> datetime | None:
    """When the node last left HEALTHY (None while it is HEALTHY)."""
    return None if record is None else record.out_of_service_since()


def decode_record(text: str | None) -> Record | None:
    """Record from its stored JSON; None for absent or garbage (never raises). Records are
    immutable, so one decoded per distinct text is shared: a controller re-reads the same
    records pass after pass."""
    if not text:
        return None
    return _decode_record(text)


@lru_cache(maxsize=16384)
def _decode_record(text: str) -> Record | None:
    try:
        return Record.model_validate(json.loads(text))
    except (ValueError, ValidationError, TypeError):
        return None


def parse_tag(text: str | None) -> tuple[State, Action | None, str] | None:
    """`gpuvigil:<state>:<step>:<code>` (`core.states.tag`) -> (state, step, code); None
    when not ours or garbage."""
    got = states.parse_tag(text)
    if got is None:
        return None
    state, step, code = got
    try:
        return state, None if step is None else Action(step), code
    except ValueError:
        return None


def pool_of_labels(
    labels: Mapping[str, str], *, label: str = POOL_LABEL, default: str = DEFAULT_POOL
) -> str:
    """A node's pool from its labels: the value of `label` (pass the configured
    `safety.pool_label`); `default` when the node has none (or an empty one)."""
    return labels.get(label) or default


@dataclass(frozen=True)
class AgentResult:
    """The agent's answer to a remediation request (`core.wire.RESULT_ANNOTATION`)."""

    request_id: str
    succeeded: bool
    at: datetime | None = None
    detail: str = ""


@dataclass(frozen=True)
class Preflight:
    """The latest preflight verdict for the node (k8s: the exit of the preflight pod the
    controller started, `clusters.k8s_preflight`)."""

    passed: bool
    at: datetime
    summary: str = ""
    # The validation (its record's `since`) the run was started for, where the run says so:
    # such a run is that validation's own, however skewed the clock that dated either.
    for_since: datetime | None = None


@dataclass(frozen=True)
class NodeView:
    """One node as a cluster adapter read it, at one moment. Built by `clusters.*`.

    `health` is None when the agent's summary is absent or unreadable (`health_error`
    says which); `record` is None when gpuvigil has stored nothing (a new node) or what is
    stored is unreadable (`record_error`). `blocked_by_others` names every block that is
    not gpuvigil's (a cordon, another tool's taint, a Slurm drain with a foreign reason):
    gpuvigil never lifts those.
    """

    name: str
    pool: str = DEFAULT_POOL  # `pool_of_labels(labels, label=<the configured pool_label>)`
    labels: Mapping[str, str] = field(default_factory=dict)
    health: HealthSummary | None = None
    health_error: str | None = "absent"  # None | "absent" | "unreadable"
    heartbeat_at: datetime | None = None
    record: Record | None = None
    record_error: str | None = None
    blocked_by_us: bool = False
    blocked_by_others: tuple[str, ...] = ()
    unvalidated: bool = False  # carries the gpuvigil.io/unvalidated taint (a new node)
    running: int = 0  # pods / jobs running on it (work a drain would move)
    # False where the adapter did not count this node's work this pass (Kubernetes lists
    # the pods of DRAINING, QUARANTINED and spare nodes only): `running` is then 0 but
    # unknown, and the node is never counted as room for moved work (`safety.Gate`).
    running_known: bool = True
    preflight: Preflight | None = None
    agent_result: AgentResult | None = None
    boot_id: str = ""
    provider_id: str = ""  # the machine behind the node (k8s spec.providerID), if known
    version: str = ""  # the adapter's optimistic-concurrency token (resourceVersion)
    preflight_supported: bool = True  # False where the cluster has no preflight channel
    replace_supported: bool = True  # False where nothing can replace a machine (no hook)
    # Facts about the node other than its labels that the circuit breaker groups findings
    # by (k8s nodeInfo: kernel-version, os-image; Slurm: features, kernel-version).
    attributes: Mapping[str, str] = field(default_factory=dict)
    intent: Intent | None = None  # the controller's published decision (INTENT_ANNOTATION)
    intent_supported: bool = True  # False where the cluster has no field to publish it in
    # Per-GPU isolation (`platform.isolation`): the GPUs the node has and the ones its
    # scheduler may still hand out (k8s `nvidia.com/gpu` capacity and allocatable: the
    # device plugin takes an unhealthy GPU out of allocatable); None where unknown. And
    # the stored isolation record (`isolation.ISOLATION_ANNOTATION`), as written.
    gpu_capacity: int | None = None
    gpu_allocatable: int | None = None
    isolation_text: str | None = None
    # A hot spare (`platform.spares`): kept idle for gang jobs' lost ranks (k8s: the
    # `gpuvigil.io/spare` label and taint; Slurm: in the spare reservation).
    spare: bool = False

    @property
    def blocked_by_someone_else(self) -> bool:
        return bool(self.blocked_by_others)

    def heartbeat_age_s(self, now: datetime) -> float | None:
        if self.heartbeat_at is None:
            return None
        return max(0.0, (now - self.heartbeat_at).total_seconds())

    @property
    def failed(self) -> bool:
        return self.health is not None and self.health.status is Status.FAILED
