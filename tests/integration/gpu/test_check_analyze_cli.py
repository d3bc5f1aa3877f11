"""`gpuvigil check` and `gpuvigil analyze` as a user runs them (subprocesses of this
checkout), on a fake 8-GPU node (fake NVML in the worker, fake sysfs tree) and over the
bundled example of a faulty node."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuvigil.fakes import faults, gpu
from gpuvigil.fakes.faults import Fault
from gpuvigil.fakes.sysfs import FakeSysfs

REPO = Path(__file__).resolve().parents[3]
BUNDLE = REPO / "examples" / "faulty-node"


@pytest.fixture
def fake_node(tmp_path: Path, fake_bin):
    node = gpu.make_node(8)
    scenario = tmp_path / "node.json"
    node.save(scenario)
    sysfs = FakeSysfs.node(tmp_path / "root", gpus=8, kind="ib", adapters=4)
    env = {
        gpu.SCENARIO_ENV: str(scenario),
        "GPUVIGIL__NODE__GPU__NVML_MODULE": "gpuvigil.fakes.nvml",
        # No dcgmi, dmesg or journalctl: the kernel log comes from a file below.
        "PATH": f"{fake_bin.dir}:/usr/bin:/bin",
        # Read below --sysfs-root, like every other path the checks read.
        "GPUVIGIL__NODE__KERNEL_LOG__FILE": "var/log/kern.log",
    }
    sysfs.write("var/log/kern.log", "[    1.000000] Linux version 6.1.0\n")
    return node, scenario, sysfs, env


def run_check(run_cli, env, sysfs, *extra):
    return run_cli("check", "--json", "--sysfs-root", str(sysfs.root), *extra, env=env)


def test_healthy_fake_node_exits_0(run_cli, fake_node) -> None:
    _, _, sysfs, env = fake_node
    p = run_check(run_cli, env, sysfs, "--expect-gpus", "8")
    report = json.loads(p.stdout)
    assert p.returncode == 0, p.stdout + p.stderr
    assert report["status"] == "OK"
    assert {c["check"] for c in report["checks"]} >= {"gpu", "kernel_log", "fabric", "pcie"}
    disabled = {c["check"] for c in report["checks"] if c["disabled"]}
    assert disabled == {"dcgm_health", "dcgm_diag"}


def test_skip_is_reported_as_disabled(run_cli, fake_node) -> None:
    _, _, sysfs, env = fake_node
    p = run_check(run_cli, env, sysfs, "--expect-gpus", "8", "--skip", "fabric")
    report = json.loads(p.stdout)
    assert p.returncode == 0
    (run,) = [c for c in report["checks"] if c["check"] == "fabric"]
    assert run["disabled"] and any(
        f["check"] == "fabric" and f["code"] == "CHECK_DISABLED" for f in report["findings"]
    )
    p = run_check(run_cli, env, sysfs, "--skip", "no_such_check")
    assert p.returncode == 2 and "no_such_check" in p.stderr


def test_faulty_fake_node_exits_1(run_cli, fake_node) -> None:
    node, scenario, sysfs, env = fake_node
    faults.apply(node, Fault.ECC_UNCORRECTABLE, gpu=4)
    node.save(scenario)
    p = run_check(run_cli, env, sysfs, "--expect-gpus", "8")
    assert p.returncode == 1, p.stdout + p.stderr
    codes = {(f["code"], f["component"]) for f in json.loads(p.stdout)["findings"]}
    assert ("ROW_REMAP_PENDING", "gpu:4") in codes


def test_missing_gpu_exits_1(run_cli, fake_node) -> None:
    node, scenario, sysfs, env = fake_node
    node.gpus[7].present = False
    node.save(scenario)
    p = run_check(run_cli, env, sysfs, "--expect-gpus", "8")
    assert p.returncode == 1
    assert "GPU_COUNT_LOW" in {f["code"] for f in json.loads(p.stdout)["findings"]}


def test_no_driver_on_a_gpu_node_says_so_and_exits_2(run_cli, fake_node) -> None:
    node, scenario, sysfs, env = fake_node
    node.driver_loaded = False
    node.save(scenario)
    p = run_cli("check", "--sysfs-root", str(sysfs.root), env=env)
    assert p.returncode == 2
    assert "DRIVER_UNAVAILABLE" in p.stdout and "No usable NVIDIA driver" in p.stdout


def test_no_driver_with_expect_gpus_0_checks_the_rest(run_cli, fake_node) -> None:
    node, scenario, sysfs, env = fake_node
    node.library_present = False
    node.save(scenario)
    p = run_check(run_cli, env, sysfs, "--expect-gpus", "0")
    assert p.returncode == 0, p.stdout
    assert {c["check"] for c in json.loads(p.stdout)["checks"]} >= {"fabric", "pcie"}


def test_hung_nvml_exits_2_quickly(run_cli, fake_node) -> None:
    node, scenario, sysfs, env = fake_node
    node.gpus[2].hang = True
    node.save(scenario)
    env = {**env, "GPUVIGIL__NODE__GPU__NVML_TIMEOUT_S": "2"}
    p = run_check(run_cli, env, sysfs, "--expect-gpus", "8")
    assert p.returncode == 2
    (f,) = [f for f in json.loads(p.stdout)["findings"] if f["code"] == "CHECK_TIMEOUT"]
    assert f["component"] == "gpu:2"


def test_bad_config_exits_2(run_cli, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("node:\n  gpu:\n    nvml_modul: x\n")
    p = run_cli("check", "--config", str(cfg))
    assert p.returncode == 2 and "nvml_modul" in p.stderr


def test_analyze_bundle(run_cli) -> None:
    p = run_cli(
        "analyze",
        "--json",
        "--nvidia-smi-xml",
        str(BUNDLE / "nvidia-smi-q-x.xml"),
        "--kmsg",
        str(BUNDLE / "dmesg.txt"),
        "--dcgm-diag",
        str(BUNDLE / "dcgmi-diag-r1.json"),
        "--sysfs",
        str(BUNDLE / "sysfs.tar.gz"),
        "--instance-type",
        "p5.48xlarge",
    )
    assert p.returncode == 1, p.stdout + p.stderr
    found = {(f["code"], f["component"]) for f in json.loads(p.stdout)["findings"]}
    assert {
        ("GPU_LOST", "gpu:3"),
        ("XID_79", "gpu:3"),
        ("ROW_REMAP_PENDING", "gpu:5"),
        ("ECC_UNCORRECTED_VOLATILE", "gpu:5"),
        ("GPU_RECOVERY_REQUIRED", "gpu:5"),
        ("POWER_BRAKE", "gpu:6"),
        ("PCIE_DEGRADED", "gpu:2"),
        ("DCGM_DIAG_FAIL", "gpu:2"),
        ("DCGM_DIAG_FAIL", "gpu:5"),
        ("XID_13", "gpu:0"),
        ("FABRIC_COUNT_LOW", "node"),
        ("FABRIC_PORT_DOWN", "nic:rdmap36s0"),
    } <= found


def test_analyze_the_bundle_folder_as_is(run_cli) -> None:
    # The same bundle given as a folder: kinds told from content, the archive unpacked, the
    # README named and not judged; the same findings as with the forcing flags.
    p = run_cli("analyze", "--json", str(BUNDLE), "--instance-type", "p5.48xlarge")
    assert p.returncode == 1, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    kinds = {Path(i["path"].split(":")[0]).name: i["kind"] for i in doc["inputs"]}
    assert kinds == {
        "README.md": None,
        "dcgmi-diag-r1.json": "dcgmi-diag",
        "nvidia-smi-q-x.xml": "nvidia-smi-xml",
        "sysfs.tar.gz": "sysfs",
        "dmesg.txt": "kernel-log",
    }
    found = {(f["code"], f["component"]) for f in doc["findings"]}
    assert {
        ("XID_79", "gpu:3"),
        ("GPU_LOST", "gpu:3"),
        ("FABRIC_PORT_DOWN", "nic:rdmap36s0"),
    } <= found
    # The bundle's README is listed as skipped and never judged (no finding, no exit 2).
    assert not [f for f in doc["findings"] if f["component"].endswith("README.md")]
    readme = next(i for i in doc["inputs"] if i["path"].endswith("README.md"))
    assert readme["how"].startswith("skipped: not an output") and readme["status"] == "OK"


def test_analyze_table_output_and_pasted_dcgm_table(run_cli, tmp_path: Path) -> None:
    table = Path(__file__).parents[2] / "unit/node/gpu/data/dcgm/diag_v3_table_fail.txt"
    p = run_cli("analyze", "--dcgm-diag", str(table))
    assert p.returncode == 1 and "DCGM_DIAG_FAIL" in p.stdout and "gpu:2" in p.stdout


def test_analyze_unreadable_input_exits_2(run_cli, tmp_path: Path) -> None:
    p = run_cli("analyze", "--nvidia-smi-xml", str(tmp_path / "nope.xml"), "--json")
    assert p.returncode == 2
    assert json.loads(p.stdout)["findings"][0]["code"] == "DEPENDENCY_MISSING"
    garbage = tmp_path / "g.xml"
    garbage.write_bytes(os.urandom(2000))
    p = run_cli("analyze", "--nvidia-smi-xml", str(garbage), "--json")
    assert p.returncode == 2
    assert json.loads(p.stdout)["findings"][0]["code"] == "CHECK_ERROR"


def test_analyze_bad_sysfs_tarball_fails_closed(run_cli, tmp_path: Path) -> None:
    bad = tmp_path / "sysfs.tar.gz"
    bad.write_bytes(b"not a tarball")
    p = run_cli("analyze", "--sysfs", str(bad), "--json")
    assert p.returncode == 2
    assert json.loads(p.stdout)["findings"][0]["code"] == "CHECK_ERROR"


def test_analyze_without_inputs_exits_2(run_cli) -> None:
    p = run_cli("analyze")
    assert p.returncode == 2 and "at least one PATH" in p.stderr


# `gpuvigil demo` is the fleet simulator's now: tests/unit/sim/test_cli.py covers it.
