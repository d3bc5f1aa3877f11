"""The one table of a training worker's exit codes: the code, what it means, who is charged.

Training exits with these codes (`gpuvigil.training`), attribution charges a failure by
them (`gpuvigil.observe.attribution`), the simulator ends its jobs with them, and the shipped
Kubernetes Job `podFailurePolicy` (`deploy/kubernetes/examples/`) spares the ones whose
`retry` is `IGNORE`. docs/training.md lists the same table; a test keeps the two in step.

gpuvigil's own codes lie outside 0-2 (Python's), 64-78 (sysexits) and 126-165 (the shell's
and 128+signal), so a job log or torchrun's per-worker failure summary names the cause.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Charged(StrEnum):
    """Who a failure is charged to: the one cause vocabulary of every layer. An exit code's
    charge, the `cause` of an exit record, a `job.restart` and a failed `job.end`
    (`training.lifecycle`, which keeps what was seen, `frozen`, `victim`, `drained`..., as
    its `kind`, a detail under the cause, never a cause of its own), and the cause
    attribution names (`observe.attribution`). Listed in the order reports show them."""

    NONE = "none"  # success
    NODE = "hardware"  # the machine it ran on: its agent reports it unhealthy, or cannot tell
    NETWORK = "network"  # the fabric between the machines (attribution's evidence says so)
    STORAGE = "storage"  # checkpoints could not be written, or none could be verified
    HANG = "hang"  # no step completed in time: a peer, the network or the program
    USER = "user_code"  # the job's own program
    TOOLING = "tooling"  # our own tools broke (a hung nvidia-smi) while the GPUs answered
    DRAIN = "drain"  # the platform took the node away and the job left cleanly
    UNKNOWN = "unknown"  # killed by a signal, or no cause recorded: only evidence can say


# The causes a failure can be charged to (every one but success), in report order.
FAILURES: tuple[Charged, ...] = tuple(c for c in Charged if c is not Charged.NONE)


class Retry(StrEnum):
    """What a retry policy does with it (a Job's podFailurePolicy action)."""

    COUNT = "Count"  # uses up one of the job's retries
    IGNORE = "Ignore"  # not the job's fault: retried without counting
    FAIL = "FailJob"  # retrying cannot help


@dataclass(frozen=True)
class ExitCode:
    code: int
    name: str
    meaning: str
    charged: Charged
    retry: Retry


SUCCESS = 0
HANG = 86
NODE_UNHEALTHY = 87
NODE_STATE_UNKNOWN = 88
DRAINED = 89
CHECKPOINT_FAILED = 90
NO_VERIFIED_CHECKPOINT = 91
NOT_RESUMABLE = 92
RANK_NOT_REPLACED = 93

TABLE: dict[int, ExitCode] = {
    e.code: e
    for e in (
        ExitCode(SUCCESS, "SUCCESS", "the job finished", Charged.NONE, Retry.COUNT),
        ExitCode(
            HANG,
            "HANG",
            "hang watchdog: no step completed within the timeout",
            Charged.HANG,
            # Counted: a program that deadlocks itself must not retry forever.
            Retry.COUNT,
        ),
        ExitCode(
            NODE_UNHEALTHY,
            "NODE_UNHEALTHY",
            "health gate: this node is marked unhealthy by the gpuvigil agent",
            Charged.NODE,
            Retry.IGNORE,
        ),
        ExitCode(
            NODE_STATE_UNKNOWN,
            "NODE_STATE_UNKNOWN",
            "health gate: this node's gpuvigil state is missing, stale or unreadable",
            Charged.NODE,
            Retry.IGNORE,
        ),
        ExitCode(
            DRAINED,
            "DRAINED",
            "drained: stopped on SIGTERM after saving a checkpoint",
            Charged.DRAIN,
            Retry.IGNORE,
        ),
        ExitCode(
            CHECKPOINT_FAILED,
            "CHECKPOINT_FAILED",
            "checkpoints failed to save too many times in a row",
            Charged.STORAGE,
            Retry.COUNT,
        ),
        ExitCode(
            NO_VERIFIED_CHECKPOINT,
            "NO_VERIFIED_CHECKPOINT",
            "checkpoints exist but none could be verified; the job refuses to start again "
            "at step 0 (checkpoint.allow_fresh_start / --allow-fresh-start overrides)",
            Charged.STORAGE,
            # Retrying reads the same damaged folders: a person repairs them or allows a
            # fresh start.
            Retry.FAIL,
        ),
        ExitCode(
            NOT_RESUMABLE,
            "NOT_RESUMABLE",
            "the training refuses to start: its data loader cannot resume mid-epoch exactly "
            "(Lightning: Resilience(allow_inexact_resume=True) overrides)",
            Charged.USER,
            # The same script builds the same loader on every retry: a person changes it.
            Retry.FAIL,
        ),
        ExitCode(
            RANK_NOT_REPLACED,
            "RANK_NOT_REPLACED",
            "in-process restart: a lost rank's replacement never joined the next generation "
            "within restart.join_timeout_s; the survivors exit so a whole-job restart can take "
            "over",
            # The lost rank's machine is the likely cause, but only its own evidence (its
            # node's agent) can say; the survivors only saw it go.
            Charged.UNKNOWN,
            # Counted: a whole-job restart (today's recovery) may find the capacity again.
            Retry.COUNT,
        ),
    )
}

SIGNAL_BASE = 128  # a shell reports death by signal N as 128 + N


def lookup(code: int) -> ExitCode:
    """Any exit status: the table's entry, a death by signal, or the program's own error."""
    known = TABLE.get(code)
    if known is not None:
        return known
    if code < 0 or code > SIGNAL_BASE:  # Popen gives -N, a shell 128 + N
        num = -code if code < 0 else code - SIGNAL_BASE
        try:
            sig = signal.Signals(num).name
        except ValueError:
            sig = f"signal {num}"
        return ExitCode(code, sig, f"killed by {sig}", Charged.UNKNOWN, Retry.COUNT)
    return ExitCode(code, "ERROR", "the program exited with an error", Charged.USER, Retry.COUNT)


def charged(code: int) -> Charged:
    return lookup(code).charged


def spared(retry: Retry = Retry.IGNORE) -> tuple[int, ...]:
    """The codes a retry policy treats this way, sorted (for podFailurePolicy rules)."""
    return tuple(sorted(c for c, e in TABLE.items() if c != SUCCESS and e.retry is retry))


def pod_failure_policy(*, container: str | None = None) -> dict[str, object]:
    """A Kubernetes Job's `podFailurePolicy` from this table: a pod the platform disrupted
    (the `DisruptionTarget` condition gpuvigil's drain sets) and the codes whose `retry` is
    IGNORE are retried without using up `backoffLimit`; FAIL codes end the job. The shipped
    example (`deploy/kubernetes/examples/training-job.yaml`) holds exactly this."""

    def on_codes(codes: tuple[int, ...]) -> dict[str, object]:
        req: dict[str, object] = {"operator": "In", "values": list(codes)}
        if container is not None:
            req = {"containerName": container, **req}
        return req

    rules: list[dict[str, object]] = [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    ]
    if spared(Retry.IGNORE):
        rules.append({"action": "Ignore", "onExitCodes": on_codes(spared(Retry.IGNORE))})
    if spared(Retry.FAIL):
        rules.append({"action": "FailJob", "onExitCodes": on_codes(spared(Retry.FAIL))})
    return {"rules": rules}


def policy_action(policy: dict[str, Any] | None, pod_status: dict[str, Any]) -> str:
    """What a Job's podFailurePolicy does with one failed pod: "Ignore", "Count" or
    "FailJob". Kubernetes' algorithm (kubernetes/kubernetes, pkg/controller/job/
    pod_failure_policy.go, `matchPodFailurePolicy`), for the lab's job controller and the
    simulator's retries: rules in order, the first that matches decides; onExitCodes looks
    at terminated containers (app, then init) with a non-zero code, restricted to
    `containerName` when given; onPodConditions matches a condition of that type whose
    status is the pattern's (default True); no match, or no policy, counts."""
    for rule in (policy or {}).get("rules") or []:
        action = rule.get("action")
        if action not in ("Ignore", "Count", "FailJob"):
            continue  # unknown actions are skipped, as the API asks clients to
        if rule.get("onExitCodes") is not None:
            if _exit_code_matches(pod_status, rule["onExitCodes"]):
                return str(action)
        elif rule.get("onPodConditions") is not None:
            for cond in pod_status.get("conditions") or []:
                for pattern in rule["onPodConditions"]:
                    want = pattern.get("status", "True")
                    if cond.get("type") == pattern.get("type") and cond.get("status") == want:
                        return str(action)
    return "Count"


def _exit_code_matches(pod_status: dict[str, Any], req: dict[str, Any]) -> bool:
    values = set(req.get("values") or [])
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in pod_status.get(key) or []:
            term = (cs.get("state") or {}).get("terminated")
            if term is None or req.get("containerName") not in (None, cs.get("name")):
                continue
            code = term.get("exitCode", 0)
            if code != 0 and (
                (req.get("operator") == "In" and code in values)
                or (req.get("operator") == "NotIn" and code not in values)
            ):
                return True
    return False


def pod_status(code: int, *, disrupted: bool = False, container: str = "trainer") -> dict[str, Any]:
    """A failed pod's status as the policy reads it: one container's exit code, and the
    DisruptionTarget condition when the platform evicted it."""
    status: dict[str, Any] = {
        "phase": "Failed",
        "containerStatuses": [{"name": container, "state": {"terminated": {"exitCode": code}}}],
    }
    if disrupted:
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True"}]
    return status
