"""Publishes this node's health to Slurm, and (standalone mode) drains it on what blocks it.

Called by the agent through a SinkWorker, and by `gpuvigil slurm-healthcheck`.
- publish (always): the compact `core.wire` summary goes into the node field
  `core.wire.SLURM_HEALTH_FIELD` (`Extra`, free text since Slurm 22.05, shown by
  `scontrol show node` and `sinfo -O extra`), where the controller reads it;
- standalone (sites without the controller): a finding Kubernetes would block new work on
  (`core.blocking`; `drain_on: fatal` narrows it to fatal ones) drains the node with the
  controller's own reason tag for a blocked node (`core.states.tag`: `gpuvigil:SUSPECT:-:<code>
  <component>`), so a controller added later knows the drain for gpuvigil's; it is resumed
  only when the finding has cleared *and* the node is still drained with exactly the reason
  this agent wrote (remembered in `marker_path`, so a restart does not forget it): a drain
  by an admin or by anything else is never undone. With the controller, only the
  controller drains.
Every command goes through the one Slurm client (`io.slurm_client`): argv lists, deadlines.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from gpuvigil.core import wire
from gpuvigil.core.blocking import blocks_new_work
from gpuvigil.core.config import StrictModel
from gpuvigil.core.files import write_atomic
from gpuvigil.core.findings import Finding, NodeReport
from gpuvigil.core.states import State, tag
from gpuvigil.io.slurm_client import SlurmClient, parse_show_node

log = logging.getLogger("gpuvigil.agent.slurm")
__all__ = ["SlurmConfig", "SlurmNode", "SlurmSink", "parse_show_node", "reconcile_drain"]


class SlurmConfig(StrictModel):
    enabled: bool = Field(False, description="Publish to this node's Slurm record.")
    mode: Literal["publish", "standalone"] = Field(
        "publish",
        description="publish: only write the summary (the controller acts). "
        "standalone: also drain on what blocks the node (drain_on) and resume after it clears.",
    )
    drain_on: Literal["blocked", "fatal", "failed"] = Field(
        "blocked",
        description="Standalone: drain on every finding Kubernetes would block new work on "
        "(`core.blocking`: any FAILED one, a check that could not run included), the "
        "default; or on fatal findings only (`fatal`: without the controller's circuit "
        "breaker, a fleet-wide tool breakage, CHECK_ERROR everywhere, drains every node). "
        "`failed` is the old name of `blocked`.",
    )
    scontrol: str = Field("scontrol", description="The scontrol binary (name or path).")
    timeout_s: float = Field(10.0, gt=0, description="Deadline of each scontrol call.")
    heartbeat_interval_s: float = Field(
        60.0,
        gt=0,
        description="Re-write the summary at least this often: its `generated_at` "
        "is the controller's heartbeat.",
    )
    marker_path: Path = Field(
        Path("/var/lib/gpuvigil/slurm-drain-reason"),
        description="Remembers the drain reason this agent set (standalone), across restarts.",
    )


def drain_reason(f: Finding) -> str:
    """The controller's tag for a blocked node, naming the finding."""
    return tag(State.SUSPECT, None, f"{f.code} {f.component}")


def drain_trigger(report: NodeReport, *, drain_on: str) -> Finding | None:
    """The finding that should drain the node, worst first, or None. Pure."""
    bad = [
        f
        for f in report.problems
        if blocks_new_work(f.status) and (f.fatal or drain_on != "fatal")  # the one table
    ]
    bad.sort(key=lambda f: (not f.fatal, -f.action.rank, f.code, f.component))
    return bad[0] if bad else None


class SlurmNode:
    """This node's Slurm record through the one Slurm client; a failure raises
    `SlurmError` (a RuntimeError, retried by the SinkWorker)."""

    def __init__(self, name: str, *, config: SlurmConfig, env: dict[str, str] | None = None):
        self.name = name
        self.client = SlurmClient(scontrol=config.scontrol, timeout_s=config.timeout_s, env=env)

    def show(self) -> dict[str, str]:
        return self.client.show_node(self.name)

    def set_field(self, field: str, value: str) -> None:
        self.client.update(self.name, f"{field}={value}")

    def drain(self, reason: str) -> None:
        self.client.drain(self.name, reason=reason)

    def resume(self) -> None:
        self.client.resume(self.name)


def is_drained(info: dict[str, str]) -> bool:
    return "DRAIN" in info.get("State", "").upper()


class SlurmSink:
    name = "slurm"

    def __init__(self, config: SlurmConfig, *, node: str, env: dict[str, str] | None = None):
        self.config = config
        self.slurm = SlurmNode(node, config=config, env=env)
        self._last_summary: str | None = None
        self._last_write = 0.0

    def publish(self, report: NodeReport) -> None:
        summary = wire.summarize(report).model_dump_json(exclude={"generated_at"})
        due = time.monotonic() - self._last_write >= self.config.heartbeat_interval_s
        if due or summary != self._last_summary:
            self.slurm.set_field(wire.SLURM_HEALTH_FIELD, wire.encode_health(report))
            self._last_summary, self._last_write = summary, time.monotonic()
        if self.config.mode == "standalone":
            reconcile_drain(self.slurm, report, config=self.config)

    def close(self) -> None:
        pass


def reconcile_drain(slurm: SlurmNode, report: NodeReport, *, config: SlurmConfig) -> str:
    """Drain on a trigger, resume what we drained once it clears. Returns what it did."""
    trigger = drain_trigger(report, drain_on=config.drain_on)
    ours = _read_marker(config.marker_path)
    info = slurm.show()
    if trigger is not None:
        if is_drained(info):
            return "already drained"
        reason = drain_reason(trigger)
        slurm.drain(reason)
        _write_marker(config.marker_path, reason)
        log.warning("drained %s: %s", slurm.name, reason)
        return "drained"
    if ours is None:
        return "nothing to do"
    if is_drained(info) and info.get("Reason", "") == ours:
        slurm.resume()
        log.warning("resumed %s: %r has cleared", slurm.name, ours)
        config.marker_path.unlink(missing_ok=True)
        return "resumed"
    config.marker_path.unlink(missing_ok=True)  # someone else changed the drain: not ours
    return "not ours"


def _read_marker(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def _write_marker(path: Path, reason: str) -> None:
    write_atomic(path, (reason + "\n").encode())
