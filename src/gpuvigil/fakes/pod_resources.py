"""A stand-in for the kubelet's PodResources gRPC service (`v1.PodResourcesLister/List`), which
cannot run without a kubelet: a real gRPC server on a unix socket, for the agent's tests and
the lab.

It encodes its answers by hand from the API's field numbers rather than with gpuvigil's
generated `podresources_v1_pb2`, so a wrong field number in our `.proto` fails the tests
instead of agreeing with itself. `mode` picks the behaviour of the next calls:
- `serve`: the pods set with `set_pods`;
- `hang`: never answer (until `stop`): the client's deadline must end the call;
- `garbage`: bytes that are not a ListPodResourcesResponse;
- `unnamed`: a well-formed answer listing a pod with no name.

    with PodResourcesServer(tmp / "kubelet.sock") as kubelet:
        kubelet.set_pods({("ml", "train-0"): {"main": {"nvidia.com/gpu": ["GPU-1"]}}})
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent import futures
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

# container -> resource name -> device ids
Containers = Mapping[str, Mapping[str, list[str]]]
Mode = Literal["serve", "hang", "garbage", "unnamed"]
HANG_CAP_S = 60.0  # a hung call ends by itself at the latest here, so no test waits forever


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings and messages, wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _s(number: int, text: str) -> bytes:
    return _field(number, text.encode())


def encode(pods: Mapping[tuple[str, str], Containers]) -> bytes:
    """ListPodResourcesResponse{pod_resources=1: PodResources{name=1, namespace=2,
    containers=3: ContainerResources{name=1, devices=2: ContainerDevices{resource_name=1,
    device_ids=2}}}}; plus a field no client knows (cpu_ids=3, packed), as a newer kubelet
    sends, which the client must skip."""
    out = b""
    for (namespace, name), containers in pods.items():
        body = _s(1, name) + _s(2, namespace)
        for cname, resources in containers.items():
            cbody = _s(1, cname)
            for resource, ids in resources.items():
                cbody += _field(2, _s(1, resource) + b"".join(_s(2, i) for i in ids))
            cbody += _field(3, _varint(4) + _varint(5))  # cpu_ids [4, 5]
            body += _field(3, cbody)
        out += _field(1, body)
    return out


class PodResourcesServer:
    def __init__(self, socket: Path, *, mode: Mode = "serve") -> None:
        self.socket = socket
        self.mode: Mode = mode
        self.calls = 0
        self._pods: dict[tuple[str, str], Containers] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._server: Any = None

    def set_pods(self, pods: Mapping[tuple[str, str], Containers]) -> None:
        with self._lock:
            self._pods = dict(pods)

    def _list(self, _request: bytes, context: Any) -> bytes:
        import grpc

        with self._lock:
            self.calls += 1
            mode, pods = self.mode, dict(self._pods)
        if mode == "hang" or self._stopping.is_set():
            self._stopping.wait(HANG_CAP_S)
            # Never an answer: an empty one would read as "no pod holds a GPU".
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet stopping")
        if mode == "garbage":
            return b"\x0a\xff\xff\xff\xff\x0fnot a protobuf message"
        if mode == "unnamed":
            return encode({("ml", ""): {}})
        return encode(pods)

    def start(self) -> PodResourcesServer:
        import grpc

        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        identity = lambda b: b  # noqa: E731 - bytes in, bytes out: we encode ourselves
        handler = grpc.unary_unary_rpc_method_handler(
            self._list, request_deserializer=identity, response_serializer=identity
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler}),)
        )
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
            self._server = None
        self.socket.unlink(missing_ok=True)

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(
        self,
        _t: type[BaseException] | None,
        _e: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.stop()
