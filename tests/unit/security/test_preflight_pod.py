"""The preflight pod the controller builds for one validation (clusters.k8s_preflight): from
the shipped PodTemplate, pinned to the node, every GPU the node has, ends by itself; and
only a finished pod on that very node counts as its result."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import yaml

from gpuvigil.platform.clusters.k8s_preflight import build_pod, pod_name, result_of

TEMPLATE = yaml.safe_load(
    (
        Path(__file__).resolve().parents[3] / "deploy/kubernetes/preflight/podtemplate.yaml"
    ).read_text()
)
SINCE = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_pod_asks_for_the_nodes_gpus_and_runs_once():
    pod = build_pod(TEMPLATE, node="gpu-7", since=SINCE, gpus=4, gpu_resource="nvidia.com/gpu")
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and "nodeName" not in spec
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-7"]
    (c,) = spec["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert c["args"][-2:] == ["--expect-gpus", "4"]
    assert "--result-file" in c["args"] and "kernel_log" in c["args"]  # no /dev/kmsg here
    keys = {t.get("key") for t in spec["tolerations"]}
    assert {"gpuvigil.io/unhealthy", "gpuvigil.io/unvalidated", "nvidia.com/gpu"} <= keys
    assert spec["automountServiceAccountToken"] is False
    assert spec["runtimeClassName"] == "nvidia"
    assert pod["metadata"]["name"] == pod_name("gpu-7", SINCE)
    assert pod["metadata"]["name"] != pod_name("gpu-7", SINCE.replace(minute=1))
    cpu = build_pod(TEMPLATE, node="cpu-1", since=SINCE, gpus=0, gpu_resource="nvidia.com/gpu")
    assert "nvidia.com/gpu" not in cpu["spec"]["containers"][0]["resources"]["limits"]
    assert TEMPLATE["template"]["spec"].get("affinity") is None  # the template is not changed


def finished(node: str, phase: str, **term: object) -> dict:
    return {
        "metadata": {"name": "p", "annotations": {}},
        "spec": {"nodeName": node},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"state": {"terminated": {"finishedAt": "2026-12-01T12:05:00Z", **term}}}
            ],
        },
    }


def test_result_is_the_pods_exit_on_that_node_only():
    msg = '{"result": "fail", "at": "x", "summary": "gpu:3 GPU_SDC"}\n'
    bad = result_of(finished("gpu-7", "Failed", exitCode=1, message=msg), node="gpu-7")
    assert bad is not None and not bad.passed and bad.summary == "gpu:3 GPU_SDC"
    assert bad.at == datetime(2026, 12, 1, 12, 5, tzinfo=UTC)
    ok = result_of(finished("gpu-7", "Succeeded", exitCode=0), node="gpu-7")
    assert ok is not None and ok.passed
    assert result_of(finished("gpu-8", "Succeeded", exitCode=0), node="gpu-7") is None
    running = finished("gpu-7", "Running")
    assert result_of(running, node="gpu-7") is None
    mirror = finished("gpu-7", "Succeeded", exitCode=0)
    mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "x"
    assert result_of(mirror, node="gpu-7") is None  # a static pod its kubelet made up
    crashed = result_of(finished("gpu-7", "Failed", exitCode=137, message="Killed"), node="gpu-7")
    assert crashed is not None and crashed.summary == "exit 137: Killed"


def test_gpu_count_is_the_pools_or_the_catalogs_never_the_nodes_status():
    from gpuvigil.node.catalog.instances import load_catalog
    from gpuvigil.platform.clusters.k8s_preflight import expected_gpus

    cat = load_catalog()
    kw = {"pool_label": "gpuvigil.io/pool", "instance_type_label": "it", "catalog": cat}
    pooled = {"gpuvigil.io/pool": "a100", "it": "p5.48xlarge"}
    assert expected_gpus(pooled, pool_gpus={"a100": 4}, **kw)[0] == 4  # the pool wins
    assert expected_gpus({"it": "p5.48xlarge"}, pool_gpus={}, **kw)[0] == 8
    assert expected_gpus({}, pool_gpus={"default": 0}, **kw)[0] == 0  # an operator's 0
    for labels, why in (
        ({}, "no it label"),
        ({"it": "m5.large"}, "'m5.large' is not in the catalog"),
    ):
        gpus, reason = expected_gpus(labels, pool_gpus={"a100": 8}, **kw)
        assert gpus is None and reason.startswith("not validated: no GPU count for pool")
        assert why in reason
    zero = load_catalog({"cpu.large": {"gpus": 0}})  # a GPU node relabelled as a CPU type
    gpus, reason = expected_gpus({"it": "cpu.large"}, pool_gpus={}, **{**kw, "catalog": zero})
    assert gpus is None and "no GPUs" in reason
