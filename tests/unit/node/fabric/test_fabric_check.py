"""The `fabric` check end to end over fake sysfs trees, fake fi_info and the real corpus."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest

from gpuvigil.core.findings import Finding, Status
from gpuvigil.fakes.sysfs import FakeSysfs
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.checks.fabric import fabric as probe
from gpuvigil.node.checks.fabric.readings import FabricReading

pytest_plugins = ["fabric_fixtures"]  # this folder's fixtures (see fabric_fixtures.py)

FI_INFO_4 = "".join(
    f"provider: efa\n    fabric: efa\n    domain: rdmap{n}s0-{ep}\n    version: 122.0\n"
    f"    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n"
    for n in (16, 17, 18, 19)
    for ep in ("rdm", "dgrm")
)


def codes(findings: list[Finding]) -> list[tuple[str, str]]:
    return sorted((f.code, f.component) for f in findings)


def age_previous(ctx: CheckContext, seconds: float) -> None:
    """Pretend the last reading was taken `seconds` ago (rates need elapsed time)."""
    prev = ctx.facts.get(FabricReading)
    assert prev is not None
    ctx.facts.put(dataclasses.replace(prev, taken_at=prev.taken_at - timedelta(seconds=seconds)))


def test_healthy_ib_node_passes(ib_node, make_ctx, run_named):
    assert run_named("fabric", make_ctx(instance_type="dgx-h100")) == []


def test_port_down_missing_adapter_and_low_rate(ib_node, make_ctx, run_named):
    ib_node.port_down("mlx5_3")
    ib_node.remove_adapter("mlx5_5")
    ib_node.set_port("mlx5_6", rate_gbps=200)
    found = run_named("fabric", make_ctx(instance_type="dgx-h100"))
    assert codes(found) == [
        ("FABRIC_COUNT_LOW", "node"),
        ("FABRIC_PORT_DOWN", "nic:mlx5_3"),
        ("FABRIC_RATE_LOW", "nic:mlx5_6"),
    ]
    low = next(f for f in found if f.code == "FABRIC_COUNT_LOW")
    assert low.evidence["found"] == 7 and low.evidence["expected"]["count"] == 8
    assert all(f.status is Status.FAILED for f in found)


def test_config_overrides_the_catalog(ib_node, make_ctx, run_named):
    found = run_named("fabric", make_ctx(instance_type="dgx-h100", fabric={"expect_adapters": 10}))
    assert codes(found) == [("FABRIC_COUNT_LOW", "node")]
    assert found[0].evidence["expected"]["source"] == "config"


def test_adapter_patterns_ignore_storage_nics(ib_node, make_ctx, run_named):
    ib_node.add_ib("mlx5_8", link_layer="Ethernet", rate_gbps=100)
    ib_node.port_down("mlx5_8")  # a storage port down does not stop GPU traffic
    ctx = make_ctx(instance_type="dgx-h100", fabric={"adapters": ["mlx5_[0-7]"]})
    assert run_named("fabric", ctx) == []


def test_error_counters_are_judged_as_rates(ib_node, make_ctx, run_named):
    ctx = make_ctx(instance_type="dgx-h100")
    ib_node.bump_counter("mlx5_0", "symbol_error", 1000)  # an old total: not a rate
    assert run_named("fabric", ctx) == []  # first reading: nothing to compare with
    age_previous(ctx, 60)
    ib_node.bump_counter("mlx5_1", "link_downed")
    ib_node.bump_counter("mlx5_2", "symbol_error", 5)  # 300/h > 60/h
    ib_node.bump_counter("mlx5_4", "symbol_error", 1)  # 60/h: at the limit, fine
    found = run_named("fabric", ctx)
    assert codes(found) == [("FABRIC_ERRORS", "nic:mlx5_1"), ("FABRIC_ERRORS", "nic:mlx5_2")]
    by = {f.component: f for f in found}
    assert by["nic:mlx5_1"].status is Status.FAILED
    assert by["nic:mlx5_1"].evidence["delta"] == 1
    assert by["nic:mlx5_2"].status is Status.WARNING
    assert by["nic:mlx5_2"].evidence["per_hour"] == pytest.approx(300, rel=0.01)


def test_counter_reset_is_not_an_error(ib_node, make_ctx, run_named):
    ctx = make_ctx(instance_type="dgx-h100")
    ib_node.bump_counter("mlx5_0", "link_downed", 3)
    run_named("fabric", ctx)
    age_previous(ctx, 60)
    ib_node.write("sys/class/infiniband/mlx5_0/ports/1/counters/link_downed", "0\n")
    assert run_named("fabric", ctx) == []


def test_saturated_counter_is_flagged(ib_node, make_ctx, run_named):
    ib_node.bump_counter("mlx5_0", "link_downed", 255)
    found = run_named("fabric", make_ctx(instance_type="dgx-h100"))
    assert [(f.code, f.status, f.evidence.get("saturated")) for f in found] == [
        ("FABRIC_ERRORS", Status.WARNING, True)
    ]


def test_no_sysfs_and_nothing_expected_is_fine(make_ctx, run_named):
    assert run_named("fabric", make_ctx()) == []


def test_no_sysfs_when_adapters_are_expected_fails_closed(make_ctx, run_named):
    found = run_named("fabric", make_ctx(instance_type="dgx-h100"))
    assert codes(found) == [("DEPENDENCY_MISSING", "node")]


def test_unknown_configured_instance_type_fails_closed(ib_node, make_ctx, run_named):
    found = run_named("fabric", make_ctx(instance_type="p5.48xlage"))
    assert codes(found) == [("CHECK_ERROR", "node")]
    assert "not in the catalog" in found[0].message
    ok = make_ctx(instance_type="p5.48xlage", fabric={"expect_adapters": 8, "kind": "ib"})
    assert run_named("fabric", ok) == []
    ib_node.set_product_name("PowerEdge XE9680")  # an unknown DMI name is not an error
    assert run_named("fabric", make_ctx()) == []


def test_instance_type_from_dmi(tmp_path, make_ctx, run_named):
    fs = FakeSysfs.node(tmp_path / "root", kind="ib", adapters=7, product_name="DGX H100")
    assert fs.root.exists()
    assert codes(run_named("fabric", make_ctx())) == [("FABRIC_COUNT_LOW", "node")]


@pytest.mark.parametrize(
    ("rel", "text", "component"),
    [
        ("sys/class/infiniband/mlx5_2/ports/1/state", "\x00\xff garbage", "nic:mlx5_2"),
        ("sys/class/infiniband/mlx5_2/ports/1/rate", "fast", "nic:mlx5_2"),
        ("sys/class/infiniband/mlx5_2/ports/1/counters/symbol_error", "lots", "nic:mlx5_2"),
    ],
)
def test_garbage_files_fail_closed(ib_node, make_ctx, run_named, rel, text, component):
    ib_node.write(rel, text)
    found = run_named("fabric", make_ctx(instance_type="dgx-h100"))
    assert ("CHECK_ERROR", component) in codes(found)
    assert all(f.status is Status.FAILED for f in found)


def test_unreadable_and_missing_files_fail_closed(ib_node, make_ctx, run_named):
    state = ib_node.port_dir("mlx5_1") / "state"
    state.unlink()
    state.mkdir()  # reading a directory fails with EISDIR, as an unreadable file would
    (ib_node.port_dir("mlx5_2") / "phys_state").unlink()
    found = run_named("fabric", make_ctx(instance_type="dgx-h100"))
    assert codes(found) == [("CHECK_ERROR", "nic:mlx5_1"), ("CHECK_ERROR", "nic:mlx5_2")]


# --- EFA ---------------------------------------------------------------------------------
@pytest.fixture
def efa_node(tmp_path: Path) -> FakeSysfs:
    return FakeSysfs.node(tmp_path / "root", kind="efa", adapters=4, product_name="p4d.24xlarge")


def test_efa_healthy_with_fi_info(efa_node, make_ctx, run_named, fake_bin):
    fake_bin("fi_info", f"#!/bin/sh\ncat <<'X'\n{FI_INFO_4}X\n")
    assert run_named("fabric", make_ctx(path=str(fake_bin.dir))) == []


def test_efa_link_down_is_seen_through_the_interface(efa_node, make_ctx, run_named):
    efa_node.port_down("rdmap18s0")
    port = efa_node.port_dir("rdmap18s0")
    assert (port / "state").read_text().strip() == "4: ACTIVE"  # the driver still says so
    found = run_named("fabric", make_ctx())
    assert codes(found) == [("FABRIC_PORT_DOWN", "nic:rdmap18s0")]
    assert found[0].evidence["operstate"] == "down"


def test_efa_counters_show_an_impaired_device(efa_node, make_ctx, run_named):
    ctx = make_ctx()
    run_named("fabric", ctx)
    age_previous(ctx, 600)
    efa_node.bump_counter("rdmap17s0", "unresponsive_remote_events", 5)
    assert codes(run_named("fabric", ctx)) == [("FABRIC_ERRORS", "nic:rdmap17s0")]


def test_efa_missing_device_seen_by_both_sources(efa_node, make_ctx, run_named, fake_bin):
    efa_node.remove_adapter("rdmap19s0")
    three = FI_INFO_4.replace("rdmap19s0", "rdmap18s0")
    fake_bin("fi_info", f"#!/bin/sh\ncat <<'X'\n{three}X\n")
    found = run_named("fabric", make_ctx(path=str(fake_bin.dir)))
    assert codes(found) == [("FABRIC_COUNT_LOW", "node"), ("FABRIC_COUNT_LOW", "node")]
    assert {f.evidence.get("source") for f in found} == {"sysfs", "fi_info"}


@pytest.mark.parametrize(
    ("script", "code"),
    [
        ("#!/bin/sh\nsleep 30\n", "CHECK_TIMEOUT"),
        ("#!/bin/sh\n(sleep 30) &\nexec sleep 30\n", "CHECK_TIMEOUT"),
        ("#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n", "CHECK_ERROR"),
        ("#!/bin/sh\necho 'not fi_info output'\n", "CHECK_ERROR"),
        ("#!/bin/sh\necho 'fi_getinfo: -61' >&2\nexit 61\n", "FABRIC_COUNT_LOW"),
    ],
)
def test_fi_info_failures_fail_closed(efa_node, make_ctx, run_named, fake_bin, script, code):
    fake_bin("fi_info", script)
    ctx = make_ctx(path=str(fake_bin.dir), fabric={"fi_info_timeout_s": 0.5})
    found = run_named("fabric", ctx)
    assert codes(found) == [(code, "node")]
    assert found[0].status is Status.FAILED


def test_fi_info_missing_is_only_a_failure_when_required(efa_node, make_ctx, run_named):
    assert run_named("fabric", make_ctx()) == []
    found = run_named("fabric", make_ctx(fabric={"require_fi_info": True}))
    assert codes(found) == [("DEPENDENCY_MISSING", "node")]


# --- the real tree of an H100 node (../shared/corpus) ------------------------------------
def test_real_h100_tree(corpus, tmp_path, make_ctx, run_named):
    root = tmp_path / "real"
    (root / "sys/class").mkdir(parents=True)
    (root / "sys/class/infiniband").symlink_to(corpus / "network/sysfs_class_infiniband_h100_gpud")
    reading = probe.read_fabric(root)
    assert len(reading.adapters) == 9
    by = {a.name: a for a in reading.adapters}
    assert by["mlx5_bond_0"].kind == "roce" and by["mlx5_0"].kind == "ib"
    assert by["mlx5_0"].hca_type == "MT4129"
    port = by["mlx5_0"].ports[0]
    assert (port.state, port.phys_state, port.rate_gbps) == ("ACTIVE", "LinkUp", 400.0)
    assert by["mlx5_bond_0"].ports[0].rate_gbps == 200.0
    assert all(not a.problems and not a.ports[0].problems for a in reading.adapters)
    # Ground truth: 8 active 400G IB compute ports; mlx5_1's link_downed is saturated at 255.
    found = run_named("fabric", make_ctx(root, instance_type="dgx-h100"))
    assert [(f.code, f.component, f.status) for f in found] == [
        ("FABRIC_ERRORS", "nic:mlx5_1", Status.WARNING)
    ]


def test_efa_interface_found_on_a_sibling_pci_function(tmp_path, make_ctx, run_named):
    fs = FakeSysfs(tmp_path / "root")
    fs.add_pci("0000:20:00.0", vendor="0x1d0f", pci_class="0x020000", driver="ena")
    fs.write("sys/devices/pci0000:00/0000:20:00.0/net/ens32/operstate", "down\n")
    fs.add_efa("rdmap32s0", address="0000:20:00.1")  # no net/ of its own
    found = run_named("fabric", make_ctx(fabric={"kind": "efa", "expect_adapters": 1}))
    assert codes(found) == [("FABRIC_PORT_DOWN", "nic:rdmap32s0")]
    assert found[0].evidence["netdev"] == "ens32"


def test_roce_interface_found_through_the_gid_table(tmp_path):
    fs = FakeSysfs(tmp_path / "root")
    fs.add_ib("mlx5_0", link_layer="Ethernet", rate_gbps=400)
    fs.write("sys/class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0", "eth7\n")
    fs.write("sys/class/net/eth7/operstate", "up\n")
    fs.write("sys/class/net/eth7/carrier", "1\n")
    (adapter,) = probe.read_fabric(fs.root).adapters
    assert adapter.kind == "roce"
    assert [(n.name, n.operstate, n.carrier) for n in adapter.netdevs] == [("eth7", "up", 1)]
