"""`npd-plugin`'s one line: within NPD's byte limit, cut only between words, count whole."""

from __future__ import annotations

from gpuvigil.commands.npd import fit, message
from gpuvigil.core.findings import Action, Finding, NodeReport, Status

LONG = ("Xid 79 on PCI (0000:5D:00.0): GPU has fallen off the bus; seen 1x, calls for REBOOT "
        "(the driver lost the device)")  # fmt: skip


def report(*messages: str) -> NodeReport:
    return NodeReport(node="n", findings=tuple(
        Finding(check="kernel_log", status=Status.FAILED, code="XID_79", component=f"gpu:{i}",
                message=m, action=Action.REBOOT, fatal=True)
        for i, m in enumerate(messages)))  # fmt: skip


def test_cut_between_words_within_npds_default_80_bytes() -> None:
    out = message(report(LONG, "second"), limit=80)
    assert len(out.encode()) <= 80 and out.endswith("... (+1 more)")
    kept = out.removesuffix("... (+1 more)")
    whole = f"XID_79 gpu:0: {LONG}"
    assert whole.startswith(kept) and whole[len(kept)] == " "  # the next char starts a word


def test_fits_unchanged_and_multibyte_text_never_splits_a_character() -> None:
    assert message(report("short"), limit=80) == "XID_79 gpu:0: short"
    out = fit("température élevée sur le GPU numéro trois", limit=20)
    assert len(out.encode()) <= 20 and out == "température..."
    assert fit("ABCDEFGHIJKLMNOP", limit=8) == "ABCDEFGH"  # one word longer than the limit
