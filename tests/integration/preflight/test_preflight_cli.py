"""`gpuvigil preflight` end to end, in a subprocess, on the CPU."""

from __future__ import annotations

import json

import pytest

from gpuvigil.fakes.sysfs import FakeSysfs

pytestmark = pytest.mark.usefixtures("need_torch")


def test_cpu_preflight_passes_and_reports_every_measurement(run_cli):
    p = run_cli("preflight", "--device", "cpu", "--expect-gpus", "0", "--json", timeout=60)
    assert p.returncode == 0, p.stderr + p.stdout[-2000:]
    out = json.loads(p.stdout)
    assert out["result"] == "pass" and out["exit_code"] == 0 and out["device"] == "cpu"
    checks = {m["check"] for m in out["measurements"]}
    assert checks == {"matmul", "memory", "bandwidth", "load", "allreduce"}
    assert out["duration_s"] < out["budget_s"]
    assert out["report"]["status"] == "OK"
    load = [m for m in out["measurements"] if m["check"] == "load"]
    assert all(m["achieved"] > 0 and m["unit"] == "TFLOP/s" for m in load)


def test_fabric_fault_fails_preflight(run_cli, tmp_path):
    fs = FakeSysfs.node(tmp_path / "root", gpus=0, kind="ib", adapters=8)
    fs.port_down("mlx5_2")
    p = run_cli(
        "preflight",
        "--device",
        "cpu",
        "--expect-gpus",
        "0",
        "--checks",
        "matmul",
        "--instance-type",
        "dgx-h100",
        "--sysfs-root",
        str(fs.root),
        "--json",
        timeout=60,
    )
    assert p.returncode == 1, p.stderr
    out = json.loads(p.stdout)
    problems = {
        (f["code"], f["component"]) for f in out["report"]["findings"] if f["status"] == "FAILED"
    }
    assert problems == {("FABRIC_PORT_DOWN", "nic:mlx5_2")}
    assert out["result"] == "fail"


def test_table_output_and_bad_config(run_cli, tmp_path):
    p = run_cli(
        "preflight", "--device", "cpu", "--expect-gpus", "0", "--checks", "matmul", timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert "preflight PASSED" in p.stdout and "fp32_max_error" in p.stdout
    bad = tmp_path / "gpuvigil.yaml"
    bad.write_text("preflight:\n  budget: 10\n")
    p = run_cli("preflight", "--config", str(bad), "--device", "cpu", timeout=60)
    assert p.returncode == 2
    assert "preflight.budget" in p.stderr and "unknown key" in p.stderr


def test_bad_peer_arguments_are_exit_2(run_cli):
    p = run_cli("preflight", "--device", "cpu", "--master", "host-without-port", timeout=60)
    assert p.returncode == 2 and "HOST:PORT" in p.stderr
    p = run_cli("preflight", "--device", "cpu", "--master", "10.0.0.1:29533", timeout=60)
    assert p.returncode == 2 and "preflight.active.peers.nnodes" in p.stderr


def test_all_reduce_across_two_nodes(run_cli):
    """Two preflight processes on loopback as two nodes of two CPU devices each (gloo)."""
    from concurrent.futures import ThreadPoolExecutor

    from gpuvigil.io.ports import free_port

    port = free_port()
    env = {"GPUVIGIL__PREFLIGHT__ACTIVE__EXPECTED__INTERNODE_BUSBW_GBS": "0.00001"}

    def node(rank: int):
        return run_cli(
            "preflight",
            "--device",
            "cpu",
            "--expect-gpus",
            "0",
            "--skip-fast",
            "--checks",
            "allreduce",
            "--master",
            f"127.0.0.1:{port}",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--json",
            env=env,
            timeout=120,
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(node, (0, 1)))
    for p in results:
        assert p.returncode == 0, p.stderr[-2000:] + p.stdout[-2000:]
        ms = {m["evidence"]["scope"]: m for m in json.loads(p.stdout)["measurements"]}
        assert set(ms) == {"node", "cluster"}
        cluster = ms["cluster"]
        assert cluster["component"] == "fabric" and cluster["evidence"]["world"] == 4
        assert cluster["achieved"] > cluster["expected"] == 0.00001
