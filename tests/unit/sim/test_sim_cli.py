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


def test_demo_table_json_and_html_show_the_same_figures(run_cli, tmp_path):
    """Done when: the demo's table, its JSON and its HTML show the same MTTD, MTTR and false
    drains (the same text for the same number: one formatter, one label)."""
    import re

    from gpuvigil.observe.figures import show
    from gpuvigil.sim.results import Results

    args = ("demo", "--nodes", "64", "--days", "6", "--seed", "3")
    table = run_cli(*args, "--report", str(tmp_path / "a.html"), env={"COLUMNS": "200"})
    as_json = run_cli(*args, "--json", "--report", str(tmp_path / "b.html"))
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr + as_json.stderr
    runs = json.loads(as_json.stdout)
    html = (tmp_path / "b.html").read_text().replace('<span class="k">', "").replace("</span>", "")
    head = [c.strip() for c in re.search(r"┃(.*run.*)┃", table.stdout).group(1).split("┃")]
    specs = {f.key: f.spec for f in Results("x", 1, 1.0, 1, "mixed").figures()}
    for name, row in runs.items():
        line = re.search(rf"│ {re.escape(name)} +│(.*)│", table.stdout).group(1)
        cells = dict(zip(head[1:], [c.strip() for c in line.split("│")], strict=True))
        html_row = re.search(rf"<tr><td>{re.escape(name)}</td>(.*?)</tr>", html).group(1)
        html_cells = re.findall(r"<td[^>]*>([^<]*)</td>", html_row)
        for key in ("mttd_s", "mttr_s", "false_drains"):
            text = show(row[key], specs[key])
            assert cells[specs[key].label] == text, (name, key)
            assert text in html_cells, (name, key, html_cells)
