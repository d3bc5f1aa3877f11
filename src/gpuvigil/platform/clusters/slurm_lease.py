"""The Slurm controllers' Lease: a compare-and-swap register made of versioned files in a
folder every controller host shares (by default `gpuvigil-lease` in slurmctld's
StateSaveLocation, which a Slurm HA pair shares already). Used by `clusters.slurm` for
`platform.leader` and `platform.budget`; the reasons for this design are in
docs/controller.md ("Slurm: the lease").

- Version N of the Lease is the file `lease.<N>.json`, complete before it appears: it is
  written to a private temporary file and then hard-linked to its name. `link()` fails if
  the name exists, atomically, on a local filesystem and on NFSv3/v4 alike, so of two
  writers that both read version N only one creates N+1: that is the compare-and-swap.
- Nothing is ever rewritten in place, and no lock is held: a controller that dies or
  pauses mid-write leaves at most a stray temporary file.
- Old versions are pruned, keeping the newest `KEEP`. A writer first checks that the
  version it read still exists, so a reader that fell more than `KEEP` versions behind
  gets a Conflict instead of re-creating a pruned name.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuvigil.platform.clusters.base import Conflict, LeaseObject, Unavailable

KEEP = 1000  # versions kept: ~30 min of renewals every 2 s
_NAME = re.compile(r"^lease\.(\d{12})\.json$")


class FileLease:
    def __init__(self, folder: str | Path | Callable[[], str]) -> None:
        self._folder = folder  # a callable is asked on first use (it may run scontrol)
        self._dir: Path | None = None
        self._last = 0  # the newest version this process has seen (a hint, never trusted)

    @property
    def dir(self) -> Path:
        if self._dir is None:
            f = self._folder
            self._dir = Path(f() if callable(f) else f)
        return self._dir

    def _path(self, n: int) -> Path:
        return self.dir / f"lease.{n:012d}.json"

    def _latest(self) -> int:
        """The newest version: from the hint if it still exists, else from a listing; then
        look for newer ones one by one (a listing may lag on NFS; a lookup does not)."""
        n = self._last
        if n == 0 or not self._path(n).exists():
            try:
                names = os.listdir(self.dir)
            except FileNotFoundError:
                return 0
            except OSError as e:
                raise Unavailable(f"lease folder {self.dir}: {e}") from e
            found = [int(m.group(1)) for x in names if (m := _NAME.match(x))]
            n = max(found, default=0)
        while self._path(n + 1).exists():
            n += 1
        self._last = n
        return n

    def get(self) -> LeaseObject | None:
        for _ in range(3):
            n = self._latest()
            if n == 0:
                return None
            try:
                text = self._path(n).read_text(encoding="utf-8")
            except FileNotFoundError:  # pruned under us: look again
                self._last = 0
                continue
            except OSError as e:
                raise Unavailable(f"lease file {self._path(n)}: {e}") from e
            return _decode(text, str(n))
        raise Unavailable(f"the lease in {self.dir} kept moving")

    def create(self, spec: Mapping[str, Any], annotations: Mapping[str, str]) -> LeaseObject:
        if self._latest() != 0:
            raise Conflict("the lease exists")
        return self._link(0, spec, annotations)

    def replace(
        self, spec: Mapping[str, Any], annotations: Mapping[str, str], *, version: str
    ) -> LeaseObject:
        n = int(version) if version.isdigit() else -1
        if n < 1 or not self._path(n).exists():
            raise Conflict(f"lease version {version} is gone (pruned or never written)")
        return self._link(n, spec, annotations)

    def _link(self, n: int, spec: Mapping[str, Any], annotations: Mapping[str, str]) -> LeaseObject:
        text = json.dumps({"spec": dict(spec), "annotations": dict(annotations)})
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = self.dir / f".tmp.{uuid.uuid4().hex}"
            with open(tmp, "x", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise Unavailable(f"lease folder {self.dir}: {e}") from e
        try:
            os.link(tmp, self._path(n + 1))
        except FileExistsError as e:
            raise Conflict(f"lease version {n + 1} was written by someone else") from e
        except OSError as e:
            raise Unavailable(f"lease folder {self.dir}: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)
        self._last = n + 1
        self._prune(n + 1)
        return LeaseObject(dict(spec), dict(annotations), str(n + 1))

    def _prune(self, newest: int) -> None:
        if newest % 100:  # now and then is enough
            return
        try:
            for name in os.listdir(self.dir):
                m = _NAME.match(name)
                if m and int(m.group(1)) <= newest - KEEP:
                    (self.dir / name).unlink(missing_ok=True)
        except OSError:
            pass  # pruning is housekeeping; the next one tries again


def _decode(text: str, version: str) -> LeaseObject:
    """A version that does not parse reads as held by nobody known: replicas wait a
    whole lease duration before taking it over, as they would from a silent holder."""
    try:
        data = json.loads(text)
        spec, ann = data["spec"], data["annotations"]
        if not isinstance(spec, dict) or not isinstance(ann, dict):
            raise TypeError
        return LeaseObject(spec, {str(k): str(v) for k, v in ann.items()}, version)
    except (ValueError, KeyError, TypeError):
        return LeaseObject({"holderIdentity": "(unreadable)"}, {}, version)
