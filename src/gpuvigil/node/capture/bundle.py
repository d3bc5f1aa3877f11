"""What `gpuvigil analyze PATH...` reads: files, folders (a support bundle), archives.

A folder is walked in name order; a captured sysfs tree inside it (a root holding
`sys/class/infiniband` or `sys/bus/pci/devices`, a copy of `/sys`, or a copy of
`/sys/class/infiniband` itself) is one input, not thousands of files. A tar archive (plain
or compressed) is unpacked into a private folder under caps: total bytes, member count;
devices, FIFOs, absolute links and paths or links that escape are refused (tarfile's
"data" filter; a sysfs capture keeps its relative links). Outside a sysfs tree, symbolic
links in a folder or archive are not followed: they are listed as skipped, and so is a
bundle's own documentation (`README*`, `*.md`): it describes the outputs, it is not one.
"""

from __future__ import annotations

import itertools
import os
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

MAX_DEPTH = 2  # archives inside archives inside the bundle, no deeper
_SERIAL = itertools.count()  # unique names for scratch folders
# A bundle's documentation, by name (a README may quote the errors the bundle shows).
_DOCS = re.compile(r"^(?:README|READ\.ME)(?:\.[\w.]+)?$|\.(?:md|rst)$", re.I)
NOT_AN_OUTPUT = "not an output (the bundle's documentation): never judged"


@dataclass(frozen=True)
class Limits:
    max_extract_bytes: int = 512 * 1024 * 1024  # what one archive may unpack
    max_members: int = 20000  # entries in one archive
    max_files: int = 5000  # files read from one folder tree


@dataclass(frozen=True)
class Entry:
    """One thing to read. `path` is as shown to people (`bundle.tar.gz:var/log/dmesg`)."""

    path: str
    file: Path | None = None  # None: standard input
    sysfs_root: Path | None = None  # a captured sysfs tree (judged by the fabric/pcie checks)
    skipped: str | None = None  # why it is not read, when it is not
    problem: str | None = None  # why it could not be read fully (an archive over its cap)


def expand(paths: list[str], *, workdir: Path, limits: Limits) -> list[Entry]:
    out: list[Entry] = []
    for i, raw in enumerate(paths):
        if raw == "-":
            out.append(Entry("-", None))
            continue
        p = Path(raw)
        if p.is_dir():
            out += _walk(p, raw, workdir / f"root{i}", limits)
        elif p.is_file() and _is_tar(p):
            out += _unpack(p, raw, workdir / f"tar{i}", limits)
        else:
            out.append(Entry(raw, p))  # a file, a FIFO, or a path that is not there
    return out


_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


def _is_tar(path: Path) -> bool:
    """A tar archive with at least one member (blocks of zeros read as an empty tar).

    The magic bytes first: without them tarfile's "r:*" tries each decompressor over the
    whole file (the lzma one read 2 GiB of NUL bytes for minutes)."""
    try:
        with path.open("rb") as f:
            head = f.read(512)
    except OSError:
        return False
    if not head.startswith(_COMPRESSED) and head[257:262] != b"ustar":
        return False
    try:
        with tarfile.open(path, mode="r:*") as tar:
            return tar.next() is not None
    except (OSError, EOFError, tarfile.TarError, ValueError, zlib.error):
        return False


def _unpack(
    archive: Path, shown: str, dest: Path, limits: Limits, *, depth: int = 0
) -> list[Entry]:
    dest.mkdir(parents=True)
    total, members, refused, stopped = 0, 0, 0, None
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for m in tar:
                members += 1
                if members > limits.max_members:
                    stopped = f"more than {limits.max_members} entries: stopped there"
                    break
                if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                    refused += 1  # devices and FIFOs have no business in a bundle
                    continue
                if m.isfile() and total + m.size > limits.max_extract_bytes:
                    stopped = (
                        f"unpacks to more than {limits.max_extract_bytes} bytes (the cap; "
                        "--max-extract): stopped there"
                    )
                    break
                try:  # "data": no absolute paths, no links or paths out of `dest`
                    tar.extract(m, dest, filter="data")
                except (tarfile.TarError, OSError):
                    refused += 1
                    continue
                total += m.size if m.isfile() else 0
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
        stopped = f"cannot unpack: {e}"
    found = _walk(dest, shown, dest.parent / f"{dest.name}-roots", limits, member=True, depth=depth)
    if stopped is not None:
        found.append(Entry(shown, problem=stopped))
    if refused:
        why = f"{refused} entries not unpacked (devices, FIFOs, links or paths out of it)"
        found.append(Entry(shown, skipped=why))
    return found


def _walk(
    top: Path,
    shown: str,
    roots: Path,
    limits: Limits,
    *,
    member: bool = False,
    depth: int = 0,
) -> list[Entry]:
    out: list[Entry] = []
    files = 0

    def name(p: Path) -> str:
        rel = p.relative_to(top).as_posix()
        if member:
            return f"{shown}:{rel}" if rel != "." else shown
        return str(Path(shown) / rel) if rel != "." else shown

    for here, dirs, names in os.walk(top, followlinks=False):
        d = Path(here)
        root = _sysfs_root(d, roots / f"s{next(_SERIAL)}")
        if root is not None:
            out.append(Entry(name(d), sysfs_root=root))
            dirs.clear()
            continue
        dirs.sort()
        for link in [x for x in dirs if (d / x).is_symlink()]:
            dirs.remove(link)
            out.append(Entry(name(d / link), skipped="a symbolic link (not followed)"))
        for n in sorted(names):
            f = d / n
            if f.is_symlink():
                out.append(Entry(name(f), skipped="a symbolic link (not followed)"))
                continue
            if _DOCS.search(n):
                out.append(Entry(name(f), skipped=NOT_AN_OUTPUT))
                continue
            files += 1
            if files > limits.max_files:
                out.append(Entry(name(d), problem=f"more than {limits.max_files} files: stopped"))
                return out
            if depth < MAX_DEPTH and _is_tar(f):  # an archive in the bundle (a sysfs.tar.gz)
                nested = roots / f"nested{next(_SERIAL)}"
                out += _unpack(f, name(f), nested, limits, depth=depth + 1)
            else:
                out.append(Entry(name(f), f))
    return out


def _sysfs_root(d: Path, scratch: Path) -> Path | None:
    """`d` as a root that holds `sys/...`: itself, or a scratch root linking to it when it
    is a copy of /sys or of /sys/class/infiniband."""
    if (d / "sys" / "class" / "infiniband").is_dir() or (d / "sys" / "bus" / "pci").is_dir():
        return d
    if (d / "class" / "infiniband").is_dir() or (d / "bus" / "pci" / "devices").is_dir():
        return _linked(scratch, "sys", d)
    subdirs = [c for c in _children(d) if c.is_dir() and not c.is_symlink()]
    if subdirs and all((c / "ports").is_dir() for c in subdirs):
        return _linked(scratch, "sys/class/infiniband", d)
    return None


def _children(d: Path) -> list[Path]:
    try:
        return list(d.iterdir())
    except OSError:
        return []


def _linked(scratch: Path, rel: str, target: Path) -> Path:
    link = scratch / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target.resolve(), target_is_directory=True)
    return scratch
