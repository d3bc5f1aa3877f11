"""The HTML report in a real headless Chromium: renders, no console errors, screenshot.

Console messages are read from Chromium's own log (`--enable-logging=stderr --v=0` prints
each as `INFO:CONSOLE`); a page with a console error proves the check can fail.
"""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import require_binary
from gpuvigil.observe import synthetic

pytestmark = pytest.mark.realparts

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0",
]  # fmt: skip
CONSOLE = re.compile(r":INFO:CONSOLE[^\]]*\] (.*)")


def _chromium(tmp: Path, page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    exe = require_binary("chromium")
    profile = tmp / f"profile-{page.stem}-{len(extra)}"
    argv = [exe, *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90)


def _console(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return CONSOLE.findall(proc.stderr + proc.stdout)


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
    from conftest import cli_env, gpuvigil_argv

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
    report_html: Path, tmp_path: Path
) -> None:
    shot = tmp_path / "report.png"
    proc = _chromium(tmp_path, report_html, f"--screenshot={shot}", "--window-size=1400,2400")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _console(proc) == []
    assert _png_size(shot) == (1400, 2400)
    assert shot.stat().st_size > 50_000  # charts and tables, not a blank page
    dom = _chromium(tmp_path, report_html, "--dump-dom")
    assert dom.stdout.count("<svg") == 6 and "<polyline" in dom.stdout
    assert "Availability over time" in dom.stdout and "Attribution" in dom.stdout


def test_console_errors_are_detected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><p>x</p><script>console.error("boom"); nope();</script>')
    proc = _chromium(tmp_path, bad, f"--screenshot={tmp_path / 'bad.png'}")
    messages = _console(proc)
    assert any("boom" in m for m in messages)
    assert any("ReferenceError" in m for m in messages)
