"""`gpuvigil replay` and `simulate --policy`: recorded history and what-ifs through the policy."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from gpuvigil.core.events import Event, EventWriter, Kind
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
    assert [d["to"] for d in n1][:2] == ["DRAINING", "REMEDIATING"]  # fatal: drain at once
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


def test_simulate_policy_what_if(run_cli, tmp_path: Path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("controller:\n  safety:\n    max_disrupted: 0\n")  # never remediate
    p = run_cli("simulate", "--nodes", "96", "--days", "8", "--scenario", "platform",
                "--policy", str(policy), "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) == {"platform", "platform+policy"}
    assert out["platform+policy"]["remediations"] < out["platform"]["remediations"]
