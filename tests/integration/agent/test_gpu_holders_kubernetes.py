"""Which pods hold which GPU, from the kubelet to the controller's reader, on the real
kube-apiserver 1.20.2: the agent, as its node (`system:node:<name>`), reads a real gRPC
PodResources server on a unix socket (fakes.pod_resources: no kubelet runs here) and
publishes `gpuvigil.io/gpu-holders`; `platform.clusters.gpu_holders` reads the Node as the
controller gets it. A kubelet that hangs, or whose socket is gone, turns the annotation to
an error at once, so the reader answers None (whole node), never "nobody holds it"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import agent_helpers
import pytest
from agent_helpers import wait_until

from gpuvigil.core import holders as wire
from gpuvigil.fakes.pod_resources import PodResourcesServer
from gpuvigil.platform.clusters.gpu_holders import read
from realparts.kube import NODE_IDENTITIES

start_agent = agent_helpers.start_agent  # the fixture
pytestmark = pytest.mark.realparts
BAD, OTHER = "GPU-0b1f6a3c-bad", "GPU-77e2c9d0-ok"


def node_dict(kube: Any, name: str) -> dict[str, Any]:
    """The Node as JSON, as the controller's adapter reads it."""
    return kube.api_client().sanitize_for_serialization(kube.core().read_node(name))


def published(kube: Any, name: str) -> wire.GpuHolders | None:
    text = (kube.core().read_node(name).metadata.annotations or {}).get(wire.HOLDERS_ANNOTATION)
    return wire.decode(text)[0]


def test_the_agent_publishes_its_gpus_holders_as_its_node(start_agent, kube, tmp_path: Path):
    from kubernetes.client.exceptions import ApiException

    name = NODE_IDENTITIES[-1]
    try:
        kube.core().delete_node(name)
    except ApiException as e:
        assert e.status == 404, e
    kube.create_node(name, labels={"nvidia.com/gpu.present": "true"})
    sock = tmp_path / "pod-resources" / "kubelet.sock"
    kubelet = PodResourcesServer(sock).start()
    try:
        kubelet.set_pods(
            {
                ("ml", "train-0"): {"main": {"nvidia.com/gpu": [BAD, OTHER]}},
                ("ml", "train-1"): {"main": {"nvidia.com/gpu": ["GPU-3"]}},
                ("web", "nginx"): {"main": {}},
            }
        )
        _, pub = agent_helpers.controller_key(tmp_path)
        settings = {"pod_resources": {"socket": str(sock), "timeout_s": 0.5}}
        a = agent_helpers.start_kube_agent(
            start_agent, name, kubeconfig=kube.node_kubeconfig(name), trust=pub, kubernetes=settings
        )
        first = wait_until(lambda: published(kube, name), 20, "the gpu-holders annotation")
        assert first.holders == {
            BAD: ["ml/train-0"],
            OTHER: ["ml/train-0"],
            "GPU-3": ["ml/train-1"],
        }
        assert first.complete
        now = datetime.now(UTC)
        assert abs((now - first.read_at).total_seconds()) < 10
        assert read(node_dict(kube, name), BAD, now).listed() == ["ml/train-0"]
        assert read(node_dict(kube, name), "GPU-idle", now).listed() == []  # complete and fresh
        # The controller's clock past the bound: stale is unknown.
        late = first.read_at + timedelta(seconds=wire.MAX_AGE_S + 1)
        assert read(node_dict(kube, name), BAD, late).listed() is None

        # A new holder shows within a publish interval or two.
        kubelet.set_pods({("ml", "serve-0"): {"main": {"nvidia.com/gpu": [f"{BAD}::1"]}}})
        wait_until(
            lambda: (m := published(kube, name)) and m.holders == {BAD: ["ml/serve-0"]},
            10,
            "the new holder",
        )
        # A hung kubelet: the error is published, the last good mapping is not kept.
        kubelet.mode = "hang"
        hung = wait_until(lambda: (m := published(kube, name)) and m.error and m, 15, "an error")
        assert hung.error.startswith("CHECK_TIMEOUT") and hung.holders == {}
        assert read(node_dict(kube, name), BAD, datetime.now(UTC)).listed() is None
        # The socket gone (kubelet restarting): unknown too, then readable again.
        kubelet.stop()
        wait_until(
            lambda: (m := published(kube, name)) and m.error.startswith("DEPENDENCY_MISSING"),
            15,
            "the missing socket",
        )
        kubelet = PodResourcesServer(sock).start()
        wait_until(lambda: (m := published(kube, name)) and m.complete, 15, "a good read again")
        assert read(node_dict(kube, name), BAD, datetime.now(UTC)).listed() == []
        assert a.proc.poll() is None, a.log()  # none of this stopped the agent
    finally:
        kubelet.stop()
