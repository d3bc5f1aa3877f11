"""`gpuvigil agent` as a real process: faults injected while it runs show up in the state
file, /metrics and /report within one interval plus slack; a hung tool is CHECK_TIMEOUT
within its deadline while the other checks keep publishing."""

from __future__ import annotations

import json
import signal
import time

import agent_helpers
from agent_helpers import http_get, wait_until

from testkit import cli_flags

start_agent = agent_helpers.start_agent  # the fixture

INTERVAL = 1.0
SLACK = 2.5  # a 2-core machine shared by nine engineers


def tools(fake_bin, tmp_path):
    link_state = tmp_path / "link"
    link_state.write_text("up\n")
    stop_flag = tmp_path / "stop-yourself"
    link = fake_bin(
        "gpuvigil-fake-link", f"#!/bin/sh\n[ -e {stop_flag} ] && kill -STOP $$\ncat {link_state}\n"
    )
    fake_bin("gpuvigil-fake-heartbeat", "#!/bin/sh\necho ok\n")
    return link_state, stop_flag, link


def test_faults_injected_while_running_are_published(start_agent, fake_bin, tmp_path):
    link_state, stop_flag, link = tools(fake_bin, tmp_path)
    a = start_agent({}, "--interval", str(INTERVAL), site_checks=True)
    wait_until(lambda: a.report()["status"] == "OK", 10, "a healthy first report")
    status, body = http_get(a.url + "/healthz")
    assert status == 200 and json.loads(body)["ok"]
    # Every counter exists at 0 for its known label sets before anything happens, so the
    # first timeout or publish error is an increase that rate()/increase() see.
    metrics = a.metrics()
    assert 'gpuvigil_check_runs_total{check="site_link",result="timeout"} 0.0' in metrics
    assert 'gpuvigil_agent_publish_errors_total{sink="state_file"} 0.0' in metrics

    # A link goes down.
    link_state.write_text("down\n")
    t0 = time.monotonic()
    wait_until(
        lambda: ("site_link", "NVLINK_DOWN") in a.codes(),
        INTERVAL + SLACK,
        "NVLINK_DOWN in the state file",
    )
    assert time.monotonic() - t0 <= INTERVAL + SLACK
    wait_until(
        lambda: 'gpuvigil_check_status{check="site_link",component="gpu:0"} 2.0' in a.metrics(),
        INTERVAL + SLACK,
        "the metric",
    )
    wait_until(lambda: "GPUInterconnectDegraded" in http_get(a.url + "/report")[1], 2, "report")
    cond = {c["type"]: c for c in json.loads(http_get(a.url + "/report")[1])["conditions"]}
    assert cond["GPUInterconnectDegraded"]["status"] is True

    # The tool starts hanging (it stops itself with SIGSTOP): CHECK_TIMEOUT within the
    # tool's 1 s deadline plus slack, while the other check keeps running.
    link_state.write_text("up\n")
    stop_flag.touch()
    t0 = time.monotonic()
    wait_until(
        lambda: ("site_link", "CHECK_TIMEOUT") in a.codes(), INTERVAL + 1.0 + SLACK, "CHECK_TIMEOUT"
    )
    assert time.monotonic() - t0 <= INTERVAL + 1.0 + SLACK

    def heartbeat_runs() -> float:
        for line in a.metrics().splitlines():
            if line.startswith('gpuvigil_check_runs_total{check="site_heartbeat",result="ok"}'):
                return float(line.split()[-1])
        return 0.0

    before = heartbeat_runs()
    time.sleep(3 * INTERVAL)
    assert heartbeat_runs() >= before + 2  # the other check never waited
    assert ("site_link", "CHECK_TIMEOUT") in a.codes()
    assert 'gpuvigil_check_could_not_run{check="site_link"} 1.0' in a.metrics()
    status, _ = http_get(a.url + "/healthz")
    assert status == 200  # the agent itself is fine

    # The binary is deleted (a driver upgrade that drops a tool): DEPENDENCY_MISSING.
    stop_flag.unlink()
    link.unlink()
    wait_until(
        lambda: ("site_link", "DEPENDENCY_MISSING") in a.codes(),
        INTERVAL + SLACK,
        "DEPENDENCY_MISSING",
    )
    assert a.report()["status"] == "FAILED"

    # A clean stop exits 0.
    assert a.stop(signal.SIGTERM) == 0, a.log()


def test_bad_config_exits_2_naming_the_key(run_cli, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("agent:\n  fast_intervall_s: 3\n")
    p = run_cli(
        "agent",
        "--config",
        str(cfg),
        "--sink",
        "state-file",
        "--state-file",
        str(tmp_path / "r.json"),
    )
    assert p.returncode == 2 and "agent.fast_intervall_s: unknown key" in p.stderr


def test_help_stands_alone(run_cli):
    p = run_cli("agent", "--help")
    assert p.returncode == 0
    for flag in cli_flags("agent"):
        assert flag in p.stdout, flag


def test_kubernetes_sink_without_credentials_exits_2(run_cli, tmp_path):
    p = run_cli(
        "agent",
        "--sink",
        "kubernetes",
        "--node-name",
        "x",
        "--expect-gpus",
        "0",
        "--kubeconfig",
        str(tmp_path / "missing"),
        timeout=60,
    )
    assert p.returncode == 2 and "no Kubernetes credentials" in p.stderr, p.stderr
    assert "missing does not exist; pass --kubeconfig" in p.stderr
