"""Where checkpoints live: a local/shared file system, or any fsspec URL (s3://, gs://, ...).

Called by `manifest`, `checkpoint`, `dcp_storage` and the writer process (`writer`). Every
path these methods take is *relative to the root* ("step-000000100/manifest.json"): the
storage alone turns it into a real path, so no caller can apply the root twice (a relative
root such as `ckpt` once became `ckpt/ckpt/step-N`). A local root is made absolute at
construction, so a process that changes directory keeps writing to the same place.
Local paths get real durability (fsync of files and folders, rename for atomic publish);
object stores get it from the store itself (a PUT is atomic and durable when it returns).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

CHUNK = 8 << 20
# A data file's checksum is one SHA-256 per span of this many bytes (the last may be
# shorter), so a load verifies the spans of one file on many cores at once: one SHA-256
# stream runs at 1-2 GB/s on one core, slower than the load it guards (issue #24 item 8).
# A file of at most one span keeps a single whole-file `sha256` (the older format, read
# the same way). The span is part of each manifest entry, so it can change without
# breaking checkpoints already written.
SPAN = 64 << 20
MAX_VERIFY_THREADS = 8  # per rank: 8 ranks of a GPU node then hash on up to 64 cores


class Digest:
    """SHA-256 of bytes fed in order, one per SPAN: the manifest entry of one file."""

    def __init__(self, span: int | None = None) -> None:
        self.span, self.size = span or SPAN, 0
        self._h = hashlib.sha256()
        self._done: list[str] = []

    def update(self, data: memoryview | bytes) -> None:
        view = memoryview(data)
        while view:
            room = self.span - (self.size % self.span)
            self._h.update(view[:room])
            self.size += min(room, len(view))
            view = view[room:]
            if self.size % self.span == 0:
                self._done.append(self._h.hexdigest())
                self._h = hashlib.sha256()

    def entry(self) -> dict[str, Any]:
        spans = [*self._done, self._h.hexdigest()] if self.size % self.span else list(self._done)
        if len(spans) <= 1:
            whole = spans[0] if spans else hashlib.sha256().hexdigest()
            return {"size": self.size, "sha256": whole}
        return {"size": self.size, "sha256_spans": spans, "span_bytes": self.span}


def _span_sha256(path: str, start: int, length: int) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        at, end = start, start + length
        while at < end:
            chunk = os.pread(fd, min(CHUNK, end - at), at)
            if not chunk:
                break  # shorter than the manifest says: the digest will not match
            h.update(chunk)
            at += len(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def _rel(rel: str) -> str:
    """A relative path inside the root; refuses absolute paths and `..` (a manifest names
    files, and a hostile manifest must not reach outside the checkpoint folder)."""
    norm = posixpath.normpath(rel) if rel else ""
    if norm in ("", "."):
        return ""
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise ValueError(f"path {rel!r} leaves the checkpoint folder")
    return norm


class LocalStorage:
    """POSIX folder (local disk, NFS, Lustre, a FUSE mount of a bucket)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root.removeprefix("file://"))
        self.location = self.root

    def path(self, rel: str = "") -> str:
        r = _rel(rel)
        return os.path.join(self.root, r) if r else self.root

    def list_dir(self, rel: str = "") -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def list_files(self, rel: str) -> Iterator[tuple[str, int]]:
        """(name relative to `rel`, size) of every file under `rel`, recursively."""
        top = self.path(rel)
        for dirpath, _dirs, files in os.walk(top):
            for f in files:
                full = os.path.join(dirpath, f)
                yield os.path.relpath(full, top), os.path.getsize(full)

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.path(rel))

    def size(self, rel: str) -> int:
        return os.path.getsize(self.path(rel))

    def sha256(self, rel: str) -> str:
        h = hashlib.sha256()
        with open(self.path(rel), "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def sha256_spans(self, rel: str, span: int, *, workers: int = 0) -> list[str]:
        """One SHA-256 per `span` bytes, the spans hashed by up to `workers` threads at once
        (0: one per core this process may run on, at most MAX_VERIFY_THREADS: each holds a
        CHUNK, and a node's 8 ranks verify at once); hashlib releases the GIL while it hashes."""
        path, size = self.path(rel), self.size(rel)
        starts = list(range(0, size, span)) or [0]
        n = max(1, min(len(starts), workers or min(cores(), MAX_VERIFY_THREADS)))
        if n == 1:
            return [_span_sha256(path, at, span) for at in starts]
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="gpuvigil-verify") as pool:
            return list(pool.map(lambda at: _span_sha256(path, at, span), starts))

    def read_bytes(self, rel: str) -> bytes:
        with open(self.path(rel), "rb") as fh:
            return fh.read()

    @contextmanager
    def open_read(self, rel: str) -> Iterator[IO[bytes]]:
        with open(self.path(rel), "rb") as fh:
            yield fh

    @contextmanager
    def open_write(self, rel: str) -> Iterator[IO[bytes]]:
        """A new file, fsynced when the block ends (data files: the manifest commits them)."""
        full = self.path(rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Temp file, fsync, rename, fsync the folder: readers see all of it or nothing."""
        full = self.path(rel)
        folder = os.path.dirname(full)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".tmp-{uuid.uuid4().hex}")
        # O_EXCL on a random name, mode 0644 under the umask (mkstemp would force 0600)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, full)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.fsync_dir(os.path.dirname(rel))

    def fsync_dir(self, rel: str) -> None:
        fd = os.open(self.path(rel), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def makedirs(self, rel: str = "") -> None:
        os.makedirs(self.path(rel), exist_ok=True)

    def remove_tree(self, rel: str) -> None:
        full = self.path(rel)
        if full == self.root:
            raise ValueError("refusing to remove the checkpoint root")
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        elif os.path.lexists(full):
            os.unlink(full)

    def remove(self, rel: str) -> None:
        Path(self.path(rel)).unlink(missing_ok=True)

    def move(self, rel: str, to: str) -> None:
        """Rename a file or folder inside the root (refuses an existing target)."""
        dst = self.path(to)
        if os.path.lexists(dst):
            raise FileExistsError(dst)
        os.rename(self.path(rel), dst)
        self.fsync_dir(posixpath.dirname(_rel(to)))


class FsspecStorage:
    """Any fsspec file system; used when the checkpoint dir is a URL such as s3://b/run."""

    def __init__(self, root: str) -> None:
        import fsspec  # only needed for URLs; ships with torch

        self.location = root.rstrip("/")
        self.fs: Any
        self.fs, self.root = fsspec.core.url_to_fs(self.location)
        self.root = self.root.rstrip("/")

    def path(self, rel: str = "") -> str:
        r = _rel(rel)
        return f"{self.root}/{r}" if r else self.root

    def list_dir(self, rel: str = "") -> list[str]:
        try:
            entries = self.fs.ls(self.path(rel), detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in entries)

    def list_files(self, rel: str) -> Iterator[tuple[str, int]]:
        base = self.path(rel).rstrip("/") + "/"
        for full, info in sorted(self.fs.find(self.path(rel), detail=True).items()):
            yield full.removeprefix(base).removeprefix("/" + base), int(info.get("size") or 0)

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.path(rel)))

    def size(self, rel: str) -> int:
        return int(self.fs.size(self.path(rel)))

    def sha256(self, rel: str) -> str:
        h = hashlib.sha256()
        with self.fs.open(self.path(rel), "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def sha256_spans(self, rel: str, span: int, *, workers: int = 0) -> list[str]:
        """One SHA-256 per `span` bytes, read in one stream (an object store's ranged reads
        in parallel are left to a later change)."""
        d = Digest(span)
        with self.fs.open(self.path(rel), "rb") as fh:
            while chunk := fh.read(CHUNK):
                d.update(chunk)
        e = d.entry()
        return list(e.get("sha256_spans") or [e["sha256"]])

    def read_bytes(self, rel: str) -> bytes:
        return bytes(self.fs.cat_file(self.path(rel)))

    @contextmanager
    def open_read(self, rel: str) -> Iterator[IO[bytes]]:
        with self.fs.open(self.path(rel), "rb") as fh:
            yield fh

    @contextmanager
    def open_write(self, rel: str) -> Iterator[IO[bytes]]:
        with self.fs.open(self.path(rel), "wb") as fh:  # one (multipart) PUT on close
            yield fh

    def write_atomic(self, rel: str, data: bytes) -> None:
        self.fs.pipe_file(self.path(rel), data)  # one PUT: atomic on object stores

    def fsync_dir(self, rel: str) -> None:
        pass

    def makedirs(self, rel: str = "") -> None:
        self.fs.makedirs(self.path(rel), exist_ok=True)

    def remove_tree(self, rel: str) -> None:
        full = self.path(rel)
        if full == self.root:
            raise ValueError("refusing to remove the checkpoint root")
        if self.fs.exists(full):
            self.fs.rm(full, recursive=True)

    def remove(self, rel: str) -> None:
        if self.fs.exists(self.path(rel)):
            self.fs.rm(self.path(rel))

    def move(self, rel: str, to: str) -> None:
        if self.fs.exists(self.path(to)):
            raise FileExistsError(self.path(to))
        self.fs.mv(self.path(rel), self.path(to), recursive=True)


Storage = LocalStorage | FsspecStorage


def open_storage(location: str) -> Storage:
    return FsspecStorage(location) if is_url(location) else LocalStorage(location)
