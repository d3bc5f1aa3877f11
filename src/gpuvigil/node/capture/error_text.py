"""Never healthy on an error: the error phrases (`catalog/phrases.yaml`) an input holds
that its reader's rules did not explain -> ERROR_TEXT ("could not tell"). Pure.

Called by `analyze` for every input it read (documents and kernel logs alike, whatever
their kind) and by `check` for the nvidia-smi output it fell back to. A phrase is
explained when the input's kind is one of the phrase's `explained_by` kinds and the
input's findings hold a WARNING-or-worse finding whose code starts with one of the
prefixes given for that kind (the Xid rule explains `NVRM: Xid (` in a kernel log; the
same words in a DCGM output are not explained). One finding per unexplained phrase, pinned
to the input, so the operator sees the line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuvigil.core.findings import Finding, Status
from gpuvigil.node.catalog import phrases as catalog


def unexplained(
    hits: Iterable[catalog.Hit],
    *,
    kind: str | None,
    findings: Sequence[Finding],
    check: str,
    input_name: str,
) -> list[Finding]:
    cat = {p.id: p for p in catalog.load().phrases}
    raised = tuple(f.code for f in findings if f.status is not Status.OK)
    left: list[tuple[catalog.Phrase, catalog.Hit]] = []
    for hit in hits:
        phrase = cat.get(hit.phrase)
        if phrase is None:
            continue
        prefixes = phrase.explained_by.get(kind or "", ())
        if prefixes and any(code.startswith(prefixes) for code in raised):
            continue
        left.append((phrase, hit))
    if not left:
        return []
    first, hit = left[0]
    more = f", and {len(left) - 1} more error phrase(s)" if len(left) > 1 else ""
    return [
        Finding(
            check=check,
            status=Status.FAILED,
            code="ERROR_TEXT",
            component=f"input:{input_name}",  # one per input (`analyze` keys on it)
            message=(
                f"could not tell: {input_name} holds {first.text!r} ({first.means}; "
                f"{hit.count}x){more}, and no rule for {kind or 'this input'} judged it"
            ),
            evidence={
                "phrases": [
                    {
                        "phrase": p.id,
                        "domain": p.domain,
                        "line": h.line,
                        "count": h.count,
                        "source": p.source,
                    }
                    for p, h in left
                ]
            },
        )
    ]
