"""`gpuvigil agent --help`'s "try it without a GPU" line, run as written: the agent comes up
healthy on this GPU-less machine (the line names `--expect-gpus 0`), and every series its
`/metrics` serves is a metric of docs/metrics.md (no undocumented `_created` series)."""

from __future__ import annotations

import json
import re
import shlex
import urllib.request
from pathlib import Path

import pytest

from gpuvigil import cli
from metrics_doc import belongs, documented, series
from realparts.procs import Proc, free_port, wait_until
from testkit import cli_env, gpuvigil_argv

pytestmark = pytest.mark.realparts


def try_it_line() -> list[str]:
    help_text = cli.load("agent").help or ""
    m = re.search(r"Try it without a GPU: (gpuvigil agent [^\n]+)", help_text)
    assert m, "agent --help has no try-it line"
    return shlex.split(m.group(1))


def test_try_it_line_runs_healthy_and_serves_only_documented_metrics(tmp_path: Path) -> None:
    argv = try_it_line()
    assert "--expect-gpus" in argv  # what makes it work without a GPU
    port = free_port()
    argv = [a.replace("9410", str(port)) for a in argv[1:]]
    (tmp_path / "kern.log").write_text("[    1.000000] Linux version 6.8.0\n")
    # run where the line's ./kern.log and ./report.json are: the test's folder
    agent = Proc(["/bin/sh", "-c", f"cd {shlex.quote(str(tmp_path))} && exec "
                  + shlex.join(gpuvigil_argv(*argv))], log=tmp_path / "agent.log",
                 env=cli_env())  # fmt: skip
    try:
        report = tmp_path / "report.json"
        wait_until(report.exists, timeout=90, what=f"the report ({agent.log_tail()})")
        found = json.loads(report.read_text())["findings"]
        assert not [f for f in found if f["code"] == "DRIVER_UNAVAILABLE"], found
        url = f"http://127.0.0.1:{port}/metrics"
        text = ""

        def scraped() -> bool:
            nonlocal text
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            return "gpuvigil_check_runs_total" in text

        wait_until(scraped, timeout=60, what="a check run in /metrics")
    finally:
        agent.stop()
    doc = documented()
    undocumented = sorted(
        s for s in series(text) if s.startswith("gpuvigil") and not belongs(s, doc)
    )
    assert not undocumented, undocumented
