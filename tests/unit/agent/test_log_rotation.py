"""The kernel-log file source (`kmsg_stream.FollowFile`) across log rotation: rename+create
(with the writer still appending to the renamed file, as rsyslog does until its HUP),
copytruncate, and delete-then-recreate. An Xid written just before each rotation is read,
20 times out of 20 for each, with real files and a real writer process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuvigil.node.checks.kernel_log import kmsg_stream as ks

ROUNDS = 20
# A writer that holds its file open, like rsyslog: `w TEXT` appends a line through the fd
# it has, `o` reopens the path (after a rotation, its HUP); it answers each with a line.
WRITER = r"""
import sys
path = sys.argv[1]
fh = open(path, "a", buffering=1)
for cmd in sys.stdin:
    if cmd.startswith("w "):
        fh.write(cmd[2:])
        fh.flush()
    elif cmd.startswith("o"):
        fh.close()
        fh = open(path, "a", buffering=1)
    print("ok", flush=True)
"""


class Writer:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def _do(self, cmd: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "ok\n"

    def write(self, line: str) -> None:
        self._do(f"w {line}")

    def reopen(self) -> None:
        self._do("o")

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(5)


def xid(i: int) -> str:
    return f"[ {100 + i}.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, round {i}"


def read_until(src: ks.FollowFile, want: set[str], timeout: float = 2.0) -> set[str]:
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while not want <= seen and time.monotonic() < deadline:
        seen.update(r.text for r in src.read(first=False, wait_s=0.005))
    return seen


def rename_create(log: Path, w: Writer, i: int) -> list[str]:
    os.rename(log, log.with_name(log.name + ".1"))
    log.touch()
    w.write(f"[ {i}.5] late, into the renamed file")  # before the writer's HUP
    w.reopen()
    w.write(f"[ {i}.6] after the rotation")
    return [f"[ {i}.5] late, into the renamed file", f"[ {i}.6] after the rotation"]


def copytruncate(log: Path, w: Writer, i: int) -> list[str]:
    shutil.copyfile(log, log.with_name(log.name + ".1"))
    os.truncate(log, 0)
    w.write(f"[ {i}.6] after the rotation")  # O_APPEND: lands at the new end
    return [f"[ {i}.6] after the rotation"]


def delete_recreate(log: Path, w: Writer, i: int) -> list[str]:
    log.unlink()
    log.touch()
    w.reopen()
    w.write(f"[ {i}.6] after the rotation")
    return [f"[ {i}.6] after the rotation"]


@pytest.mark.parametrize("rotate", [rename_create, copytruncate, delete_recreate])
def test_an_xid_written_just_before_a_rotation_is_never_lost(tmp_path, rotate):
    passed = 0
    for i in range(ROUNDS):
        folder = tmp_path / str(i)
        folder.mkdir()
        log = folder / "kern.log"
        log.write_text("[ 0.0] Linux version 6.1.0\n")
        w = Writer(log)
        src = ks.FollowFile(log, missing_grace_s=0.5)
        try:
            src.read(first=True, wait_s=0.005)
            w.write(f"[ {i}.1] a line the agent reads before the rotation")
            read_until(src, {f"[ {i}.1] a line the agent reads before the rotation"})
            w.write(xid(i))  # just before the rotation: not read yet
            after = rotate(log, w, i)
            seen = read_until(src, {xid(i), *after})
            passed += {xid(i), *after} <= seen
        finally:
            src.close()
            w.stop()
    assert passed == ROUNDS, f"{rotate.__name__}: {passed}/{ROUNDS}"
