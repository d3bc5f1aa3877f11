"""The kubelet PodResources client (node.pod_resources) against a real gRPC server on a
unix socket (fakes.pod_resources, which encodes by hand from the API's field numbers): good,
hang, garbage, absent, not a socket; and the message it becomes (core.holders.build)."""

from __future__ import annotations

import re
import socket as so
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuvigil.core import holders as wire
from gpuvigil.fakes.pod_resources import PodResourcesServer
from gpuvigil.node import pod_resources

NOW = datetime(2026, 12, 2, 20, 0, tzinfo=UTC)
PODS = {
    ("ml", "train-0"): {"main": {"nvidia.com/gpu": ["GPU-a", "GPU-b"]}, "side": {}},
    ("ml", "train-1"): {"main": {"nvidia.com/gpu": ["GPU-c::1"], "example.com/nic": ["eth9"]}},
    ("kube-system", "dns"): {},
}


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "pod-resources" / "kubelet.sock"


def test_a_listing_becomes_pod_devices_and_the_holders_message(sock):
    with PodResourcesServer(sock) as kubelet:
        kubelet.set_pods(PODS)
        got = pod_resources.read(sock, now=NOW)
    assert got.ok and got.pods == 3 and got.read_at == NOW
    assert [(d.pod_key, d.container, d.resource, d.device_id) for d in got.devices] == [
        ("ml/train-0", "main", "nvidia.com/gpu", "GPU-a"),
        ("ml/train-0", "main", "nvidia.com/gpu", "GPU-b"),
        ("ml/train-1", "main", "nvidia.com/gpu", "GPU-c::1"),
        ("ml/train-1", "main", "example.com/nic", "eth9"),
    ]
    msg = wire.build(got.read_at, [(d.pod_key, d.resource, d.device_id) for d in got.devices])
    assert msg.holders == {
        "GPU-a": ["ml/train-0"],
        "GPU-b": ["ml/train-0"],
        "GPU-c": ["ml/train-1"],
    }
    assert msg.complete


def test_a_mig_device_leaves_its_pod_unmapped():
    msg = wire.build(
        NOW, [("ml/a", "nvidia.com/mig-1g.10gb", "MIG-1234"), ("ml/b", "nvidia.com/gpu", "GPU-x")]
    )
    assert msg.unmapped == ["ml/a"] and not msg.complete and msg.holders == {"GPU-x": ["ml/b"]}


def test_no_pods_is_an_empty_mapping_only_when_the_kubelet_said_so(sock):
    with PodResourcesServer(sock):
        got = pod_resources.read(sock, now=NOW)
    assert got.ok and got.devices == () and got.pods == 0


def test_a_hung_kubelet_is_a_timeout_within_the_deadline(sock):
    with PodResourcesServer(sock, mode="hang") as kubelet:
        t0 = time.monotonic()
        got = pod_resources.read(sock, timeout_s=0.5, now=NOW)
        took = time.monotonic() - t0
        assert kubelet.calls == 1
    assert got.code == "CHECK_TIMEOUT" and "no answer in 0.5 s" in got.message
    assert got.devices == () and took < 5


@pytest.mark.parametrize(("mode", "text"), [("garbage", "INTERNAL"), ("unnamed", "without a name")])
def test_an_answer_that_is_not_the_message_is_an_error(sock, mode, text):
    with PodResourcesServer(sock, mode=mode):
        got = pod_resources.read(sock, now=NOW)
    assert got.code == "CHECK_ERROR" and text in got.message and got.devices == ()


def test_a_missing_socket_is_a_missing_dependency(sock):
    got = pod_resources.read(sock, now=NOW)
    assert got.code == "DEPENDENCY_MISSING" and "No such file" in got.message


def test_a_plain_file_is_not_a_socket(tmp_path):
    f = tmp_path / "kubelet.sock"
    f.write_text("")
    assert pod_resources.read(f, now=NOW).message.endswith("not a socket")


def test_a_socket_nobody_answers_on_is_an_error_not_a_hang(sock):
    sock.parent.mkdir(parents=True)
    s = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    s.bind(str(sock))  # bound, never listening: a kubelet that died and left its socket
    try:
        t0 = time.monotonic()
        got = pod_resources.read(sock, timeout_s=3, now=NOW)
        assert got.code in ("CHECK_ERROR", "CHECK_TIMEOUT") and time.monotonic() - t0 < 5
    finally:
        s.close()


def test_the_failed_read_is_published_as_unknown(sock):
    got = pod_resources.read(sock, now=NOW)
    msg = wire.failed(got.read_at, f"{got.code}: {got.message}")
    assert not msg.complete and msg.error.startswith("DEPENDENCY_MISSING")


def _schema(text: str) -> str:
    return re.search(r"AddSerializedFile\((b'.*?')\)", text, re.S).group(1)  # type: ignore[union-attr]


def test_the_checked_in_stubs_match_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    src = Path(pod_resources.__file__).resolve().parents[2]
    proto = "gpuvigil/node/podresources_v1.proto"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(src),
            f"--python_out={tmp_path}",
            proto,
        ],
        check=True,
        timeout=60,
    )
    fresh = (tmp_path / proto.replace(".proto", "_pb2.py")).read_text()
    kept = (src / proto.replace(".proto", "_pb2.py")).read_text()
    assert _schema(fresh) == _schema(kept), "regenerate: see the comment in podresources_v1.proto"
