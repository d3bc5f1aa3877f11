"""The error phrases (`phrases.yaml`): text that means something failed, wherever it is.

Read by `capture.error_text` (every input of `analyze`, and `check`'s nvidia-smi fallback)
and by the kernel-log capture reader, which looks for `log_needles()` in the same pass as
the Xid lines. Pure data and lookups: what counts as "explained" is decided in
`capture.error_text`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from itertools import compress

from pydantic import BaseModel, ConfigDict, Field

from gpuvigil.core.config import StrictModel, load_shipped_yaml, validate


class Phrase(StrictModel):
    id: str
    domain: str  # nvidia-driver, nvml, dcgm, fabric-manager, mlx5, efa, pcie-aer, host-hardware
    text: str = Field(min_length=6)  # matched literally, case-sensitively
    means: str
    source: str  # where the message is printed (a document or the code that prints it)
    explained_by: dict[str, tuple[str, ...]] = Field(default_factory=dict)  # kind -> prefixes
    anchor: str | None = None  # on every kernel-log line that can hold it (see the yaml)


class PhraseCatalog(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int
    phrases: tuple[Phrase, ...]

    def log_needles(self) -> tuple[bytes, ...]:
        """Every phrase's text as bytes: what a streamed kernel log is searched for (one
        `bytes.find` pass each over a chunk, never a decoded line)."""
        return tuple(dict.fromkeys(p.text.encode() for p in self.phrases))

    def log_anchors(self) -> tuple[bytes, ...]:
        """The anchors: in a kernel log, a phrase counts on a line that holds one of them
        (or a needle of the reader's own), as the driver prints it (see the yaml)."""
        return tuple(dict.fromkeys(p.anchor.encode() for p in self.phrases if p.anchor))

    def in_line(self, line: str) -> list[Phrase]:
        # Every test in C (`compress` over `str.__contains__`): a bytecode loop over the
        # 36 phrases cost 9 us a line, most of analyze's work per Xid line in a storm.
        return list(compress(self.phrases, map(line.__contains__, self._texts)))

    @cached_property
    def _texts(self) -> tuple[str, ...]:
        return tuple(p.text for p in self.phrases)  # no attribute look-up per phrase


@dataclass(frozen=True)
class Hit:
    """One phrase as seen in one input: the first line that holds it, and how often."""

    phrase: str  # Phrase.id
    line: str
    count: int = 1


MAX_LINE = 300  # of a hit's line kept as evidence


def hits_in_text(text: str, catalog: PhraseCatalog | None = None) -> list[Hit]:
    """Every phrase found in a document, with the first line that holds it."""
    cat = catalog or load()
    out: list[Hit] = []
    for p in cat.phrases:
        at = text.find(p.text)
        if at < 0:
            continue
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        line = text[start : end if end >= 0 else len(text)].strip()
        out.append(Hit(p.id, line[:MAX_LINE], text.count(p.text)))
    return out


@dataclass
class HitCounter:
    """Hits gathered line by line (the kernel-log reader feeds it the lines it scans)."""

    catalog: PhraseCatalog
    seen: dict[str, Hit] | None = None  # each phrase's first hit (count: `hits()`)
    _more: dict[str, int] = field(default_factory=dict, repr=False)  # hits after the first

    def feed(self, line: str) -> None:
        for p in self.catalog.in_line(line):
            if self.seen is None:
                self.seen = {}
            first = self.seen.get(p.id)
            if first is None:
                self.seen[p.id] = Hit(p.id, line.strip()[:MAX_LINE])
            else:  # counted apart: a frozen Hit per line of an Xid storm cost 1.5 us
                self._more[p.id] = self._more.get(p.id, 0) + 1

    def hits(self) -> tuple[Hit, ...]:
        more = self._more
        return tuple(
            Hit(h.phrase, h.line, h.count + more[k]) if k in more else h
            for k, h in (self.seen or {}).items()
        )


@cache
def load() -> PhraseCatalog:
    text = resources.files(__package__).joinpath("phrases.yaml").read_text("utf-8")
    return validate(PhraseCatalog, load_shipped_yaml(text), source="phrases.yaml")
