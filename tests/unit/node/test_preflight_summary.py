"""The preflight annotation's summary lists whole problems within its limit, then a count."""

from __future__ import annotations

from gpuvigil.node.preflight import whole_items


def test_whole_items_never_cut_and_say_how_many_are_left_out() -> None:
    items = [f"gpu:{i} ECC_UNCORRECTED_VOLATILE" for i in range(8)]
    out = whole_items(items, limit=120)
    assert len(out) <= 120 and out.endswith(" more)")
    kept, _, more = out.rpartition("; (+")
    assert all(k in items for k in kept.split("; "))
    assert int(more.split()[0]) == len(items) - len(kept.split("; "))
    assert whole_items(["node FABRIC_COUNT_LOW"], limit=500) == "node FABRIC_COUNT_LOW"
