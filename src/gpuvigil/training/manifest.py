"""The checkpoint manifest: the commit record that makes a checkpoint loadable.

Called by `checkpoint` (rank 0 writes it after every rank's files are written and verified;
every load verifies it). A checkpoint folder `step-000000100/` counts only once its
`manifest.json` exists, and the manifest is written last, atomically. A crash at any moment
of a save therefore leaves either the previous checkpoints alone or a complete, verified
new one; never a "latest" that cannot load. On load, sizes and SHA-256 sums are checked
and a damaged checkpoint is skipped for the previous one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gpuvigil.training.storage import Storage

MANIFEST = "manifest.json"
FORMAT = "gpuvigil.checkpoint/1"
_STEP_DIR = re.compile(r"^step-(\d{9})$")
_RANK_FILE = re.compile(r"^(?:__(\d+)_\d+\.distcp|rank-(\d+)\.json)$")


def dir_name(step: int) -> str:
    return f"step-{step:09d}"


def step_of(name: str) -> int | None:
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    # relative name -> {"size": int, "sha256": str | None}, or, for a file of more than one
    # span, {"size", "sha256_spans": [str, ...], "span_bytes": int} (`storage.Digest`)
    files: dict[str, dict[str, Any]]
    created_ts: float
    extra: dict[str, Any]

    def to_json(self) -> bytes:
        body = {
            "format": FORMAT,
            "step": self.step,
            "world_size": self.world_size,
            "created_ts": self.created_ts,
            "files": self.files,
            "extra": self.extra,
        }
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        """Raises ValueError on anything that is not a manifest of ours."""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"manifest is not JSON: {e}") from e
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ValueError("not a gpuvigil checkpoint manifest")
        files = body.get("files")
        if not isinstance(files, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("size"), int) for v in files.values()
        ):
            raise ValueError("manifest has no valid file list")
        try:
            return cls(
                step=int(body["step"]),
                world_size=int(body["world_size"]),
                files=files,
                created_ts=float(body.get("created_ts", 0.0)),
                extra=dict(body.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"manifest field missing or wrong: {e}") from e

    def data_files(self) -> dict[str, dict[str, Any]]:
        return {n: e for n, e in self.files.items() if n != MANIFEST}


def build(
    *,
    step: int,
    world_size: int,
    files: dict[str, dict[str, Any]],
    created_ts: float,
    extra: dict[str, Any] | None = None,
) -> Manifest:
    """The commit record from the sizes and digests the writers computed while writing
    (nothing is read back: each byte was hashed once, on its way to storage)."""
    return Manifest(step, world_size, dict(sorted(files.items())), created_ts, dict(extra or {}))


def read(storage: Storage, folder: str) -> tuple[Manifest | None, str]:
    """(manifest, "") or (None, why): the manifest of `folder`, parsed, names checked."""
    try:
        raw = storage.read_bytes(f"{folder}/{MANIFEST}")
    except (OSError, FileNotFoundError):
        return None, "no manifest (the save never committed)"
    try:
        m = Manifest.from_json(raw)
    except ValueError as e:
        return None, str(e)
    if ".metadata" not in m.files:
        return None, "manifest lists no DCP .metadata file"
    for name in m.files:
        try:
            storage.path(f"{folder}/{name}")
        except ValueError as e:
            return None, f"manifest names a file outside the checkpoint: {e}"
    return m, ""


def check_file(
    storage: Storage, folder: str, name: str, entry: dict[str, Any], *, checksums: bool
) -> str:
    """ "" when the file matches its manifest entry; else what is wrong (never raises)."""
    rel = f"{folder}/{name}"
    try:
        size = storage.size(rel)
    except (OSError, FileNotFoundError):
        return f"file {name} is missing"
    if size != entry["size"]:
        return f"file {name} has {size} bytes, manifest says {entry['size']}"
    if not checksums:
        return ""
    want = entry.get("sha256")
    spans, span = entry.get("sha256_spans"), entry.get("span_bytes")
    try:
        if spans is not None:
            if not (isinstance(spans, list) and isinstance(span, int) and span > 0):
                return f"file {name}: the manifest's span checksums are malformed"
            got_spans = storage.sha256_spans(rel, span)
            for i, (got, exp) in enumerate(zip(got_spans, spans, strict=False)):
                if got != exp:
                    return (
                        f"file {name} fails its SHA-256 check at bytes {i * span}-"
                        f"{min(size, (i + 1) * span)} ({got[:12]} != {str(exp)[:12]})"
                    )
            if len(got_spans) != len(spans):
                return f"file {name} has {len(got_spans)} spans, manifest says {len(spans)}"
        elif want:
            got = storage.sha256(rel)
            if got != want:
                return f"file {name} fails its SHA-256 check ({got[:12]} != {str(want)[:12]})"
    except OSError as e:
        return f"file {name} cannot be read: {e}"
    return ""


def verify(storage: Storage, folder: str, *, checksums: bool = True) -> tuple[Manifest | None, str]:
    """(manifest, "") when the folder is a complete, intact checkpoint; else (None, why).
    Serial: the training load splits the files between ranks instead (`checkpoint`)."""
    m, why = read(storage, folder)
    if m is None:
        return None, why
    for name, entry in sorted(m.data_files().items()):
        problem = check_file(storage, folder, name, entry, checksums=checksums)
        if problem:
            return None, problem
    return m, ""


def candidates(storage: Storage) -> list[tuple[int, str]]:
    """(step, folder name) of every step-* folder, newest first, committed or not."""
    out = []
    for name in storage.list_dir():
        step = step_of(name)
        if step is not None:
            out.append((step, name))
    return sorted(out, reverse=True)


def committed(storage: Storage) -> list[tuple[int, str]]:
    """Folders with a manifest (not verified), newest first."""
    return [(s, f) for s, f in candidates(storage) if storage.exists(f"{f}/{MANIFEST}")]


def to_prune(storage: Storage, *, keep_last: int) -> list[str]:
    """Folders to delete: committed ones beyond the newest `keep_last`, and uncommitted
    leftovers of crashed saves older than the newest committed checkpoint."""
    done = committed(storage)
    keep = {f for _, f in done[:keep_last]}
    newest = done[0][0] if done else -1
    out = [f for _, f in done[keep_last:]]
    out += [
        f
        for s, f in candidates(storage)
        if f not in keep and s < newest and not storage.exists(f"{f}/{MANIFEST}")
    ]
    return sorted(set(out))


def owner(name: str, *, world_size: int) -> int | None:
    """The rank that wrote `name` (`__R_0.distcp`, `rank-R.json`), if it is one of the
    current ranks; None for job-wide files and for ranks that are gone after a resize."""
    m = _RANK_FILE.match(name)
    if m is None:
        return None
    rank = int(m.group(1) or m.group(2))
    return rank if rank < world_size else None


def assign(files: dict[str, dict[str, Any]], *, world_size: int) -> list[list[str]]:
    """Which rank verifies which file: each rank its own files; job-wide files and those of
    ranks that are gone go to the least-loaded rank. So the time to verify grows with the
    largest rank's share of the checkpoint, not with the whole of it."""
    shares: list[list[str]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    rest = []
    for name, entry in files.items():
        r = owner(name, world_size=world_size)
        if r is None:
            rest.append(name)
        else:
            shares[r].append(name)
            load[r] += int(entry["size"])
    for name in sorted(rest, key=lambda n: -int(files[n]["size"])):
        r = min(range(world_size), key=lambda i: (load[i], i))
        shares[r].append(name)
        load[r] += int(files[name]["size"])
    return [sorted(s) for s in shares]
