"""Reading one captured input (a file, a FIFO such as `<(dmesg)`, standard input) with a
deadline, a size cap and the encodings people attach. Never hangs, never raises
anything but `InputError` (with a one-line reason).

- A FIFO or pipe is opened non-blocking and polled: one with no writer gives "no data
  within N s", not a hang. Standard input that is closed is an `InputError`.
- Every read honours one deadline for the whole input.
- gzip is decompressed as a stream (a `.gz` log, a `.tar.gz` bundle); the cap counts the
  decompressed bytes, so a small bomb cannot fill memory.
- UTF-16 (with a BOM, or ASCII text with every other byte NUL, as Windows tools write) is
  decoded to UTF-8 as it streams.

`Input.read(n)` is a binary stream for the streaming readers (kernel logs);
`Input.read_document(cap)` reads a whole output for the document readers.
"""

from __future__ import annotations

import codecs
import os
import select
import stat
import time
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path  # annotations only: logscan starts without pathlib (~5 ms)


class _Source(Protocol):
    """Anything with `read(n) -> bytes` (b"" at the end)."""

    def read(self, n: int) -> bytes: ...


HEAD = 65536
_READ = 1 << 20


class InputError(Exception):
    """The input cannot be read at all: the message says why, in one line. `missing`: the
    path does not exist (DEPENDENCY_MISSING rather than CHECK_ERROR)."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


class _Fd:
    """Reads of one file descriptor under a deadline (polled when it is a pipe or FIFO)."""

    def __init__(self, fd: int, *, deadline: float, pollable: bool, name: str) -> None:
        self.fd, self.deadline, self.name = fd, deadline, name
        self.poll = select.poll() if pollable else None
        if self.poll is not None:
            self.poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        self.eof = False

    def read(self, n: int) -> bytes:
        if self.eof:
            return b""
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise InputError(f"{self.name}: no data within the read deadline")
            if self.poll is not None and not self.poll.poll(int(min(left, 1.0) * 1000) + 1):
                continue
            try:
                data = os.read(self.fd, n)
            except BlockingIOError:
                continue
            except OSError as e:
                raise InputError(f"{self.name}: read failed: {e.strerror or e}") from e
            if not data:
                self.eof = True
            return data


class _Gunzip:
    def __init__(self, inner: _Source) -> None:
        self.inner, self.z, self.done = inner, zlib.decompressobj(wbits=31), False

    def read(self, n: int) -> bytes:
        while not self.done:
            if self.z.unconsumed_tail:
                out = self.z.decompress(self.z.unconsumed_tail, n)
            else:
                raw = self.inner.read(_READ)
                if not raw:
                    self.done = True
                    return self.z.flush()
                try:
                    out = self.z.decompress(raw, n)
                except zlib.error as e:
                    raise InputError(f"not valid gzip data: {e}") from e
            if self.z.eof:
                self.done = True
            if out:
                return out
        return b""


class _Utf16:
    def __init__(self, inner: _Source, encoding: str) -> None:
        self.inner = inner
        self.dec = codecs.getincrementaldecoder(encoding)(errors="replace")

    def read(self, n: int) -> bytes:
        while True:
            raw = self.inner.read(max(n, 2))
            text = self.dec.decode(raw, final=not raw)
            if text or not raw:
                return text.encode("utf-8")


@dataclass
class Input:
    """One opened input. `head` is its first bytes (decoded), already consumed from the
    stream but given back by `read`."""

    name: str
    head: bytes
    encoding: str  # "utf-8" | "utf-16" | "gzip" | "gzip+utf-16" ...
    _reader: _Source
    _fd: int | None
    _given: int = 0
    bytes_read: int = 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = _READ
        if self._given < len(self.head):
            out = self.head[self._given : self._given + n]
            self._given += len(out)
        else:
            out = self._reader.read(n)
        self.bytes_read += len(out)
        return out

    def read_document(self, cap: int) -> bytes:
        """The whole input, or InputError when it is larger than `cap` (a document reader
        needs all of it; a cut document is not judged)."""
        parts, size = [], 0
        while chunk := self.read(_READ):
            size += len(chunk)
            if size > cap:
                raise InputError(f"{self.name}: larger than {cap} bytes (the size cap)")
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        if self._fd is not None and self._fd > 2:
            os.close(self._fd)
        self._fd = None

    def __enter__(self) -> Input:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_input(path: str | Path, *, timeout_s: float) -> Input:
    """`path`, or `-` for standard input, opened and decoded (see the module)."""
    deadline = time.monotonic() + timeout_s
    name = "standard input" if str(path) == "-" else str(path)
    if str(path) == "-":
        try:
            mode = os.fstat(0).st_mode
        except OSError as e:
            raise InputError("standard input is closed") from e
        fd, pollable = 0, not stat.S_ISREG(mode)
        if pollable:
            os.set_blocking(0, False)
    else:
        try:
            mode = os.stat(path).st_mode
        except OSError as e:
            missing = isinstance(e, FileNotFoundError)
            raise InputError(f"cannot read {name}: {e.strerror or e}", missing=missing) from e
        if stat.S_ISDIR(mode):
            raise InputError(f"{name} is a folder")
        pollable = stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)
        try:
            fd = os.open(path, os.O_RDONLY | (os.O_NONBLOCK if pollable else 0) | os.O_CLOEXEC)
        except OSError as e:
            raise InputError(f"cannot read {name}: {e.strerror or e}") from e
    try:
        return _decoded(_Fd(fd, deadline=deadline, pollable=pollable, name=name), name, fd)
    except BaseException:
        if fd > 2:
            os.close(fd)
        raise


def _decoded(raw: _Fd, name: str, fd: int) -> Input:
    encoding = "utf-8"
    first = _fill(raw, 4)
    reader: _Source = _Prefixed(first, raw)
    if first[:2] == b"\x1f\x8b":
        gunzip = _Gunzip(reader)
        first, encoding = _fill(gunzip, 4), "gzip"
        reader = _Prefixed(first, gunzip)
    utf16 = _utf16(first)
    if utf16:
        reader = _Utf16(reader, utf16)
        encoding = f"{encoding}+utf-16" if encoding == "gzip" else "utf-16"
    head = _fill(reader, HEAD)
    return Input(name=name, head=head, encoding=encoding, _reader=reader, _fd=fd)


class _Prefixed:
    def __init__(self, prefix: bytes, inner: _Source) -> None:
        self.prefix, self.inner = prefix, inner

    def read(self, n: int) -> bytes:
        if self.prefix:
            out, self.prefix = self.prefix[:n], self.prefix[n:]
            return out
        return self.inner.read(n)


def _fill(reader: _Source, n: int) -> bytes:
    parts, size = [], 0
    while size < n:
        chunk = reader.read(n - size)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def _utf16(first: bytes) -> str | None:
    if first[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return "utf-16"
    if len(first) >= 4 and first[1] == 0 and first[3] == 0 and first[0] and first[2]:
        return "utf-16-le"
    if len(first) >= 4 and first[0] == 0 and first[2] == 0 and first[1] and first[3]:
        return "utf-16-be"
    return None
