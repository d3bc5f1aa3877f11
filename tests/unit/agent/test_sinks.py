"""Sinks without a cluster: state file atomicity, condition merging (pure), the Slurm
drain logic against a fake scontrol, remediation idempotency, metrics, the watchdog."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuvigil.core.findings import Action, CheckRun, Finding, NodeReport, Status, utcnow
from gpuvigil.core.wire import RemediationRequest, RemediationResult
from gpuvigil.node import metrics as agent_metrics
from gpuvigil.node.sinks import SinkWorker
from gpuvigil.node.sinks import slurm as sl
from gpuvigil.node.sinks.http import HttpConfig, HttpSink
from gpuvigil.node.sinks.kubernetes import merge_conditions
from gpuvigil.node.sinks.remediation import RemediationConfig, Remediator
from gpuvigil.node.sinks.state_file import read_report, write_atomic
from gpuvigil.node.watchdog import Watchdog

XID79 = Finding(
    check="kernel_log_stream",
    status=Status.FAILED,
    code="XID_79",
    component="gpu:3",
    action=Action.REBOOT,
    fatal=True,
    message="fell off the bus",
)


def report(*findings: Finding) -> NodeReport:
    return NodeReport(node="gpu1", findings=findings)


def test_state_file_is_replaced_atomically_and_reads_back(tmp_path: Path):
    path = tmp_path / "run" / "report.json"
    r = report(XID79)
    write_atomic(path, r.model_dump_json().encode())
    assert read_report(path) == r
    assert read_report(path).status is Status.FAILED
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]  # no temp files left
    path.write_text("{torn")
    assert read_report(path) is None  # readers fail closed on garbage


def test_conditions_keep_transition_time_until_status_changes():
    t0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    foreign = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    conds, flipped = merge_conditions([foreign], report(XID79), now=t0)
    assert "Ready" not in {c["type"] for c in conds}  # never touch what we do not own
    xid = next(c for c in conds if c["type"] == "GPUXidError")
    assert xid["status"] == "True" and xid["reason"] == "XID_79"
    assert [n["type"] for n, _ in flipped] == ["GPUXidError"]  # only problems flip at first
    t1 = t0 + timedelta(minutes=1)
    conds2, flipped2 = merge_conditions(conds, report(XID79), now=t1)
    xid2 = next(c for c in conds2 if c["type"] == "GPUXidError")
    assert xid2["lastTransitionTime"] == "2026-11-30T08:00:00Z"
    assert xid2["lastHeartbeatTime"] == "2026-11-30T08:01:00Z" and flipped2 == []
    conds3, flipped3 = merge_conditions(conds2, report(), now=t1 + timedelta(minutes=1))
    xid3 = next(c for c in conds3 if c["type"] == "GPUXidError")
    assert xid3["status"] == "False" and xid3["lastTransitionTime"] == "2026-11-30T08:02:00Z"
    assert [(n["type"], o["reason"]) for n, o in flipped3] == [("GPUXidError", "XID_79")]


def test_drain_trigger_prefers_fatal_and_drain_on_fatal_ignores_could_not_run():
    timeout = Finding(check="nvml", status=Status.FAILED, code="CHECK_TIMEOUT")
    assert sl.drain_trigger(report(timeout), drain_on="blocked") == timeout  # the default
    assert sl.drain_trigger(report(timeout), drain_on="fatal") is None
    assert sl.drain_trigger(report(timeout, XID79), drain_on="fatal") == XID79
    assert sl.drain_trigger(report(timeout), drain_on="failed") == timeout
    assert sl.drain_reason(XID79) == "gpuvigil:SUSPECT:-:XID_79 gpu:3"


def test_parse_show_node_keeps_reason_with_spaces():
    # As Slurm 22.05.8 prints it (measured): OS has spaces, Reason comes before Extra.
    line = (
        "NodeName=gpu1 Arch=x86_64 CoresPerSocket=1  OS=Linux 6.1 #1 SMP PREEMPT_DYNAMIC "
        "@0  State=IDLE+DRAIN ThreadsPerCore=1 Reason=gpuvigil: XID_79 gpu:3 "
        '[root@2026-11-30T08:00:00] Extra={"v":1}\n'
    )
    info = sl.parse_show_node(line)
    assert info["State"] == "IDLE+DRAIN" and info["Reason"] == "gpuvigil: XID_79 gpu:3"
    assert info["Extra"] == '{"v":1}' and sl.is_drained(info)
    assert info["OS"] == "Linux 6.1 #1 SMP PREEMPT_DYNAMIC @0"
    assert sl.parse_show_node("") == {} and sl.parse_show_node("garbage ===") is not None


FAKE_SCONTROL = """#!/bin/sh
# state in $STATE: line 1 State, line 2 Reason
echo "$@" >> "$STATE.calls"
case "$1" in
show) printf 'NodeName=gpu1 State=%s Reason=%s\\n' "$(sed -n 1p $STATE)" "$(sed -n 2p $STATE)";;
update)
  for a in "$@"; do case "$a" in
    State=DRAIN) st=IDLE+DRAIN;; State=RESUME) st=IDLE; printf 'IDLE\\n\\n' > $STATE;;
    Reason=*) printf '%s\\n%s\\n' "$st" "${a#Reason=}" > $STATE;;
  esac; done;;
