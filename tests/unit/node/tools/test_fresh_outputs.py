"""`gpuvigil analyze` over a set of real public outputs gathered after the readers were
written (fresh/, sources and ground truth in fresh/MANIFEST.tsv): the stand-in for the
reviewer's unseen set. Nothing that shows a failure may read healthy, and at least 90%
must be judged right. Each file is a verbatim public output or a contiguous excerpt of one
(as a search shows it: cut at either end), never edited. Batch 1 was gathered, scored
(22/28 right) and the readers fixed by class; batch 2 was gathered after those fixes and
scored before any further change (8/10 right: a plain table cut at its third GPU read
healthy, a -q excerpt cut inside the clock reasons not recognised), then both fixed by class.
Batch 3 likewise (5/6): a kernel log with an uncorrected host memory error (EDAC) and an
APEI recoverable PCIe error read healthy; those texts joined the phrase catalog, so it is
now "could not tell" (ERROR_TEXT), still counted below as not right. Batch 4 (3/3)
needed no change. Batch 5 (13 posts, thin kinds first: 8-GPU `topo -m`, r580 tables and
-q, `ethtool -S`, journal and dmesg lines) scored 10/13 before any change: two kernel logs
that show a failure read healthy (a GSP timeout banner with no Xid line; Xorg's "Failed to
initialize the NVIDIA GPU" relayed to the journal) and a Fabric Manager line behind a
collector's `<host>: ` prefix was not recognised; the driver-fault reader and the FM reader
now read those forms (13/13).

Judged right: a healthy output has no problem; a failing one has every code its manifest
row expects (component aside: excerpts often drop the names) and one that is not a
could-not-tell code (ERROR_TEXT alone is "could not tell", never right); an output that
genuinely lacks the facts (truth `unknown`) is "could not tell" (exit 2).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuvigil.core.codes import COULD_NOT_RUN
from gpuvigil.core.findings import Status
from gpuvigil.node.capture.bundle import Limits
from gpuvigil.node.capture.judge import Expect
from gpuvigil.node.capture.session import Options, analyze
from gpuvigil.node.config import NodeConfig

FRESH = Path(__file__).parent / "fresh"
OPTS = Options(node=NodeConfig(), expect=Expect(), limits=Limits())


@dataclass(frozen=True)
class Case:
    file: str
    source: str
    truth: str  # healthy | failing | unknown
    expect: frozenset[str]
    batch: str


def cases() -> list[Case]:
    with (FRESH / "MANIFEST.tsv").open(newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [
        Case(
            r["file"],
            r["source"],
            r["truth"],
            frozenset() if r["expect"] == "-" else frozenset(r["expect"].split(",")),
            r["batch"],
        )
        for r in rows
    ]


def verdict(case: Case) -> tuple[str, str]:
    """("right" | "wrong" | "could not tell" | "healthy on a failure", what it said)."""
    report, [inp] = analyze([(str(FRESH / case.file), None)], opts=OPTS)
    codes = {f.code for f in report.problems}
    worst = Status.worst(f.status for f in report.findings) if report.findings else Status.OK
    said = f"{inp.kind or inp.how}: exit {report.exit_code()} {sorted(codes)}"
    if case.truth == "healthy":
        ok = not report.problems
    elif case.truth == "failing":
        ok = case.expect <= codes and bool(case.expect - COULD_NOT_RUN)
        if worst is Status.OK:
            return "healthy on a failure", said
    else:
        ok = report.exit_code() == 2
    if ok:
        return "right", said
    return ("could not tell" if report.exit_code() == 2 else "wrong"), said


def test_the_manifest_names_every_file_once() -> None:
    listed = [c.file for c in cases()]
    assert sorted(listed) == sorted(p.name for p in FRESH.glob("*.txt"))
    assert len(set(listed)) == len(listed)
    assert all(c.truth in {"healthy", "failing", "unknown"} for c in cases())
    assert all(c.source.startswith("https://github.com/") for c in cases())
    assert all(c.expect for c in cases() if c.truth == "failing")
    assert {c.batch for c in cases()} == {"1", "2", "3", "4", "5"}


# Judged "could not tell" today, and why: no rule judges host (non-GPU) hardware errors.
NOT_YET = {"dmesg_lwa_117_edac_ue_apei_pcie.txt": "could not tell"}


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.file)
def test_each_fresh_output_is_judged_as_pinned(case: Case) -> None:
    # Pins the readers' fixes for these classes (elided `nvlink -s`, ibstat excerpts, the
    # table without its header or cut, systemctl's failure answer, `Unknown Error` fields,
    # -q excerpts cut inside a section, host hardware error phrases).
    v, said = verdict(case)
    assert v == NOT_YET.get(case.file, "right"), (case.truth, said, case.source)


def test_at_least_90_percent_are_judged_right(capsys: pytest.CaptureFixture[str]) -> None:
    results = [(c, *verdict(c)) for c in cases()]
    right = sum(1 for _, v, _ in results if v == "right")
    with capsys.disabled():
        print(f"\nfresh real outputs: {right}/{len(results)} right ({right / len(results):.0%})")
        for c, v, said in results:
            if v != "right":
                print(f"  {v}: {c.file} ({c.truth}) -> {said}")
    assert not [c.file for c, v, _ in results if v == "healthy on a failure"]
    assert right / len(results) >= 0.9
