"""The HTML report in a real headless Chromium (the shared `chromium` fixture from
tests/realparts): it renders, logs no console errors, and leaves a screenshot.

A page with a console error proves the error check can fail.
"""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest

from gpuvigil.observe import synthetic
from testkit import cli_env, gpuvigil_argv

pytestmark = pytest.mark.realparts


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("html")
    events = tmp / "events.jsonl"
    synthetic.write(events, nodes=32, days=14, seed=1)
    out = tmp / "report.html"
    proc = subprocess.run(
        gpuvigil_argv("report", str(events), "--window", "14d", "--html", str(out)),
        env=cli_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


def test_report_is_self_contained(report_html: Path) -> None:
    text = report_html.read_text()
    assert not re.search(r"https?:|//[a-z]|<script|<link|@import|url\(", text, re.I)
    assert text.count("<svg") == 6


def test_report_renders_in_chromium_without_console_errors(
    report_html: Path, tmp_path: Path, chromium
) -> None:
    shot = tmp_path / "report.png"
    page = chromium.render(report_html, screenshot=shot, window="1400,2400")
    assert page.console == [] and page.errors == []
    assert page.screenshot == shot and _png_size(shot) == (1400, 2400)
    assert shot.stat().st_size > 50_000  # charts and tables, not a blank page
    assert page.dom.count("<svg") == 6 and "<polyline" in page.dom
    for title in ("Availability over time", "Failures and restarts by cause", "MTTD", "MTTR",
                  "Top offending nodes", "Top offending GPUs", "Attribution"):  # fmt: skip
        assert title in page.dom


def test_console_errors_are_detected(tmp_path: Path, chromium) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><p>x</p><script>console.error("boom"); nope();</script>')
    page = chromium.render(bad)
    # console.error() is logged at INFO level by Chromium, so the shared helper files it
    # under `console`, not `errors`: the report test above demands an empty `console`.
    assert any("boom" in m for m in page.console)
    assert any("ReferenceError" in m for m in page.errors)
