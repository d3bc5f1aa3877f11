"""`gpuvigil replay` and `simulate --policy`: recorded history and what-ifs through the policy."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.core.events import Event, EventWriter, Kind
from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.sim import replay

T = datetime(2026, 3, 1, tzinfo=UTC).timestamp()


def _events(path: Path) -> Path:
    with EventWriter(path) as w:
        w.write(
            Event(
                ts=T,
                kind=Kind.FINDING_SET,
                source="agent",
                node="n1",
                data={
                    "code": "XID_79",
                    "component": "gpu:2",
                    "status": "FAILED",
                    "action": "REBOOT",
                    "fatal": True,
                    "check": "kernel_log",
                },
            )
        )
        w.write(
            Event(
                ts=T + 5,
                kind=Kind.FINDING_SET,
                source="agent",
                node="n2",
                data={
                    "code": "XID_13",
                    "component": "gpu:0",
                    "status": "WARNING",
                    "action": "RESTART_APP",
                    "check": "kernel_log",
                },
            )
        )
        w.write(Event(ts=T + 3600, kind=Kind.FINDING_CLEARED, source="agent", node="n1",
                      data={"code": "XID_79", "component": "gpu:2", "status": "FAILED",
                            "action": "REBOOT", "check": "kernel_log"}))  # fmt: skip
    return path


def test_event_history_through_the_default_policy(tmp_path: Path):
    path = _events(tmp_path / "events.jsonl")
    assert replay.is_event_log(path)
    r = replay.replay(replay.changes_from_events([path]))
    assert r.nodes == 2
    n1 = [d for d in r.decisions if d["node"] == "n1" and d["kind"] == "node.state"]
    # fatal: blocked at once, drained after fatal_grace_s (the breaker judges a burst first)
    assert [d["to"] for d in n1][:3] == ["SUSPECT", "DRAINING", "REMEDIATING"]
    assert any(d.get("action") == "REBOOT" for d in r.decisions)
    assert not [d for d in r.decisions if d["node"] == "n2"]  # an app Xid: left alone
    assert r.decisions[0]["ts"] >= T


def test_replay_cli_on_events_and_kernel_logs(run_cli, tmp_path: Path):
    path = _events(tmp_path / "events.jsonl")
    policy = tmp_path / "policy.yaml"
    policy.write_text("controller:\n  policy:\n    suspect_grace_s: 60\n")
    p = run_cli("replay", str(path), "--policy", str(policy), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["counts"]["REBOOT"] >= 1
    log = tmp_path / "gpu-node-7.log"
    log.write_text(
        "[Sun Mar  1 10:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, "
        "GPU has fallen off the bus.\n"
    )
    p = run_cli("replay", str(log), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["nodes"] == 1 and out["counts"].get("to DRAINING") == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("controller:\n  nope: 1\n")
    p = run_cli("replay", str(path), "--policy", str(bad))
    assert p.returncode == 2 and "nope" in p.stderr


def test_replay_of_an_empty_input_exits_2_saying_so(run_cli, tmp_path: Path):
    empty = tmp_path / "events.jsonl"
    empty.write_text("")
    p = run_cli("replay", str(empty))
    assert p.returncode == 2 and "events.jsonl: empty, nothing to replay" in p.stderr
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    assert run_cli("replay", str(blank), "--json").returncode == 2
    nothing = tmp_path / "other.jsonl"  # an event log, but no node and no change in it
    nothing.write_text('{"ts": 1, "kind": "job.start", "source": "training"}\n')
    p = run_cli("replay", str(nothing))
    assert p.returncode == 2 and "nothing to replay" in p.stderr


def test_simulate_policy_what_if(run_cli, tmp_path: Path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("controller:\n  safety:\n    max_disrupted: 0\n")  # never remediate
    p = run_cli("simulate", "--nodes", "96", "--days", "8", "--scenario", "platform",
                "--policy", str(policy), "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) == {"platform", "platform+policy"}
    assert out["platform+policy"]["remediations"] < out["platform"]["remediations"]


def test_replay_real_kernel_logs_from_the_corpus(corpus: Path):
    """Real logs (ground truth in the corpus MANIFEST): application Xids 13/43 are left
    alone; Xid 79 (fallen off the bus) and 119 (GSP) get drained and remediated."""
    logs = corpus / "kernel_logs"
    from gpuvigil.node.config import NodeConfig

    app = replay.replay(replay.changes_from_kernel_logs(
        [logs / "xid13_43_dmesg-decode-iso_gpud-testdata.log"], config=NodeConfig()),
        steps_work=True)  # fmt: skip
    assert app.changes > 0
    assert not [d for d in app.decisions if d.get("to") == "DRAINING"]
    hw = replay.replay(replay.changes_from_kernel_logs(
        [logs / "xid79_sxid20034_hgx_gpud-sxid-readme.log",
         logs / "xid119_h100-xe9680_dmesg-ctime_gpud-testdata.log"], config=NodeConfig()),
        steps_work=True)  # fmt: skip
    drained = {d["node"] for d in hw.decisions if d.get("to") == "DRAINING"}
    assert drained == {"xid79_sxid20034_hgx_gpud-sxid-readme",
                       "xid119_h100-xe9680_dmesg-ctime_gpud-testdata"}  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=400))
def test_replay_inputs_never_raise_on_garbage(tmp_path_factory, data: bytes):
    path = tmp_path_factory.mktemp("g") / "n1.log"
    path.write_bytes(data)
    from gpuvigil.node.config import NodeConfig

    replay.is_event_log(path)
    list(replay.changes_from_events([path]))
    list(replay.changes_from_kernel_logs([path], config=NodeConfig()))


def test_the_fleet_size_scales_the_breaker() -> None:
    """Three nodes lose a GPU at once. In a fleet of three that is beyond chance and the
    breaker trips; in a 1,000-node fleet (nodes the log names without a problem) three is
    what independent faults explain, so the controller repairs them."""
    finding = Finding(check="kernel_log", code="XID_79", status=Status.FAILED,
                      component="gpu:2", action=Action.REBOOT, fatal=True)  # fmt: skip
    changes = [(T + i, f"n{i}", [finding]) for i in range(3)]
    small = replay.replay(changes, fleet=3).counts()
    large = replay.replay(changes, fleet=1000).counts()
    assert small.get("breaker trips", 0) >= 1 and "REBOOT" not in small
    assert "breaker trips" not in large and large.get("REBOOT", 0) >= 1
