"""`gpuvigil simulate --json`: the contract other tools read."""

from __future__ import annotations

import json

FIELDS = ("node_availability", "job_success_rate", "job_success_by_work", "goodput",
          "job_interruptions", "mttd_s", "mttr_s", "gpu_hours_lost", "false_cordons",
          "false_drains", "false_quarantines", "healthy_replaced", "breaker_trips",
          "jobs_censored")  # fmt: skip


def test_simulate_json_contract(run_cli):
    p = run_cli("simulate", "--nodes", "64", "--days", "5", "--seed", "2", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    names = ("baseline", "node", "platform", "full", "storm+breaker", "storm-no-breaker",
             "driver-storm+breaker", "driver-storm-no-breaker", "pool-rollout",
             "silence")  # fmt: skip
    for name in names:
        row = out[name]
        for key in FIELDS:
            assert key in row, (name, key)
        for key in ("node_availability", "job_success_rate", "goodput"):
            assert 0.0 <= row[key] <= 1.0
        assert row["nodes"] == 64 and row["seed"] == 2


def test_simulate_one_scenario_and_bad_values(run_cli):
    p = run_cli("simulate", "--scenario", "node", "--nodes", "32", "--days", "3", "--json")
    assert p.returncode == 0, p.stderr
    assert list(json.loads(p.stdout)) == ["node"]
    bad = run_cli("simulate", "--scenario", "nope")
    assert bad.returncode == 2 and "unknown scenario" in bad.stderr


def test_demo_prints_the_table_and_writes_the_report(run_cli, tmp_path):
    report = tmp_path / "r" / "report.html"
    events = tmp_path / "events.jsonl"
    p = run_cli("demo", "--nodes", "48", "--days", "4", "--report", str(report),
                "--events", str(events))  # fmt: skip
    assert p.returncode == 0, p.stderr
    for name in ("baseline", "node", "platform", "full", "storm+breaker", "pool-rollout",
                 "silence"):  # fmt: skip
        assert name in p.stdout
    assert str(report.resolve()) in p.stdout.replace("\n", "")
    html = report.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "availability" in html
    assert events.read_text().count("\n") > 48  # one node.state per node at least
