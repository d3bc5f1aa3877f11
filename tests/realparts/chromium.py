"""Headless Chromium for pages: a screenshot, the DOM, and the console errors.

Runs Debian's chromium with the flags that keep it off the network; console messages
come from its stderr log (`--enable-logging=stderr`), where each is a `CONSOLE` line.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--enable-logging=stderr",
    "--v=0",
]


def binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def available() -> tuple[bool, str]:
    if binary() is None:
        return False, "chromium not installed (Debian chromium)"
    return True, ""


@dataclass
class PageResult:
    dom: str
    console: list[str]  # every console message line
    # Chromium's stderr log prints console.error() at INFO level like console.log(), so
    # levels cannot be told apart here: every console message counts as an error.
    errors: list[str]
    screenshot: Path | None


def render(
    url_or_path: str | Path,
    *,
    screenshot: Path | None = None,
    window: str = "1400,1800",
    timeout: float = 60,
) -> PageResult:
    """Load a page; return its DOM after scripts ran, console lines and a screenshot."""
    exe = binary()
    assert exe is not None, "chromium not installed"
    target = str(url_or_path)
    if Path(target).exists():
        target = Path(target).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="gpuvigil-chromium-") as profile:
        base = [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={window}"]
        dom = subprocess.run(
            [*base, "--virtual-time-budget=5000", "--dump-dom", target],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if screenshot is not None:
            subprocess.run(
                [*base, f"--screenshot={screenshot}", "--virtual-time-budget=5000", target],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln]
    errors = list(console)
    return PageResult(
        dom=dom.stdout,
        console=console,
        errors=errors,
        screenshot=screenshot if screenshot and screenshot.exists() else None,
    )
