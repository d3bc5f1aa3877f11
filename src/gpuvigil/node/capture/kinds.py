"""What a captured file is, told from its content (never from its name), and its reader.

Every kind is a `Format` that a health domain declares in its spec
(`node/checks/<domain>/__init__.py`, `DOMAIN.formats`); this module names no domain. It
collects them on each call (`find_domains` imports only the specs), so a new domain's
formats are read with no edit here.

`detect(head)` looks at the first 64 KiB (already decoded to UTF-8) and returns the kind
whose detector says yes first, every domain's detectors in one order by rank (a tool's
own header, then a shape, the kernel log, the loosest, last), or None: a file that is
none of these is named as not recognised and never judged. `--kind` forces one (`kinds`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuvigil.node.checks.domain import Domain, Format, find_domains


@dataclass(frozen=True)
class Kind:
    name: str  # what --kind takes
    check: str  # the check its findings belong to (as in `gpuvigil check`)
    what: str  # for people: the command that prints it
    domain: str = ""  # the domain folder that declares it


def kinds() -> dict[str, Kind]:
    """Every kind a domain declares, by name, in domain then declaration order."""
    out: dict[str, Kind] = {}
    for domain in find_domains().values():
        for fmt in domain.formats:
            if fmt.kind in out:
                raise ValueError(
                    f"kind {fmt.kind!r} declared by {out[fmt.kind].domain} and {domain.name}"
                )
            out[fmt.kind] = Kind(fmt.kind, fmt.check, fmt.what, domain.name)
    return out


def detect(head: bytes) -> str | None:
    """The kind of a capture from its first bytes, or None when it is none we read."""
    text = head.decode("utf-8", errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for _, kind, test in _detectors():
        if test(text, lines):
            return kind
    return None


def reader(kind: str) -> Callable[[str], list[object]] | None:
    """The reader of a kind (text -> readings); None for a kind `analyze` reads itself
    (a streamed kernel log, a sysfs folder). KeyError for a kind no domain declares."""
    domain, fmt = _formats()[kind]
    return domain.resolve(fmt.read) if fmt.read else None


def _formats() -> dict[str, tuple[Domain, Format]]:
    return {f.kind: (d, f) for d in find_domains().values() for f in d.formats}


def _detectors() -> list[tuple[int, str, Callable[[str, list[str]], bool]]]:
    found = [
        (det.rank, fmt.kind, domain, det.test)
        for domain in find_domains().values()
        for fmt in domain.formats
        for det in fmt.detect
    ]
    found.sort(key=lambda x: (x[0], x[1]))
    return [(rank, kind, domain.resolve(test)) for rank, kind, domain, test in found]
