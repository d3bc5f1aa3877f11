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
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

CHUNK = 8 << 20


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
