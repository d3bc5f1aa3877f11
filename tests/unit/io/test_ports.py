"""free_port draws below the ephemeral range, so an outgoing connection made between the
pick and the server's bind (the lab's torchrun rendezvous lost its port that way in CI:
both ranks of attempt 1 exited 1 before any fault) cannot be holding it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpuvigil.io import ports
from gpuvigil.io.ports import FLOOR, bindable, ephemeral_low, free_port


def test_ports_lie_below_the_ephemeral_range_and_bind() -> None:
    low = ephemeral_low()
    drawn = [free_port() for _ in range(200)]
    ports = set(drawn)
    assert all(FLOOR <= p < low for p in ports)
    assert len(ports) == len(drawn)  # never the same port twice to one process
    assert all(bindable(p) for p in ports)


def test_a_taken_port_is_never_handed_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_given", set())  # what other tests drew is not held here
    # a range file that leaves 101 candidates; listeners hold all but one of them
    rng = tmp_path / "range"
    rng.write_text(f"{FLOOR + 101}\t60999\n")
    held: list[socket.socket] = []
    free = None
    try:
        for port in range(FLOOR, FLOOR + 101):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken by someone else already: just as good
                s.close()
                continue
            if free is None:
                s.close()
                free = port
                continue
            held.append(s)
        assert free is not None
        assert free_port(range_file=rng) == free
        # handed out once, it is not handed out again: the kernel's own pick instead
        assert free_port(range_file=rng) != free
    finally:
        for s in held:
            s.close()


def test_a_garbage_range_file_falls_back_to_linux_default(tmp_path: Path) -> None:
    for text in ("", "garbage", "5 6", "\x00\xff"):
        f = tmp_path / "range"
        f.write_bytes(text.encode("latin-1"))
        assert ephemeral_low(f) == 32768
    assert ephemeral_low(tmp_path / "missing") == 32768
