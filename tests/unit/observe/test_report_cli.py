"""`gpuvigil report` end to end in a subprocess: JSON format, windows, stdin, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from gpuvigil.commands.report import parse_duration, parse_time
from gpuvigil.core.events import Event, EventWriter
from gpuvigil.observe import synthetic


@pytest.fixture
def log(tmp_path: Path) -> Path:
    p = tmp_path / "events.jsonl"
    with EventWriter(p) as w:
        for e in [
            Event(ts=0, kind="node.state", source="c", node="n1", data={"to": "HEALTHY"}),
            Event(ts=0, kind="node.state", source="c", node="n2", data={"to": "HEALTHY"}),
            Event(ts=0, kind="job.start", source="t", job="j", data={"nodes": ["n2"], "gpus": 8}),
            Event(ts=86400, kind="finding.set", source="a", node="n2",
                  data={"code": "XID_79", "component": "gpu:3", "fatal": True,
                        "evidence_ts": 86390}),
            Event(ts=86410, kind="job.end", source="t", job="j",
                  data={"result": "failed", "exit_code": 1}),
            Event(ts=86420, kind="node.state", source="c", node="n2", data={"to": "DRAINING"}),
            Event(ts=90000, kind="node.state", source="c", node="n2", data={"to": "HEALTHY"}),
            Event(ts=2 * 86400, kind="node.state", source="c", node="n1", data={"to": "HEALTHY"}),
        ]:  # fmt: skip
            w.write(e)
    with p.open("a") as f:
        f.write('not json\n{"ts": 1, "kin')
    return p


def test_json_report(run_cli, log: Path) -> None:
    proc = run_cli("report", str(log), "--window", "all", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["format"] == "gpuvigil.report/v1"
    assert out["input"]["skipped"] == 2 and "torn last line" in " ".join(proc.stderr.split())
    assert out["slo"]["availability"]["node_seconds"] == 4 * 86400
    assert out["slo"]["mttd"]["count"] == 1 and out["slo"]["mttd"]["mean_s"] == 10
    assert out["slo"]["mttr"]["mean_s"] == 3600
    assert out["slo"]["drains"] == {
        "total": 1,
        "false_positive": 1,
        "human_releases": 0,
        "cordons": 0,
        "absorbed_incidents": 0,
    }
    [failure] = out["attribution"]["failures"]
    assert failure["cause"] == "hardware" and failure["summary"] == "Xid 79 on gpu:3 of n2"
    assert out["top_gpus"] == [{"node": "n2", "gpu": "gpu:3", "findings": 1}]
    assert set(out) == {"format", "input", "slo", "attribution", "top_nodes", "top_gpus",
                        "findings_by_code", "events_by_kind", "availability_series",
                        "figures"}  # fmt: skip
    assert out["figures"]["mttd_s"] == {"label": "MTTD", "unit": "seconds", "value": 10.0}


def test_window_ends_at_the_last_event(run_cli, log: Path) -> None:
    out = json.loads(run_cli("report", str(log), "--window", "1d", "--json").stdout)
    assert out["slo"]["window"] == {"start": 86400.0, "end": 2 * 86400.0}
    assert out["slo"]["availability"]["node_seconds"] == 2 * 86400


def test_stdin_needs_an_end_or_all(run_cli, log: Path) -> None:
    text = log.read_text()
    assert run_cli("report", "-", input=text).returncode == 2
    proc = run_cli("report", "-", "--window", "1d", "--end", "172800", "--json", input=text)
    assert proc.returncode == 0 and json.loads(proc.stdout)["input"]["sources"] == ["<stdin>"]


def test_tables_and_html(run_cli, tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    synthetic.write(events, nodes=16, days=7)
    html = tmp_path / "r.html"
    proc = run_cli("report", str(events), "--window", "7d", "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    for title in ("SLOs", "availability", "Failures and restarts by cause", "Attribution"):
        assert title in proc.stdout
    assert html.read_text().startswith("<!DOCTYPE html>")


def test_the_table_tells_the_honest_numbers(run_cli, tmp_path: Path) -> None:
    """A one-node job that finished and an eight-node job that gave up: half the jobs
    succeeded but a ninth of the work; a job still running is censored, not a success."""
    p = tmp_path / "jobs.jsonl"
    with EventWriter(p) as w:
        for job, gpus, result in (("small", 8, "succeeded"), ("big", 64, "failed")):
            w.write(Event(ts=0, kind="job.start", source="t", job=job, data={"gpus": gpus}))
            w.write(Event(ts=3600, kind="job.end", source="t", job=job,
                          data={"result": result, "allocated_gpu_s": gpus * 3600.0}))  # fmt: skip
        w.write(Event(ts=10, kind="job.start", source="t", job="long", data={"gpus": 8}))
    proc = run_cli("report", str(p), "--window", "all", env={"COLUMNS": "200"})
    assert proc.returncode in (0, 1), proc.stderr
    text = " ".join(proc.stdout.split())
    assert "1 ok, 1 failed, 0 cancelled, 1 still running (no verdict); by work 11.11%" in text
    assert "50.00%" in text


def test_no_usable_events_exits_2(run_cli, tmp_path: Path) -> None:
    p = tmp_path / "garbage"
    p.write_text("garbage\n")
    proc = run_cli("report", str(p), "--window", "all")
    assert proc.returncode == 2 and "no usable events" in proc.stderr


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("3600s", 3600), ("10", 10),
     ("1w", 604800), ("all", None), ("1.5h", 5400)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0d", "-1d", "3y", "d"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_duration(text)


def test_parse_time() -> None:
    assert parse_time("86400") == 86400
    assert parse_time("1970-01-02T00:00:00Z") == 86400
    assert parse_time("1970-01-02T00:00:00") == 86400
    with pytest.raises(typer.BadParameter):
        parse_time("yesterday")


def test_fail_on_breach(run_cli, log: Path) -> None:
    assert run_cli("report", str(log), "--window", "all").returncode == 0
    proc = run_cli("report", str(log), "--window", "all", "--json", "--fail-on-breach")
    assert proc.returncode == 1 and "SLO missed: availability, job_success" in proc.stderr
    assert json.loads(proc.stdout)["format"] == "gpuvigil.report/v1"
    ok = run_cli("report", str(log), "--window", "all", "--fail-on-breach",
                 "--availability-target", "0.5", "--job-success-target", "0")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
