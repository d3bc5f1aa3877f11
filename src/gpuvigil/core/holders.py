"""Which pods hold which GPU on a node: the message the agent publishes and the controller reads.

The agent (`node.sinks.kubernetes`) reads the kubelet's PodResources API
(`node.pod_resources`) and writes this node's mapping into the Node annotation
`HOLDERS_ANNOTATION`; the controller reads it with `platform.clusters.gpu_holders`, which
judges its age with `core.freshness.judge` against `MAX_AGE_S`.

The message, as JSON: `{"v": 1, "read_at": ISO time, "holders": {"GPU-<uuid>": ["ns/pod",
...]}, "unmapped": ["ns/pod", ...], "error": ""}`.
- `read_at` is when the agent's `List` call answered (the agent's clock), not when it wrote.
- `holders` names only GPUs some pod holds; a GPU absent from it is held by nobody, but only
  when the message is fresh, has no `error` and no `unmapped` pod.
- `unmapped`: pods holding an NVIDIA device whose id is not a GPU UUID (a MIG device,
  `MIG-...`): which GPU they are on is unknown here, so no GPU of the node can be said free.
- `error`: the read failed (socket missing, timeout, garbage). The agent says so at once
  rather than letting the last good mapping age out: the controller falls back to the whole
  node.
Decoding never raises: garbage is (None, why).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gpuvigil.core.wire import DOMAIN, decode_message

HOLDERS_ANNOTATION = f"{DOMAIN}/gpu-holders"
# The agent rewrites the message whenever it changes and at least every heartbeat
# (`agent.sinks.kubernetes.heartbeat_interval_s`, 60 s): three missed heartbeats is a dead agent,
# the same bound the controller applies to its conditions.
MAX_AGE_S = 180.0
# A Node's annotations share 256 KiB; 8 GPUs with a few pods each is ~1 KiB. Time-sliced GPUs
# can carry dozens of pods; past this the message is refused, never truncated (a cut list
# would read as "these are all the holders").
MAX_MESSAGE = 64 * 1024
# Extended resources of NVIDIA's device plugin: `nvidia.com/gpu`, MIG profiles
# (`nvidia.com/mig-1g.10gb`), renamed shared GPUs (`nvidia.com/gpu.shared`).
RESOURCE_PREFIX = "nvidia.com/"
GPU_PREFIX = "GPU-"
# The NVIDIA device plugin names the replicas of a time-sliced GPU `<uuid>::<n>`.
_REPLICA_SEP = "::"

PodKey = str  # "namespace/name"


class GpuHolders(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    v: int = 1
    read_at: AwareDatetime
    holders: dict[str, list[PodKey]] = Field(default_factory=dict)
    unmapped: list[PodKey] = Field(default_factory=list)
    error: str = Field("", max_length=500)

    @property
    def complete(self) -> bool:
        """The mapping answers for every GPU: read without error, every device placed."""
        return not self.error and not self.unmapped


def gpu_of_device(device_id: str) -> str | None:
    """The GPU UUID a device-plugin device id names (`GPU-x`, or `GPU-x::3` for a
    time-sliced replica); None for anything else (a MIG device, garbage)."""
    base = device_id.split(_REPLICA_SEP, 1)[0].strip()
    if base.startswith(GPU_PREFIX) and len(base) > len(GPU_PREFIX):
        return base
    return None


def encode(message: GpuHolders) -> str:
    return message.model_dump_json(exclude_defaults=True)


def decode(text: str | None) -> tuple[GpuHolders | None, str]:
    """The message in `text`, or (None, why): never raises."""
    if not text:
        return None, "no gpu-holders annotation"
    return decode_message(GpuHolders, "gpu-holders", text, limit=MAX_MESSAGE)


def failed(read_at: datetime, why: str) -> GpuHolders:
    """The message for a read that failed: nothing is known about any GPU."""
    return GpuHolders(read_at=read_at, error=why[:500])


def build(read_at: datetime, assigned: Iterable[tuple[PodKey, str, str]]) -> GpuHolders:
    """The message for `(pod, resource name, device id)` triples read at `read_at`: NVIDIA
    devices go to their GPU, one that names no GPU makes its pod `unmapped`; other vendors'
    devices are not ours to place."""
    held: dict[str, set[PodKey]] = {}
    unmapped: set[PodKey] = set()
    for pod, resource, device_id in assigned:
        if not resource.startswith(RESOURCE_PREFIX):
            continue
        gpu = gpu_of_device(device_id)
        if gpu is None:
            unmapped.add(pod)
        else:
            held.setdefault(gpu, set()).add(pod)
    return GpuHolders(
        read_at=read_at,
        holders={gpu: sorted(pods) for gpu, pods in sorted(held.items())},
        unmapped=sorted(unmapped),
    )
