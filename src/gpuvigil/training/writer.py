"""Writing checkpoint bytes, hashed on the way: in this process, or in the rank's writer process.

Called by `checkpoint` (through `dcp_storage.Writer`'s sink). `write_file` is the one place
bytes reach storage: it hashes each chunk (SHA-256) as it writes it, so making the checksum
costs no second read of the file.

An async save runs it in a **writer process** per rank (this file run by path, started with
the `Run`; it imports neither torch, nor gpuvigil's package, nor the user's script). The
rank stages its state into an arena of shared memory (a memfd, see `staging`) and sends
the writer only offsets; the writer writes and hashes from the same pages. So the training
process neither copies the bytes again nor holds the GIL while they are written and
hashed: that CPU time and I/O wait lands in another process (on a GPU node, on a core the
training leaves idle). The writer exits when its rank does (end of file on its socket, or
a new parent process).
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterable
from typing import Any

if __package__:
    from gpuvigil.training.storage import Digest, Storage, open_storage
else:  # the writer process runs this file by path: its sibling, without the package's imports
    from storage import Digest, Storage, open_storage  # type: ignore[no-redef]

CHUNK = 8 << 20
_LEN = struct.Struct("!I")


def write_file(
    storage: Storage, rel: str, pieces: Iterable[memoryview], *, alive: Any = None
) -> dict[str, Any]:
    """Write `pieces` one after the other to `rel` (fsynced); returns its manifest entry,
    `storage.Digest`'s: {"size", "sha256"}, or {"size", "sha256_spans", "span_bytes"}."""
    d = Digest()
    with storage.open_write(rel) as fh:
        for piece in pieces:
            for at in range(0, len(piece), CHUNK):
                chunk = piece[at : at + CHUNK]
                d.update(chunk)
                fh.write(chunk)
                if alive is not None and not alive():
                    raise RuntimeError("the training process is gone; abandoning the write")
    return d.entry()


# --- the wire: length-prefixed JSON, file descriptors beside it -----------------------------
def _send(sock: socket.socket, msg: dict[str, Any], fds: list[int] | None = None) -> None:
    body = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [_LEN.pack(len(body))], fds)
        sock.sendall(body)
    else:
        sock.sendall(_LEN.pack(len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise EOFError("peer closed the writer socket")
        buf += got
    return bytes(buf)


def _recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(sock, _LEN.size, 4)
    if not data:
        raise EOFError("peer closed the writer socket")
    if len(data) < _LEN.size:
        data += _recv_exact(sock, _LEN.size - len(data))
    (n,) = _LEN.unpack(data)
    return json.loads(_recv_exact(sock, n)), list(fds)


class WriterProcess:
    """The training side of one rank's writer process."""

    def __init__(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = parent
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(child.fileno())],
            pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL,
            # Its own session: torchrun signals each rank's process group, and a drain's
            # SIGTERM is for the rank, which still needs this process for its last save
            # (even while it is still starting). It leaves when its rank does.
            start_new_session=True,
        )
        child.close()
        self._arena_fd: int | None = None

    def use_arena(self, fd: int, size: int) -> None:
        """Hand the writer the shared-memory arena the rank stages into (once per layout)."""
        if fd == self._arena_fd:
            return
        with self._lock:
            _send(self._sock, {"op": "arena", "size": size}, [fd])
            reply, _ = _recv(self._sock)
        if not reply.get("ok"):
            raise RuntimeError(f"checkpoint writer process: {reply.get('error')}")
        self._arena_fd = fd

    def write(self, location: str, rel: str, spans: list[tuple[int, int]]) -> dict[str, Any]:
        """Write the arena's byte spans (offset, length) to `rel`; blocks (GIL released)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"checkpoint writer process exited with {self.proc.returncode}")
        with self._lock:
            _send(self._sock, {"op": "write", "location": location, "file": rel, "spans": spans})
            reply, _ = _recv(self._sock)
        if not reply.get("ok"):
            raise OSError(f"checkpoint writer process: {reply.get('error')}")
        return {k: reply[k] for k in ("size", "sha256", "sha256_spans", "span_bytes") if k in reply}

    def close(self) -> None:
        try:
            self._sock.close()
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main(argv: list[str]) -> int:
    """The writer process: serve write requests until the rank closes the socket."""
    sock = socket.socket(fileno=int(argv[0]))
    parent = os.getppid()
    # A terminal's Ctrl-C or a stray SIGTERM to the session: this process ends with its rank.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def alive() -> bool:
        return os.getppid() == parent

    arena: mmap.mmap | None = None
    storages: dict[str, Storage] = {}
    while True:
        try:
            msg, fds = _recv(sock)
        except (EOFError, ConnectionError, OSError):
            return 0
        try:
            if msg["op"] == "arena":
                if arena is not None:
                    arena.close()
                arena = mmap.mmap(fds[0], int(msg["size"]))
                os.close(fds[0])
                _send(sock, {"ok": True})
            elif msg["op"] == "write":
                assert arena is not None, "no arena"
                view = memoryview(arena)
                loc = str(msg["location"])
                storage = storages.get(loc) or storages.setdefault(loc, open_storage(loc))
                pieces = [view[int(a) : int(a) + int(n)] for a, n in msg["spans"]]
                out = write_file(storage, str(msg["file"]), pieces, alive=alive)
                del pieces, view
                _send(sock, {"ok": True, **out})
            else:
                _send(sock, {"ok": False, "error": f"unknown op {msg.get('op')!r}"})
        except Exception as e:  # noqa: BLE001 (reported to the rank, which fails the save)
            try:
                _send(sock, {"ok": False, "error": f"{type(e).__name__}: {e}"})
            except OSError:
                return 1
        if not alive():
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
