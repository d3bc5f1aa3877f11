"""Never healthy on an error: every phrase of `catalog/phrases.yaml`, planted in the real
samples of every format `analyze` reads, leaves nothing reading healthy (exit 0).

Real samples: ../shared/corpus (kernel logs, nvidia-smi -q / -q -x / table / nvlink,
ibstat, ibstatus; provenance in its MANIFEST files) read at test time, and the real posted
tool outputs under tests/unit/node/tools/data (cited in tests/unit/node/tools). Each sample
is first read as it is; then, for each phrase, it is read with one line holding the phrase
(in a kernel log: a line with that log's own stamp, on the driver's line when the phrase
has an anchor; in XML: a comment; elsewhere: a line in the middle). Phrases rotate over
the samples of a kind, so every phrase meets every kind and every sample is used.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from gpuvigil.core.findings import Status
from gpuvigil.node.capture.error_text import unexplained
from gpuvigil.node.capture.judge import Expect
from gpuvigil.node.capture.kinds import detect
from gpuvigil.node.capture.session import Options, analyze
from gpuvigil.node.catalog import phrases
from gpuvigil.node.config import NodeConfig

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "data"
CATALOG = phrases.load()
_STAMP = re.compile(
    r"^(?:kern\s*:\s*\w+\s*:\s*)?"
    r"(?:\[[^\]]*\]\s*|\d{4}-\d\d-\d\dT\S+\s+|[A-Z][a-z]{2}\s+\d+ [\d:]+ \S+ kernel: )"
)


def samples(corpus: Path) -> dict[str, list[Path]]:
    """Every real sample file by the kind `analyze` takes it for."""
    found: dict[str, list[Path]] = defaultdict(list)
    paths = [
        *sorted((corpus / "kernel_logs").glob("*.log")),
        *sorted((corpus / "nvidia_smi").glob("*.txt")),
        *sorted((corpus / "nvidia_smi").glob("*.xml")),
        *sorted((corpus / "network").glob("*.txt")),
        *sorted(p for p in TOOLS.glob("*real*")),
    ]
    for p in paths:
        kind = detect(p.read_bytes()[:65536])
        if kind is not None:
            found[kind].append(p)
    return found


def planted(text: str, kind: str, phrase: phrases.Phrase) -> str:
    lines = text.splitlines()
    mid = len(lines) // 2
    if kind == "nvidia-smi-xml":
        at = next(i for i, ln in enumerate(lines) if "<nvidia_smi_log" in ln) + 1
        return "\n".join([*lines[:at], f"<!-- {phrase.text} -->", *lines[at:]]) + "\n"
    if kind == "kernel-log":
        stamped = [ln for ln in lines[mid:] + lines[:mid] if _STAMP.match(ln)]
        stamp = _STAMP.match(stamped[0]).group(0) if stamped else ""  # type: ignore[union-attr]
        anchor = phrase.anchor or "NVRM:"  # a tool's words logged by the driver
        said = phrase.text if anchor in phrase.text else f"{anchor} {phrase.text}"
        line = f"{stamp}{said} (planted by the test)"
        return "\n".join([*lines[:mid], line, *lines[mid:]]) + "\n"
    return "\n".join([*lines[:mid], phrase.text, *lines[mid:]]) + "\n"


def verdict(path: Path) -> tuple[Status, list[str]]:
    """Healthy is OK: a WARNING (an explained non-fatal SXid) or worse is not healthy."""
    opts = Options(node=NodeConfig(), expect=Expect())
    report, _ = analyze([(str(path), None)], opts=opts)
    return report.status, sorted({f.code for f in report.problems})


def test_the_catalog_covers_each_domain_and_cites_each_phrase() -> None:
    domains = {p.domain for p in CATALOG.phrases}
    assert {"nvidia-driver", "nvml", "dcgm", "fabric-manager", "mlx5", "efa", "pcie-aer"} <= domains
    assert len({p.id for p in CATALOG.phrases}) == len(CATALOG.phrases)
    for p in CATALOG.phrases:
        assert p.source.startswith("https://"), p.id
        assert p.anchor is None or p.anchor in p.text or p.anchor in {"NVRM:", "mlx5_core"}, p.id


def test_no_real_sample_holds_a_phrase_it_does_not_explain(corpus: Path, tmp_path: Path) -> None:
    """The guard adds nothing to the real outputs as they are (no false could-not-tell)."""
    for kind, paths in samples(corpus).items():
        for p in paths:
            opts = Options(node=NodeConfig(), expect=Expect())
            report, _ = analyze([(str(p), None)], opts=opts)
            assert not [f for f in report.findings if f.code == "ERROR_TEXT"], (kind, p.name)


def test_every_phrase_in_every_format_is_never_healthy(corpus: Path, tmp_path: Path) -> None:
    by_kind = samples(corpus)
    assert {"kernel-log", "nvidia-smi-q", "nvidia-smi-xml", "ibstat", "fabric-manager"} <= set(
        by_kind
    )
    healthy: list[str] = []
    for kind, paths in sorted(by_kind.items()):
        for i, phrase in enumerate(CATALOG.phrases):
            src = paths[i % len(paths)]
            out = tmp_path / f"{kind}-{phrase.id}-{src.name}"
            out.write_text(planted(src.read_text(errors="replace"), kind, phrase))
            status, problems = verdict(out)
            if status is Status.OK:
                healthy.append(f"{phrase.id} in {src.name} ({kind}): {problems}")
    assert not healthy, "\n".join(healthy)


@pytest.mark.parametrize(
    ("kind", "codes", "expect_error_text"),
    [
        ("kernel-log", ["XID_79"], False),  # the Xid rule explains "NVRM: Xid ("
        ("kernel-log", ["GPU_LOST"], False),
        ("kernel-log", [], True),  # no rule gave a finding: could not tell
        ("dcgmi-diag", ["XID_79"], True),  # Xid words in a DCGM output: not its rule's
    ],
)
def test_explained_means_the_kinds_rule_gave_a_finding(
    kind: str, codes: list[str], expect_error_text: bool
) -> None:
    from gpuvigil.core.findings import Finding

    hit = phrases.Hit("xid" if "GPU_LOST" not in codes else "fallen-off-the-bus", "a line")
    found = [Finding(check="x", status=Status.FAILED, code=c) for c in codes]
    out = unexplained([hit], kind=kind, findings=found, check="x", input_name="f")
    assert bool(out) is expect_error_text
    if out:
        assert out[0].code == "ERROR_TEXT" and out[0].could_not_run
        assert out[0].evidence["phrases"][0]["line"] == "a line"