esac
"""


def test_standalone_drains_on_fatal_and_resumes_only_its_own_drain(fake_bin, tmp_path):
    state = tmp_path / "state"
    state.write_text("IDLE\n\n")
    fake_bin("scontrol", FAKE_SCONTROL)
    env = {"PATH": f"{fake_bin.dir}:{os.environ['PATH']}", "STATE": str(state)}
    cfg = sl.SlurmConfig(enabled=True, mode="standalone", marker_path=tmp_path / "marker")
    node = sl.SlurmNode("gpu1", config=cfg, env=env)
    assert sl.reconcile_drain(node, report(XID79), config=cfg) == "drained"
    assert state.read_text().splitlines() == ["IDLE+DRAIN", "gpuvigil:SUSPECT:-:XID_79 gpu:3"]
    assert sl.reconcile_drain(node, report(XID79), config=cfg) == "already drained"
    assert sl.reconcile_drain(node, report(), config=cfg) == "resumed"
    assert state.read_text().startswith("IDLE\n")
    # An admin's drain is never undone, even with our marker around.
    sl.reconcile_drain(node, report(XID79), config=cfg)
    state.write_text("IDLE+DRAIN\nadmin: bad fan\n")
    assert sl.reconcile_drain(node, report(), config=cfg) == "not ours"
    assert state.read_text().splitlines()[1] == "admin: bad fan"


def test_remediation_is_idempotent_by_request_id(fake_bin, tmp_path):
    log = tmp_path / "resets"
    fake_bin("nvidia-smi", f'#!/bin/sh\necho "$@" >> {log}\n')
    env = {"PATH": f"{fake_bin.dir}:{os.environ['PATH']}"}
    rem = Remediator(RemediationConfig(boot_id_path=tmp_path / "boot"), env=env)
    answers: list[RemediationResult] = []
    req = RemediationRequest(id="r1", action="RESET_GPU", gpus=(3, 5), at=utcnow())
    rem.handle(req, None, answers.append)
    rem.handle(req, answers[-1], answers.append)  # while running: nothing new
    deadline = time.monotonic() + 5
    while len(answers) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [a.result for a in answers] == ["started", "succeeded"]
    assert answers[0].detail == "resetting GPU 3, 5"  # what it does, not "RESET_GPU started"
    rem.handle(req, answers[-1], answers.append)  # done: never run again
    assert log.read_text().splitlines() == ["--gpu-reset -i 3", "--gpu-reset -i 5"]
    # An agent that died mid-reset answers failed instead of resetting twice.
    fresh = Remediator(RemediationConfig(), env=env)
    fresh.handle(req, answers[0], answers.append)  # its ledger says `started`
    assert answers[-1].result == "failed" and len(log.read_text().splitlines()) == 2


def test_reboot_succeeds_only_when_the_boot_id_changes(fake_bin, tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("aaa\n")
    fake_bin("systemctl", "#!/bin/sh\nexit 0\n")
    env = {"PATH": f"{fake_bin.dir}:{os.environ['PATH']}"}
    rem = Remediator(RemediationConfig(boot_id_path=boot), env=env)
    answers: list[RemediationResult] = []
    req = RemediationRequest(id="b1", action="REBOOT", at=utcnow())
    rem.handle(req, None, answers.append)
    assert answers[0].result == "started" and answers[0].boot_id == "aaa"
    assert answers[0].detail == "rebooting from boot aaa"
    time.sleep(0.3)
    rem.handle(req, answers[0], answers.append)
    assert len(answers) == 1  # command accepted, node not rebooted yet
    boot.write_text("bbb\n")  # the agent after the reboot: a new boot id
    Remediator(RemediationConfig(boot_id_path=boot), env=env).handle(
        req, answers[0], answers.append
    )
    assert answers[-1].result == "succeeded"


def _scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One real HTTP scrape of the agent's /metrics, parsed with prometheus_client's parser."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_metrics_follow_the_report_at_scrape_time():
    reg = CollectorRegistry()
    m = agent_metrics.build(reg)
    sink = HttpSink(HttpConfig(listen="127.0.0.1:0"), registry=reg, health=lambda: (True, {}))
    timeout = Finding(check="nvml", status=Status.FAILED, code="CHECK_TIMEOUT")
    r = NodeReport(
        node="gpu1",
        findings=(XID79, timeout),
        checks=(
            CheckRun(
                check="nvml", status=Status.FAILED, started_at=datetime.now(UTC), duration_s=0.1
            ),
            CheckRun(check="pcie", status=Status.OK, started_at=datetime.now(UTC), duration_s=0.1),
        ),
    )
    try:
        # Before the first report nothing is rendered: an empty report would read healthy.
        assert not any(n == "gpuvigil_check_status" for n, _ in _scrape(sink.address))
        agent_metrics.observe_report(m, r)
        agent_metrics.observe_run(m, [timeout], r.checks[0], now_s=5.0)
        v = _scrape(sink.address)

        def at(name: str, **labels: str) -> float | None:
            return v.get((name, tuple(sorted(labels.items()))))

        assert at("gpuvigil_check_status", check="kernel_log_stream", component="gpu:3") == 2
        assert at("gpuvigil_check_status", check="pcie", component="node") == 0
        assert at("gpuvigil_check_could_not_run", check="nvml") == 1
        assert at("gpuvigil_check_could_not_run", check="pcie") == 0
        assert at("gpuvigil_node_condition", condition="GPUXidError") == 1
        assert at("gpuvigil_node_condition", condition="GPUThermal") == 0
        assert at("gpuvigil_check_runs_total", check="nvml", result="timeout") == 1
        assert at("gpuvigil_check_last_success_timestamp_seconds", check="nvml") is None
        # The next report no longer has the Xid: the next scrape lacks its series, the
        # others stay, with no clean-up by the agent.
        agent_metrics.observe_report(m, r.model_copy(update={"findings": (timeout,)}))
        v = _scrape(sink.address)
        assert at("gpuvigil_check_status", check="kernel_log_stream", component="gpu:3") is None
        assert at("gpuvigil_check_status", check="pcie", component="node") == 0
        assert at("gpuvigil_node_condition", condition="GPUXidError") == 0
    finally:
        sink.close()


def test_sink_worker_retries_with_the_newest_report():
    seen: list[str] = []
    fail = {"n": 2}

    class Flaky:
        name = "flaky"

        def publish(self, r: NodeReport) -> None:
            if fail["n"]:
                fail["n"] -= 1
                raise ConnectionError("api down")
            seen.append(r.node)

        def close(self) -> None:
            pass

    w = SinkWorker(Flaky(), backoff_initial_s=0.05)
    w.start()
    w.submit(NodeReport(node="old"))
    w.submit(NodeReport(node="new"))
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    assert seen == ["new"] and w.last_error is None


def test_watchdog_fires_when_the_loop_stops_beating():
    fired = threading.Event()
    dog = Watchdog(0.2, on_stall=lambda age: fired.set())
    dog.start()
    for _ in range(5):
        dog.beat()
        time.sleep(0.05)
    assert not fired.is_set()
    assert fired.wait(2)


def test_default_watchdog_exits_the_process_with_status_3():
    code = (
        "from gpuvigil.node.watchdog import Watchdog; import time; "
        "Watchdog(0.2).start(); time.sleep(10)"
    )
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "PYTHONPATH": "src"},
    )
    assert p.returncode == 3 and time.monotonic() - t0 < 5
    assert "stalled" in p.stderr
