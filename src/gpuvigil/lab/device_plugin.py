"""The lab's NVIDIA device plugin: which of a machine's GPUs the kubelet may hand out.

Called by the lab's kubelet (`lab.kubelet`) every pass. It does what NVIDIA's
k8s-device-plugin does with NVML's critical-Xid events (internal/rm/health.go): an Xid
on a GPU marks that GPU Unhealthy, unless it is one of the application errors the plugin
skips (13, 31, 43, 45, 68, 109) or one listed in its `DP_DISABLE_HEALTHCHECKS` (here
`skip_xids`). Unhealthy is for good: the plugin has no way back ("there is no way to
recover from the Unhealthy state"), only a restart of the plugin, which marks every GPU
healthy again and watches events from then on (its pod restarts with the machine's boot).

The kubelet counts an Unhealthy GPU in the Node's capacity and not in its allocatable,
and gives it to no new pod; a pod that holds it keeps it (kubernetes#60388).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuvigil.lab.machine import Machine

# Xids the plugin treats as the application's, not the GPU's (k8s-device-plugin v0.20.0)
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class DevicePlugin:
    def __init__(self, machine: Machine, *, skip_xids: Iterable[int] = ()) -> None:
        self.machine = machine
        self.skip = APPLICATION_XIDS | frozenset(skip_xids)
        self.unhealthy: set[str] = set()  # GPU uuids
        self.restarts = 0
        self._seen: dict[str, int] = {}  # uuid -> Xid events already read

    def start(self) -> None:
        """The plugin (re)starts: every GPU healthy, only events from now on count."""
        self.unhealthy = set()
        self._seen = {g.uuid: len(g.xids) for g in self.machine.fake_node().gpus}

    def restart(self) -> None:
        self.restarts += 1
        self.start()

    def check(self) -> bool:
        """Read the Xid events since the last check; True when a GPU turned Unhealthy."""
        before = len(self.unhealthy)
        for g in self.machine.fake_node().gpus:
            seen = self._seen.get(g.uuid, 0)
            if len(g.xids) < seen:  # the driver reloaded: its pending events went
                seen = 0
            new = g.xids[seen:]
            self._seen[g.uuid] = len(g.xids)
            if any(not x.boot and x.code not in self.skip for x in new):
                self.unhealthy.add(g.uuid)
        return len(self.unhealthy) > before

    def healthy(self, uuids: Iterable[str]) -> list[str]:
        return [u for u in uuids if u not in self.unhealthy]
