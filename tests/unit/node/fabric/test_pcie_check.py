"""The `pcie` check over fake sysfs trees: GPUs and adapters, degraded and garbled links."""

from __future__ import annotations

from gpuvigil.core.findings import Finding, Status
from gpuvigil.node.checks.pcie import pcie as probe

pytest_plugins = ["fabric_fixtures"]  # this folder's fixtures (see fabric_fixtures.py)


def codes(findings: list[Finding]) -> list[tuple[str, str]]:
    return sorted((f.code, f.component) for f in findings)


def test_healthy_links_pass(ib_node, make_ctx, run_named):
    reading = probe.read_pcie(ib_node.root)
    assert [link.role for link in reading.links].count("gpu") == 8
    assert [link.role for link in reading.links].count("nic") == 8
    assert run_named("pcie", make_ctx()) == []


def test_narrow_gpu_and_slow_adapter_are_degraded(ib_node, make_ctx, run_named):
    gpu2 = sorted(p.name for p in (ib_node.root / "sys/bus/pci/devices").iterdir())[2]
    ib_node.degrade_link(gpu2, width=8)
    ib_node.degrade_link("mlx5_4", speed_gts=16.0)
    found = run_named("pcie", make_ctx())
    assert codes(found) == [("PCIE_DEGRADED", "gpu:2"), ("PCIE_DEGRADED", "nic:mlx5_4")]
    gpu = next(f for f in found if f.component == "gpu:2")
    assert (gpu.evidence["width"], gpu.evidence["max_width"]) == (8, 16)
    assert gpu.evidence["pci_address"] == gpu2


def test_idle_gpu_speed_is_judged_only_on_request(ib_node, make_ctx, run_named):
    gpu0 = sorted(p.name for p in (ib_node.root / "sys/bus/pci/devices").iterdir())[0]
    ib_node.degrade_link(gpu0, speed_gts=2.5)  # an idle H100 drops to Gen1
    assert run_named("pcie", make_ctx()) == []
    found = run_named("pcie", make_ctx(fabric={"pcie_judge_gpu_speed": True}))
    assert codes(found) == [("PCIE_DEGRADED", "gpu:0")]


def test_link_down(ib_node, make_ctx, run_named):
    ib_node.degrade_link("mlx5_0", width=0)
    found = run_named("pcie", make_ctx())
    assert codes(found) == [("PCIE_DEGRADED", "nic:mlx5_0")]
    assert "down" in found[0].message


def test_garbage_and_unreadable_fail_closed(ib_node, make_ctx, run_named):
    ib_node.write(f"sys/devices/pci0000:00/{ib_node.pci_of['mlx5_1']}/max_link_width", "wide")
    gpu0 = sorted(p.name for p in (ib_node.root / "sys/bus/pci/devices").iterdir())[0]
    speed = ib_node.pci_dir(gpu0) / "current_link_speed"
    speed.unlink()
    found = run_named("pcie", make_ctx())
    assert codes(found) == [("CHECK_ERROR", "gpu:0"), ("CHECK_ERROR", "nic:mlx5_1")]
    assert all(f.status is Status.FAILED for f in found)


def test_missing_pci_tree_fails_closed(make_ctx, run_named):
    found = run_named("pcie", make_ctx())
    assert codes(found) == [("DEPENDENCY_MISSING", "node")]


def test_speed_parser_forms():
    assert probe.parse_speed("16.0 GT/s PCIe") == (16.0, True)
    assert probe.parse_speed("8 GT/s") == (8.0, True)
    assert probe.parse_speed("Unknown") == (None, True)
    assert probe.parse_speed("2.5 GT/s PCIe\n") == (2.5, True)
    assert probe.parse_speed("garbage") == (None, False)
