"""`reconcile`'s lookup by instant (one source per text) finds what comparing each of the
last 64 entries finds: the same entries, with the same sources, whatever the mix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.node.checks.kernel_log.readings import XidEvent
from gpuvigil.node.checks.kernel_log.rules import xid_reconcile
from gpuvigil.node.checks.kernel_log.rules.xid_reconcile import Seen, reconcile

T0 = datetime(2026, 12, 7, tzinfo=UTC)


def by_comparison(events: list[XidEvent], same_line_s: float = 1.0) -> list[Seen]:
    """The kernel-log half of `reconcile` before the lookup: each of the last 64 entries
    of the text compared in turn (`_same_instant`)."""
    kernel: list[Seen] = []
    by_text: dict[tuple[object, ...], list[Seen]] = {}
    for ev in events:
        key = (ev.kind, ev.code, ev.bus_id or ev.pci_bus_id, ev.device, ev.message)
        same = by_text.setdefault(key, [])
        hit = next(
            (s for s in reversed(same[-64:]) if xid_reconcile._same_instant(s, ev, same_line_s)),
            None,
        )
        if hit is not None:
            hit.sources.add(ev.source)
            continue
        s = Seen(ev, {ev.source})
        same.append(s)
        kernel.append(s)
    return kernel


def event(code: int, source: str, stamp: int, timed: bool, seq: int | None) -> XidEvent:
    return XidEvent(
        kind="xid",
        code=code,
        pci_bus_id="0000:3b:00",
        bus_id="0000:3b:00.0",
        message="m",
        line=f"[{stamp}] Xid {code}",
        timestamp=str(stamp),
        time=T0 + timedelta(seconds=stamp / 2) if timed else None,
        uptime_s=None if timed else float(stamp),
        source=source,  # type: ignore[arg-type]
        seq=seq,
    )


events = st.lists(
    st.builds(
        event,
        st.sampled_from([13, 79]),
        st.sampled_from(["file", "file", "file", "kmsg", "journal"]),
        st.integers(0, 90),  # few instants: many repeats, and older than 64 entries too
        st.booleans(),
        st.one_of(st.none(), st.integers(0, 5)),
    ),
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(events)
def test_the_lookup_keeps_what_the_comparisons_keep(evs: list[XidEvent]) -> None:
    got = reconcile(evs)
    want = by_comparison(evs)
    assert [(s.event, s.sources) for s in got] == [(s.event, s.sources) for s in want]


def test_a_storm_from_one_source_repeats_only_identical_lines() -> None:
    storm = [event(13, "file", i % 50, True, None) for i in range(1000)]
    assert len(reconcile(storm)) == 50  # each instant once: the rest are re-reads
    # An instant last seen more than 64 entries back is a new line (as compared before).
    spread = [event(13, "file", i % 100, True, None) for i in range(200)]
    assert len(reconcile(spread)) == 200
