"""Files gpuvigil writes as root on every node: fixed modes and no symlink following.

The agent runs as root and writes into folders other programs can reach (`/run/gpuvigil`,
`/var/lib/gpuvigil`, an events file). A symlink planted there must never redirect a write
onto another file, and a permissive umask must never widen what is written. So:

- folders are created 0750 (`DIR_MODE`) whatever the umask, and a folder that is a symlink
  is refused (`ensure_dir`);
- files are created 0640 (`FILE_MODE`) whatever the umask, through a descriptor of their
  folder opened with O_NOFOLLOW (`openat`), with O_NOFOLLOW on the file itself;
- `write_atomic` writes a temporary file next to the target (O_EXCL, a random name) and
  renames it over the target: a rename replaces a symlink, it never writes through it.

Used by the agent's state-file sink and state folder, the Slurm sink's marker and the
event log (`core.events`).
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

DIR_MODE = 0o750
FILE_MODE = 0o640
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """A path gpuvigil was asked to write is a symlink (or under a symlinked folder)."""


def ensure_dir(path: Path, *, mode: int = DIR_MODE) -> None:
    """Create `path` (and missing parents) with `mode`; refuse when it is a symlink."""
    missing = []
    p = path
    while not p.exists() and not p.is_symlink() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue
        os.chmod(d, mode, follow_symlinks=False)  # the umask narrowed it, never widens it
    if path.is_symlink():
        raise UnsafePath(errno.ELOOP, "refusing to write under a symlinked folder", str(path))


def open_dir(path: Path) -> int:
    """A descriptor of the folder `path`, which must not be a symlink."""
    ensure_dir(path)
    try:
        return os.open(path, _NOFOLLOW_DIR)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(e.errno, "refusing to write under a symlink", str(path)) from e
        raise


def open_append(path: Path, *, mode: int = FILE_MODE) -> int:
    """An O_APPEND descriptor of `path` (created `mode`), never through a symlink."""
    dfd = open_dir(path.parent)
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path.name, flags, mode, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafePath(e.errno, "refusing to append to a symlink", str(path)) from e
            raise
        if os.fstat(fd).st_size == 0:
            os.fchmod(fd, mode)
        return fd
    finally:
        os.close(dfd)


def write_atomic(path: Path, data: bytes, *, mode: int = FILE_MODE) -> None:
    """Replace `path` with `data`: readers see the old file or the new one, never half.

    The temporary file is created next to the target with O_EXCL|O_NOFOLLOW, fsynced, given
    `mode`, renamed over the target, and the folder is fsynced so the rename survives a crash.
    """
    dfd = open_dir(path.parent)
    try:
        tmp = f".{path.name}.{secrets.token_hex(6)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fchmod(fh.fileno(), mode)
                os.fsync(fh.fileno())
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)
