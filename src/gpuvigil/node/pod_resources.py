"""The kubelet's PodResources API on this node: which device ids each pod's containers hold.

Called by the agent's Kubernetes sink (`node.sinks.kubernetes`) before it publishes the
`core.holders` annotation. One `List` call on the kubelet's unix socket (`v1.PodResourcesLister`;
the messages are `podresources_v1.proto`), with a deadline. It fails closed: a missing
socket (DEPENDENCY_MISSING), a kubelet that does not answer in time (CHECK_TIMEOUT) or an
answer that is not the message, or names no pod (CHECK_ERROR) is a `PodDevices` with `code`
set and no devices, never an empty list that reads as "nothing holds a GPU".

grpc is imported when a read is made, so the agent without a Kubernetes sink never loads it.
A channel lives for one call: the agent reads every publish interval, and a channel kept
open would keep a reconnecting socket to a kubelet that restarts.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_TIMEOUT_S = 5.0  # the kubelet answers from memory in milliseconds
LIST_METHOD = "/v1.PodResourcesLister/List"
# A node runs at most 110 pods by default; 16 MiB is far past any real answer, and a bound
# keeps a broken peer from growing the agent's memory.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Assigned:
    """One device id given to one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True)
class PodDevices:
    """What `List` answered. `code` empty: `devices` is every device id given on this node."""

    read_at: datetime
    devices: tuple[Assigned, ...] = ()
    pods: int = 0  # pods listed, with devices or not
    code: str = ""  # DEPENDENCY_MISSING | CHECK_TIMEOUT | CHECK_ERROR
    message: str = ""

    @property
    def ok(self) -> bool:
        return not self.code


def read(
    socket: Path = DEFAULT_SOCKET,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    now: datetime | None = None,
) -> PodDevices:
    """One `List` on the kubelet's socket; never raises."""
    read_at = now or datetime.now(UTC)
    try:
        mode = socket.stat().st_mode
    except OSError as e:
        return PodDevices(read_at, code="DEPENDENCY_MISSING", message=f"{socket}: {e.strerror}")
    if not stat.S_ISSOCK(mode):
        return PodDevices(read_at, code="DEPENDENCY_MISSING", message=f"{socket}: not a socket")
    try:
        import grpc

        from gpuvigil.node import podresources_v1_pb2 as pb
    except ImportError as e:  # an install without the grpc extra
        return PodDevices(read_at, code="DEPENDENCY_MISSING", message=f"grpc: {e}")
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    try:
        with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
            call = channel.unary_unary(
                LIST_METHOD,
                request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                response_deserializer=pb.ListPodResourcesResponse.FromString,
            )
            response = call(pb.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as e:
        status = e.code() if hasattr(e, "code") else None
        detail = (e.details() if hasattr(e, "details") else "") or str(status)
        if status == grpc.StatusCode.DEADLINE_EXCEEDED:
            code, what = "CHECK_TIMEOUT", f"no answer in {timeout_s:g} s"
        else:
            code, what = "CHECK_ERROR", f"{getattr(status, 'name', status)}: {detail}"
        return PodDevices(read_at, code=code, message=f"kubelet PodResources List: {what}"[:400])
    except Exception as e:  # noqa: BLE001 - a broken peer or library is a failed read
        return PodDevices(
            read_at, code="CHECK_ERROR", message=f"kubelet PodResources List: {e!r}"[:400]
        )
    return parse(response, read_at=read_at)


def parse(response: object, *, read_at: datetime) -> PodDevices:
    """The devices of a decoded `ListPodResourcesResponse`; a pod without a name or
    namespace makes the whole answer unusable (whose devices would they be?)."""
    devices: list[Assigned] = []
    listed = getattr(response, "pod_resources", None)
    if listed is None:
        return PodDevices(read_at, code="CHECK_ERROR", message="not a ListPodResourcesResponse")
    for pod in listed:
        if not pod.name or not pod.namespace:
            return PodDevices(
                read_at,
                code="CHECK_ERROR",
                message=f"kubelet listed a pod without a name or namespace: {pod.namespace!r}/"
                f"{pod.name!r}"[:400],
            )
        for container in pod.containers:
            for dev in container.devices:
                devices.extend(
                    Assigned(pod.namespace, pod.name, container.name, dev.resource_name, i)
                    for i in dev.device_ids
                )
    return PodDevices(read_at, devices=tuple(devices), pods=len(listed))
