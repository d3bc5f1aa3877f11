"""Where checkpoints live: a local/shared file system, or any fsspec URL (s3://, gs://, ...).

Called by `manifest` and `checkpoint`. Local paths get real durability (fsync of files and
folders, rename for atomic publish); object stores get it from the store itself (a PUT is
atomic and durable when it returns). Only the few operations the manifest needs are here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHUNK = 4 << 20


def is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


class LocalStorage:
    """POSIX folder (local disk, NFS, Lustre, a FUSE mount of a bucket)."""

    def __init__(self, root: str) -> None:
        self.root = root.removeprefix("file://")
        self.url = self.root

    def join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def list_dir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def list_files(self, path: str) -> Iterator[tuple[str, int]]:
        """(relative name, size) of every file under `path`, recursively."""
        for dirpath, _dirs, files in os.walk(path):
            for f in files:
                full = os.path.join(dirpath, f)
                yield os.path.relpath(full, path), os.path.getsize(full)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def sha256(self, path: str) -> str:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as fh:
            return fh.read()

    def write_atomic(self, path: str, data: bytes) -> None:
        """Temp file, fsync, rename, fsync the folder: readers see all of it or nothing."""
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.fsync_dir(folder)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def remove(self, path: str) -> None:
        Path(path).unlink(missing_ok=True)


class FsspecStorage:
    """Any fsspec file system; used when the checkpoint dir is a URL such as s3://b/run."""

    def __init__(self, root: str) -> None:
        import fsspec  # only needed for URLs; ships with torch

        self.url = root.rstrip("/")
        self.fs: Any
        self.fs, self.root = fsspec.core.url_to_fs(self.url)

    def join(self, *parts: str) -> str:
        """Relative to the root, unless the first part already is a full path (like os.path)."""
        base = self.root
        if parts and parts[0].startswith(self.root):
            base, parts = parts[0], parts[1:]
        return "/".join([base.rstrip("/"), *parts])

    def list_dir(self, path: str) -> list[str]:
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False))
        except FileNotFoundError:
            return []

    def list_files(self, path: str) -> Iterator[tuple[str, int]]:
        base = path.rstrip("/") + "/"
        for full, info in sorted(self.fs.find(path, detail=True).items()):
            yield full.removeprefix(base), int(info.get("size") or 0)

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    def sha256(self, path: str) -> str:
        h = hashlib.sha256()
        with self.fs.open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def read_bytes(self, path: str) -> bytes:
        return bytes(self.fs.cat_file(path))

    def write_atomic(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)  # one PUT: atomic on object stores

    def fsync_dir(self, path: str) -> None:
        pass

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def remove_tree(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def remove(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path)


Storage = LocalStorage | FsspecStorage


def open_storage(location: str) -> Storage:
    return FsspecStorage(location) if is_url(location) else LocalStorage(location)
