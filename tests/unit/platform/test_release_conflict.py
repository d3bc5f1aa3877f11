"""`gpuvigil release` against a Node another writer changes between its read and its
store (the agent patches its status every sweep): it reads again and decides again, never
ends on the API server's 409; a writer that never stops still ends it, with exit 2."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from gpuvigil.cli import app
from gpuvigil.core.findings import utcnow
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.state import Record, State


class Busy(MemoryCluster):
    """Someone writes the node right after each read, `busy` times."""

    def __init__(self, busy: int) -> None:
        super().__init__()
        self.busy = busy

    def get_node(self, name: str) -> Any:
        view = super().get_node(name)
        if self.busy:
            self.busy -= 1
            self.nodes[name].version += 1  # the agent's status patch
        return view


def run(monkeypatch: pytest.MonkeyPatch, cluster: MemoryCluster) -> Any:
    cluster.add_node("gpu-1")
    cluster.store("gpu-1", Record(state=State.QUARANTINED, since=utcnow()))
    monkeypatch.setattr("gpuvigil.commands.release.open_or_exit", lambda cfg: cluster)
    return CliRunner().invoke(app, ["release", "gpu-1", "--by", "alice"])


def test_a_write_between_read_and_store_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Busy(busy=2)
    r = run(monkeypatch, c)
    assert r.exit_code == 0, r.output
    assert "QUARANTINED -> VALIDATING (released by alice)" in r.output
    assert c.get_node("gpu-1").record.state is State.VALIDATING


def test_a_writer_that_never_stops_ends_it_with_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    r = run(monkeypatch, Busy(busy=10_000))
    assert r.exit_code == 2 and "cannot release gpu-1" in r.output, r.output
