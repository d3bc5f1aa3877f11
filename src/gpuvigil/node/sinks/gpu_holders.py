"""The pod -> GPU mapping the Kubernetes sink publishes on its Node (`core.holders`).

Called by `node.sinks.kubernetes` on every publish (every `agent.publish_interval_s`, 30 s,
and at once on a change of health): one `List` on the kubelet's PodResources socket
(`node.pod_resources`), turned into the `gpuvigil.io/gpu-holders` message. The sink
writes it when its content changes and with every heartbeat, so its `read_at` is never
older than `heartbeat_interval_s` plus one publish interval while the agent lives; the
controller treats one older than `core.holders.MAX_AGE_S` as unknown.

A failed read is published as such (`error`), at once: the controller then falls back to
the whole node for a bad GPU here instead of trusting the last good mapping. It is not a
health finding: the machine is no less fit because the kubelet's socket is missing, and a
finding would block the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import Field

from gpuvigil.core import holders as wire
from gpuvigil.core.config import StrictModel
from gpuvigil.node import pod_resources

log = logging.getLogger("gpuvigil.agent.gpu_holders")


class PodResourcesConfig(StrictModel):
    enabled: bool = Field(
        True,
        description="Publish which pods hold which GPU (annotation gpuvigil.io/gpu-holders), "
        "read from the kubelet's PodResources API, so the controller can evict only a bad "
        "GPU's pods (docs/per-gpu.md). False: the controller falls back to the whole node.",
    )
    socket: Path = Field(
        pod_resources.DEFAULT_SOCKET,
        description="The kubelet's PodResources socket (the DaemonSet mounts its folder).",
    )
    timeout_s: float = Field(
        pod_resources.DEFAULT_TIMEOUT_S,
        gt=0,
        description="Deadline of the List call; the kubelet answers from memory in "
        "milliseconds, so a miss means it is stuck.",
    )


Reader = Callable[..., pod_resources.PodDevices]


class HoldersReader:
    """Reads the mapping once per publish and says whether it differs from the last one."""

    def __init__(self, config: PodResourcesConfig, *, read: Reader = pod_resources.read) -> None:
        self.config = config
        self._read = read
        self._last_error = ""

    def read(self) -> wire.GpuHolders:
        got = self._read(self.config.socket, timeout_s=self.config.timeout_s, now=datetime.now(UTC))
        if not got.ok:
            why = f"{got.code}: {got.message}"
            if why != self._last_error:
                log.warning("gpu holders unknown: %s", why)
            self._last_error = why
            return wire.failed(got.read_at, why)
        if self._last_error:
            log.info("gpu holders readable again")
        self._last_error = ""
        return wire.build(got.read_at, [(d.pod_key, d.resource, d.device_id) for d in got.devices])


def content(message: wire.GpuHolders | None) -> str | None:
    """The message without its time: what decides whether it must be written again."""
    return None if message is None else message.model_dump_json(exclude={"read_at"})
