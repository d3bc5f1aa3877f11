"""The DRA side of per-GPU isolation, pure parts (clusters.dra_objects): which path a GPU takes,
which device a GPU UUID is in every served ResourceSlice shape, the DeviceTaintRule's shape
(never NoExecute), the holders ResourceClaims name."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuvigil.platform.clusters import dra_objects as dra

NOW = datetime(2026, 12, 2, 20, 0, tzinfo=UTC)
UUID = "GPU-0b1f6a3c-9e1d-4c55-8d0e-1c2b3a4d5e6f"
DEV = dra.Device("gpu.nvidia.com", "gpu-1", "gpu-3", UUID)


def rslice(*, node="gpu-1", driver="gpu.nvidia.com", nested=False, key="uuid", uuid=UUID):
    attrs = {"index": {"int": 3}, key: {"string": uuid}}
    dev = {
        "name": "gpu-3",
        **({"basic": {"attributes": attrs}} if nested else {"attributes": attrs}),
    }
    return {
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": "gpu-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-other"}}}, dev],
        }
    }


@pytest.mark.parametrize(
    "shape",
    [{}, {"nested": True}, {"key": "gpu.nvidia.com/uuid"}],
    ids=["v1", "v1beta1-basic", "qualified-attribute"],
)
def test_the_device_is_found_by_its_uuid_in_every_shape(shape):
    assert dra.device_of([rslice(**shape)], node="gpu-1", gpu_uuid=UUID) == DEV


@pytest.mark.parametrize(
    "other", [{"node": "gpu-2"}, {"driver": "example.com/gpu"}, {"uuid": "GPU-else"}]
)
def test_another_node_driver_or_gpu_is_not_ours(other):
    assert dra.device_of([rslice(**other)], node="gpu-1", gpu_uuid=UUID) is None


_garbage = st.recursive(
    st.none() | st.text(max_size=5) | st.integers(),
    lambda x: st.lists(x, max_size=3) | st.dictionaries(st.text(max_size=6), x, max_size=4),
    max_leaves=15,
)


@given(_garbage)
def test_garbage_slices_never_raise(garbage):
    assert dra.device_of([garbage, {"spec": garbage}], node="gpu-1", gpu_uuid=UUID) is None
    assert dra.claim_pods([garbage, {"status": garbage}], DEV) == []


@pytest.mark.parametrize(
    ("served", "device", "agrees", "path"),
    [
        (dra.Served("v1beta2", "v1"), DEV, False, "dra"),
        (dra.Served("v1beta2", "v1"), DEV, True, "dra"),  # DRA first
        (dra.Served("v1beta2", "v1"), None, True, "device-plugin"),  # not a DRA device
        (dra.Served(None, "v1"), DEV, True, "device-plugin"),  # 1.34: slices, no rules
        (dra.Served(None, None), None, True, "device-plugin"),
        (dra.Served(None, None), None, False, "node"),
        (dra.Served("v1beta2", "v1"), None, False, "node"),
    ],
)
def test_the_path(served, device, agrees, path):
    choice = dra.choose_path(served, device, plugin_agrees=agrees)
    assert choice.path == path and choice.why
    assert (choice.device, choice.version) == ((DEV, "v1beta2") if path == "dra" else (None, None))


def test_the_rule_selects_one_device_with_our_taint():
    body = dra.rule_body(
        DEV, version="v1beta2", reason="XID_79 fell off the bus", effect="None", now=NOW
    )
    assert body["apiVersion"] == "resource.k8s.io/v1beta2" and body["kind"] == "DeviceTaintRule"
    assert body["spec"] == {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "gpu-1", "device": "gpu-3"},
        "taint": {
            "key": "gpuvigil.io/gpu-isolated",
            "value": "XID_79-fell-off-the-bus",
            "effect": "None",
            "timeAdded": "2026-12-02T20:00:00Z",
        },
    }
    assert body["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpuvigil"}
    assert (
        dra.rule_body(DEV, version="v1", reason="x", effect="NoSchedule", now=NOW)["spec"]["taint"][
            "effect"
        ]
        == "NoSchedule"
    )


def test_never_no_execute():
    with pytest.raises(ValueError, match="NoExecute"):
        dra.rule_body(DEV, version="v1", reason="x", effect="NoExecute", now=NOW)  # type: ignore[arg-type]


@given(pool=st.text(min_size=1, max_size=300), device=st.text(min_size=1, max_size=80))
def test_names_and_values_are_what_the_api_accepts(pool, device):
    name = dra.rule_name(dra.Device("gpu.nvidia.com", pool, device))
    assert len(name) <= 253 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    value = dra.taint_value(pool)
    assert len(value) <= 63 and re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value)


def test_rule_names_differ_per_device():
    other = dra.Device("gpu.nvidia.com", "gpu-1", "gpu-4")
    assert dra.rule_name(DEV) != dra.rule_name(other)
    assert dra.rule_name(DEV).startswith("gpuvigil-gpu-1-gpu-3-")


def test_claims_name_the_pods_reserved_with_the_device():
    def claim(ns, device, pods):
        return {
            "metadata": {"namespace": ns, "name": "c"},
            "status": {
                "allocation": {"devices": {"results": [{
                    "request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-1", "device": device,
                }]}},
                "reservedFor": [{"resource": "pods", "name": p, "uid": "u"} for p in pods],
            },
        }  # fmt: skip

    claims = [
        claim("ml", "gpu-3", ["a", "b"]),
        claim("web", "gpu-4", ["c"]),
        claim("ml", "gpu-3", []),
    ]
    assert dra.claim_pods(claims, DEV) == ["ml/a", "ml/b"]
    assert DEV.resource_id == "gpu.nvidia.com/gpu-1/gpu-3"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gpu.nvidia.com/gpu-1/gpu-3", dra.Device("gpu.nvidia.com", "gpu-1", "gpu-3")),
        (
            "gpu.nvidia.com/rack/a/gpu-1/gpu-3",
            dra.Device("gpu.nvidia.com", "rack/a/gpu-1", "gpu-3"),
        ),
        ("", None),
        ("gpu.nvidia.com/gpu-3", None),
        ("gpu.nvidia.com//gpu-3", None),
        ("/p/d", None),
        ("x/p/" + "d" * 600, None),
    ],
)
def test_a_records_device_id_back_to_the_device(text, want):
    assert dra.parse_device(text) == want
    if want is not None:
        assert dra.parse_device(want.resource_id) == want


def test_only_our_noschedule_rule_for_the_device_enforces():
    rule = dra.rule_body(DEV, version="v1", reason="XID_79", effect="NoSchedule", now=NOW)
    assert dra.ours(rule) and dra.enforces(rule, DEV)
    dry = dra.rule_body(DEV, version="v1", reason="XID_79", effect="None", now=NOW)
    assert dra.ours(dry) and not dra.enforces(dry, DEV)  # a dry run keeps nothing off
    assert not dra.enforces(rule, dra.Device("gpu.nvidia.com", "gpu-1", "gpu-0"))
    theirs = {**rule, "metadata": {"name": rule["metadata"]["name"], "labels": {}}}
    assert not dra.ours(theirs) and not dra.enforces(theirs, DEV)
    assert not dra.enforces(None, DEV)


@given(_garbage)
def test_garbage_rules_never_raise(garbage):
    assert dra.enforces(garbage, DEV) in (True, False)
    assert dra.ours(garbage) in (True, False)
