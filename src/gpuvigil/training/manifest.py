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


def dir_name(step: int) -> str:
    return f"step-{step:09d}"


def step_of(name: str) -> int | None:
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    files: dict[str, dict[str, Any]]  # relative name -> {"size": int, "sha256": str | None}
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


def build(
    storage: Storage,
    folder: str,
    *,
    step: int,
    world_size: int,
    checksums: bool,
    created_ts: float,
    extra: dict[str, Any] | None = None,
) -> Manifest:
    files: dict[str, dict[str, Any]] = {}
    for name, size in storage.list_files(folder):
        if name == MANIFEST or name.rsplit("/", 1)[-1].startswith(".tmp-"):
            continue
        digest = storage.sha256(storage.join(folder, name)) if checksums else None
        files[name] = {"size": size, "sha256": digest}
    return Manifest(step, world_size, files, created_ts, dict(extra or {}))


def verify(storage: Storage, folder: str, *, checksums: bool = True) -> tuple[Manifest | None, str]:
    """(manifest, "") when the folder is a complete, intact checkpoint; else (None, why)."""
    path = storage.join(folder, MANIFEST)
    try:
        raw = storage.read_bytes(path)
    except (OSError, FileNotFoundError):
        return None, "no manifest (the save never committed)"
    try:
        m = Manifest.from_json(raw)
    except ValueError as e:
        return None, str(e)
    if ".metadata" not in m.files:
        return None, "manifest lists no DCP .metadata file"
    for name, entry in sorted(m.files.items()):
        full = storage.join(folder, name)
        try:
            size = storage.size(full)
        except (OSError, FileNotFoundError):
            return None, f"file {name} is missing"
        if size != entry["size"]:
            return None, f"file {name} has {size} bytes, manifest says {entry['size']}"
        want = entry.get("sha256")
        if checksums and want:
            got = storage.sha256(full)
            if got != want:
                return None, f"file {name} fails its SHA-256 check ({got[:12]} != {want[:12]})"
    return m, ""


def candidates(storage: Storage) -> list[tuple[int, str]]:
    """(step, folder) of every step-* folder, newest first, committed or not."""
    out = []
    for name in storage.list_dir(storage.root):
        step = step_of(name)
        if step is not None:
            out.append((step, storage.join(name)))
    return sorted(out, reverse=True)


def committed(storage: Storage) -> list[tuple[int, str]]:
    """Folders with a manifest (not verified), newest first."""
    return [(s, f) for s, f in candidates(storage) if storage.exists(storage.join(f, MANIFEST))]


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
        if f not in keep and s < newest and not storage.exists(storage.join(f, MANIFEST))
    ]
    return sorted(set(out))
