"""`gpuvigil lab` settings: the size of the run and the intervals that make it fit in a
couple of minutes. The parts run with their shipped configuration (the agent's
`deploy/kubernetes/agent/agent.yaml`, the controller's defaults) and only these intervals
changed: nothing real is skipped, it is only asked to happen sooner."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gpuvigil.core.config import StrictModel


def _agent() -> dict[str, Any]:
    # The shipped agent config's intervals, shortened: checks every second, the summary
    # and the heartbeat written every second, remediation requests read twice a second.
    return {
        "agent": {
            "fast_interval_s": 1.0,
            "publish_interval_s": 0.5,
            "sinks": {"kubernetes": {"heartbeat_interval_s": 1.0, "request_poll_interval_s": 0.5}},
        }
    }


def _controller() -> dict[str, Any]:
    # The controller's defaults in minutes and hours, here in seconds; the ladder and the
    # budget are the defaults. The breaker never trips: the lab's faults are independent
    # by construction and minutes apart, yet a fault on each of its 3 nodes within the
    # level window (6 h) is, rightly, what it holds as a fleet-wide cause. Its test is
    # tests/unit/platform and the simulator's fleet scenarios, not three machines.
    return {
        "interval_s": 1.0,
        "metrics_port": 0,
        "policy": {
            "heartbeat_stale_s": 6.0,
            "suspect_grace_s": 5.0,
            "drain_timeout_s": 60.0,
            "reset_timeout_s": 30.0,
            "reboot_timeout_s": 60.0,
            "validation_timeout_s": 90.0,
            "cooldown_s": 0.0,
            # a fatal finding blocks at once and drains this much later (120 s by default,
            # so that the breaker sees a fleet-wide burst before any of it is drained)
            "fatal_grace_s": 2.0,
            # a problem back within 20 s of a ladder step goes on up the ladder (a day by
            # default): several faults in one lab each start their own ladder
            "escalation_window_s": 20.0,
        },
        "safety": {"breaker_min_nodes": 4},
        # a node found holding work when it was to become a hot spare is asked again this
        # much later (600 s by default): the lab's faults are a minute apart
        "spares": {"busy_recheck_s": 5.0},
    }


def _preflight_env() -> dict[str, str]:
    # Preflight as the shipped pod runs it, on the CPU (the machines' GPUs are fakes) and
    # with the matmul check only (the other active checks add minutes on 2 cores).
    return {
        "GPUVIGIL__PREFLIGHT__DEVICE": "cpu",
        "GPUVIGIL__PREFLIGHT__ACTIVE__CHECKS": "[matmul]",
        "GPUVIGIL__PREFLIGHT__BUDGET_S": "60",
    }


class LabConfig(StrictModel):
    nodes: int = Field(3, ge=3, le=8)  # the job takes 2; the rest is where it moves to
    steps: int = Field(200, ge=10)  # the job's length in optimizer steps
    step_ms: int = Field(100, ge=0)  # the compute a step stands for (a sleep per step)
    checkpoint_every: int = Field(20, ge=1)  # steps between checkpoints
    grace_s: int = Field(10, ge=1)  # the job pods' terminationGracePeriodSeconds
    watchdog_timeout_s: float = Field(8.0, gt=0)  # the training hang watchdog's timeout
    agent_restart_s: float = Field(12.0, gt=0)  # a dead agent's restart (agent-stop)
    # --alerts: after a fault settles, how long to wait for every alert's resolution
    alert_resolve_s: float = Field(90.0, ge=0)
    timeout_s: float = Field(420.0, gt=0)  # each fault, job start to settled (a bound, not a goal)
    # The job's pods request every GPU of their node, as real ones do (so one rank per
    # node, and none on a node whose preflight pod holds the GPUs while it runs).
    gpu_requests: bool = True
    # How the job restarts after losing a rank: "in-process" (the default) runs
    # deploy/kubernetes/examples/training-job-inprocess.yaml, one pod per rank, and replaces
    # only the lost rank's pod while the others keep their processes; "gang" runs
    # training-job.yaml under torchrun and restarts every rank (lab/jobs.py).
    restart: Literal["in-process", "gang"] = "in-process"
    memtier_every: int = Field(2, ge=1)  # in-process: the in-memory tier's K (steps)
    join_timeout_s: float = Field(120.0, gt=0)  # in-process: survivors wait this for a replacement
    # Hot spares the controller keeps in the lab's pool (controller.spares), for the
    # training workload; the job takes 2 nodes of 3, so 1 is idle: the lost rank's spare.
    spares: int = Field(1, ge=0)
    # The device plugin's DP_DISABLE_HEALTHCHECKS Xids (besides the application errors it
    # always skips): Xid 48 here, so `--fault xid48` shows the whole node's ladder (drain,
    # GPU reset, preflight). Without it, Xid 48 marks its GPU Unhealthy, as the plugin's
    # default does, and takes the per-GPU path, as row-remap-failure's Xid 64 does.
    device_plugin_skip_xids: tuple[int, ...] = (48,)
    agent: dict[str, Any] = Field(default_factory=_agent)  # merged into the shipped file
    controller: dict[str, Any] = Field(default_factory=_controller)
    preflight_env: dict[str, str] = Field(default_factory=_preflight_env)
