"""A running `gpuvigil agent` for the observe integration tests (real process, loopback).

Test modules import the fixture: `from observe_agent import agent_fixture` and ask for
`agent`.

No GPU here: the agent's GPU checks fail closed, which is what it must do. Its kernel log
holds one Xid line. Needs the agent (branch `agent`); under CI its absence fails.
"""

from __future__ import annotations

import importlib.util
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from realparts.procs import Proc, free_port, wait_until
from testkit import cli_env, gpuvigil_argv, require

XID_LINE = "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"


@dataclass
class RunningAgent:
    address: str  # HOST:PORT of /metrics
    events: Path  # its JSONL event log
    proc: Proc


def _has_agent() -> bool:
    return importlib.util.find_spec("gpuvigil.node.metrics") is not None


@pytest.fixture(name="agent")
def agent_fixture(tmp_path: Path) -> Iterator[RunningAgent]:
    require(_has_agent(), "the agent (branch agent) is not in this checkout")
    kern = tmp_path / "kern.log"
    kern.write_text(XID_LINE)
    events = tmp_path / "events.jsonl"
    port = free_port()
    argv = gpuvigil_argv(
        "agent", "--kmsg-file", str(kern), "--state-file", str(tmp_path / "report.json"),
        "--listen", f"127.0.0.1:{port}", "--interval", "2", "--node-name", "node-17",
        "--sink", "state-file", "--sink", "http", "--events-file", str(events),
    )  # fmt: skip
    proc = Proc(argv, log=tmp_path / "agent.log", env=cli_env())
    url = f"http://127.0.0.1:{port}/metrics"

    def serving() -> bool:
        if not proc.alive():
            raise RuntimeError("agent exited:\n" + proc.log_tail())
        with urllib.request.urlopen(url, timeout=2) as r:
            return b"gpuvigil_agent_info" in r.read()

    try:
        wait_until(serving, timeout=60, interval=0.2, what="agent /metrics")
        yield RunningAgent(f"127.0.0.1:{port}", events, proc)
    finally:
        proc.stop()
