"""Parsers and rules never raise on garbage (hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.node.checks.fabric import fabric, rules
from gpuvigil.node.checks.fabric.readings import (
    FabricAdapter,
    FabricPort,
    FabricReading,
    FiInfo,
    NetDev,
)
from gpuvigil.node.checks.fabric.rules import FabricExpectation
from gpuvigil.node.checks.pcie import pcie
from gpuvigil.node.config import FabricConfig

text = st.text(max_size=80)


@given(text)
def test_parsers_never_raise(s):
    fabric.parse_state(s)
    fabric.parse_rate(s)
    fabric.parse_fi_info(s)
    pcie.parse_speed(s)
    pcie.parse_width(s)


ports = st.builds(
    FabricPort,
    number=st.integers(0, 4),
    state=st.one_of(st.none(), st.sampled_from(["ACTIVE", "DOWN", "INIT"]), text),
    phys_state=st.one_of(st.none(), st.sampled_from(["LinkUp", "Polling"]), text),
    rate_gbps=st.one_of(st.none(), st.floats(allow_nan=True)),
    link_layer=st.one_of(st.none(), text),
    counters=st.lists(
        st.tuples(
            st.sampled_from(["link_downed", "symbol_error", "rx_drops", "x"]),
            st.integers(-(2**70), 2**70),
        ),
        max_size=4,
    ).map(tuple),
    problems=st.lists(text, max_size=2).map(tuple),
)
adapters = st.builds(
    FabricAdapter,
    name=st.sampled_from(["mlx5_0", "mlx5_1", "rdmap16s0"]),
    kind=st.sampled_from(["efa", "ib", "roce"]),
    ports=st.lists(ports, max_size=3).map(tuple),
    netdevs=st.lists(
        st.builds(
            NetDev,
            name=text,
            operstate=st.one_of(st.none(), text),
            carrier=st.one_of(st.none(), st.integers()),
        ),
        max_size=2,
    ).map(tuple),
)
readings = st.builds(
    FabricReading,
    taken_at=st.datetimes(
        timezones=st.just(UTC), min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1)
    ),
    adapters=st.lists(adapters, max_size=4).map(tuple),
    sysfs_present=st.booleans(),
    fi_info=st.one_of(
        st.none(),
        st.builds(FiInfo, domains=st.lists(text, max_size=3).map(tuple), ran=st.booleans()),
    ),
)
expectations = st.builds(
    FabricExpectation,
    kind=st.sampled_from([None, "efa", "ib", "roce"]),
    count=st.one_of(st.none(), st.integers(0, 40)),
    rate_gbps=st.one_of(st.none(), st.floats(0.1, 1000)),
)


@settings(max_examples=200, deadline=None)
@given(readings, readings, expectations, st.floats(-1e6, 1e6))
def test_rules_never_raise(now, before, expected, shift):
    previous = FabricReading(
        taken_at=now.taken_at - timedelta(seconds=shift), adapters=before.adapters
    )
    findings = rules.judge(now, expected=expected, config=FabricConfig(), previous=previous)
    assert all(f.check == "fabric" for f in findings)


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=64), st.binary(max_size=64), st.binary(max_size=64))
def test_probes_never_raise_on_garbage_files(state, rate, counter):
    import tempfile
    from pathlib import Path

    from gpuvigil.fakes.sysfs import FakeSysfs

    with tempfile.TemporaryDirectory() as d:
        fs = FakeSysfs.node(Path(d), gpus=1, adapters=1)
        port = fs.port_dir("mlx5_0")
        (port / "state").write_bytes(state)
        (port / "rate").write_bytes(rate)
        (port / "counters" / "link_downed").write_bytes(counter)
        (fs.pci_dir(fs.pci_of["mlx5_0"]) / "current_link_width").write_bytes(counter)
        reading = fabric.read_fabric(Path(d))
        rules.judge(reading, expected=FabricExpectation(kind="ib", count=1), config=FabricConfig())
        pcie.read_pcie(Path(d))
