"""Which pods hold one GPU (platform.clusters.gpu_holders, core.holders): the answer is a list
only when every GPU-asking pod on the node is placed by a source that is fresh; otherwise
None, so the caller falls back to the whole node, never to "nobody holds it"."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuvigil.core import holders as wire
from gpuvigil.platform.clusters.gpu_holders import read

NOW = datetime(2026, 12, 2, 20, 0, tzinfo=UTC)
BAD, GOOD = "GPU-aaaa", "GPU-bbbb"


def node(message: wire.GpuHolders | str | None, name: str = "gpu-1") -> dict:
    annotations = {}
    if message is not None:
        text = message if isinstance(message, str) else wire.encode(message)
        annotations[wire.HOLDERS_ANNOTATION] = text
    return {"metadata": {"name": name, "annotations": annotations}}


def mapping(age_s: float = 10, **held: list[str]) -> wire.GpuHolders:
    return wire.GpuHolders(read_at=NOW - timedelta(seconds=age_s), holders=held)


def pod(name: str, *, gpus: int = 1, ns: str = "ml", node_name: str = "gpu-1",
        phase: str = "Running", status_ids: list[str] | None = None) -> dict:  # fmt: skip
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {"cpu": "1"}
    body: dict = {
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": phase},
    }
    if status_ids is not None:
        body["status"]["containerStatuses"] = [
            {
                "name": "c",
                "allocatedResourcesStatus": [
                    {
                        "name": "nvidia.com/gpu",
                        "resources": [{"resourceID": i, "health": "Healthy"} for i in status_ids],
                    }
                ],
            }
        ]
    return body


def test_the_annotation_alone_names_the_holders():
    n = node(mapping(**{BAD: ["ml/a", "ml/b"], GOOD: ["ml/c"]}))
    assert read(n, BAD, NOW).listed() == ["ml/a", "ml/b"]
    assert read(n, "GPU-cccc", NOW).listed() == []  # fresh and complete: nobody holds it


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (None, "no gpu-holders annotation"),
        ("{", "Invalid JSON"),
        ('{"holders": {}}', "read_at: Field required"),
        ('{"read_at": "2026-12-02T20:00:00", "holders": {}}', "timezone"),
        ('{"read_at": "2026-12-02T19:59:00Z", "holders": []}', "holders"),
        ("x" * (wire.MAX_MESSAGE + 1), "longer than"),
        (mapping(age_s=wire.MAX_AGE_S + 1), "s old"),
        (mapping(age_s=-60), "in the future"),
        (wire.failed(NOW, "CHECK_TIMEOUT: List took over 5 s"), "CHECK_TIMEOUT"),
        (
            wire.GpuHolders(read_at=NOW, holders={BAD: ["ml/a"]}, unmapped=["ml/mig"]),
            "not placed on a GPU: ml/mig",
        ),
    ],
)
def test_unknown_is_none_with_a_reason(message, why):
    got = read(node(message), BAD, NOW)
    assert got.pods is None and why in got.why
    assert read(node(message), BAD, NOW).listed() is None


def test_a_gpu_asking_pod_the_mapping_does_not_place_is_unknown():
    # admitted after the agent's last read: it may be on the bad GPU
    n = node(mapping(**{GOOD: ["ml/a"]}))
    got = read(n, BAD, NOW, pods=[pod("a"), pod("new")])
    assert got.pods is None and "ml/new asks for GPUs" in got.why


def test_pods_without_gpus_or_finished_or_elsewhere_do_not_count():
    n = node(mapping(**{BAD: ["ml/a", "ml/gone"]}))
    pods = [
        pod("a"),
        pod("cpu", gpus=0),
        pod("done", phase="Succeeded"),
        pod("other-node", node_name="gpu-2"),
    ]
    got = read(n, BAD, NOW, pods=pods)
    assert got.pods == ("ml/a",) and got.source == "annotation"  # ml/gone left


def test_allocated_resources_status_speaks_for_its_pod_without_an_annotation():
    pods = [pod("a", status_ids=[BAD]), pod("b", status_ids=[GOOD]), pod("cpu", gpus=0)]
    got = read(node(None), BAD, NOW, pods=pods)
    assert got.pods == ("ml/a",) and got.source == "status"


def test_the_status_is_preferred_over_a_disagreeing_annotation():
    n = node(mapping(**{BAD: ["ml/b"], GOOD: ["ml/a"]}))
    pods = [pod("a", status_ids=[BAD]), pod("b", status_ids=[GOOD])]
    assert read(n, BAD, NOW, pods=pods).listed() == ["ml/a"]


def test_both_sources_mix_per_pod():
    n = node(mapping(**{BAD: ["ml/old"]}))
    pods = [pod("new", status_ids=[f"{BAD}::2"]), pod("old")]  # a time-sliced replica id
    got = read(n, BAD, NOW, pods=pods)
    assert got.pods == ("ml/new", "ml/old") and got.source == "status+annotation"


def test_a_pod_without_status_and_a_stale_annotation_is_unknown():
    pods = [pod("a", status_ids=[GOOD]), pod("b")]
    got = read(node(mapping(age_s=999, **{GOOD: ["ml/b"]})), BAD, NOW, pods=pods)
    assert got.pods is None and got.why.startswith("ml/b asks for GPUs; gpu-holders annotation")


def test_a_dra_claim_matches_by_driver_pool_device():
    p = pod("d", gpus=0)
    p["status"]["containerStatuses"] = [
        {
            "name": "c",
            "allocatedResourcesStatus": [
                {
                    "name": "claim:gpu-claim/gpu",
                    "resources": [
                        {"resourceID": "gpu.nvidia.com/gpu-1/gpu-3", "health": "Unhealthy"}
                    ],
                }
            ],
        }
    ]
    assert read(
        node(None), BAD, NOW, pods=[p], dra_device="gpu.nvidia.com/gpu-1/gpu-3"
    ).listed() == ["ml/d"]
    assert (
        read(node(None), BAD, NOW, pods=[p], dra_device="gpu.nvidia.com/gpu-1/gpu-4").listed() == []
    )


def test_device_ids_that_are_not_gpus_place_nothing():
    assert wire.gpu_of_device("GPU-1234::0") == "GPU-1234"
    for garbage in ("MIG-5678", "GPU-", "", "::", "3"):
        assert wire.gpu_of_device(garbage) is None


def test_a_failed_read_round_trips_and_is_incomplete():
    msg, why = wire.decode(wire.encode(wire.failed(NOW, "socket missing")))
    assert why == "" and msg is not None and not msg.complete and msg.error == "socket missing"
    assert json.loads(wire.encode(mapping(**{BAD: ["ml/a"]})))["holders"] == {BAD: ["ml/a"]}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(annotation=_json, pod_status=_json, containers=_json)
def test_garbage_never_raises(annotation, pod_status, containers):
    n = node(json.dumps(annotation))
    p = pod("a")
    p["status"] = pod_status if isinstance(pod_status, dict) else {"containerStatuses": pod_status}
    got = read(n, BAD, NOW, pods=[p, {"spec": {"containers": containers}}])
    assert got.pods is None or isinstance(got.pods, tuple)
    assert read(node(json.dumps(annotation)), BAD, NOW).pods is None  # never a valid message


def test_the_agents_defaults_refresh_the_mapping_well_within_its_age_bound():
    # The agent rewrites the message with each heartbeat; a publish may come one interval
    # late. Two such rounds must fit in the bound, or a live agent's mapping reads stale.
    from gpuvigil.node.agent import AgentConfig
    from gpuvigil.node.sinks.kubernetes import KubernetesConfig

    refresh = KubernetesConfig().heartbeat_interval_s + AgentConfig().publish_interval_s
    assert 2 * refresh <= wire.MAX_AGE_S
