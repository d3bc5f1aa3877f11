"""Xid rules: mapping, clearing, reconciliation, boot noise, alone-only, escalation."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.core.findings import Action, Status
from gpuvigil.node.catalog.xid import CatalogOverrides, load_catalog
from gpuvigil.node.checks.gpu.readings import GpuRef, GpuReset, GpuResets, gpu_map
from gpuvigil.node.checks.kernel_log.kernel_log_parser import parse_line
from gpuvigil.node.checks.kernel_log.readings import KernelLog, XidEvent
from gpuvigil.node.checks.kernel_log.rules.xid import evaluate, evaluate_log, reconcile

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
BUS = {0: "0000:1b:00", 3: "0000:3b:00", 7: "0000:db:00"}
GPUS = gpu_map(
    GpuRef(index=i, bus_id=f"{b}.0", family="hopper", uuid=f"GPU-{i}") for i, b in BUS.items()
)
CAT = load_catalog()


def xid(code, *, gpu=3, ago_s=60.0, text="x", boot="b1", source="kmsg", bus=None):
    line = f"NVRM: Xid (PCI:{bus or BUS.get(gpu, '0000:99:00')}): {code}, pid=1, name=p, {text}"
    ev = parse_line(line, source=source)
    assert ev is not None
    return ev.with_(time=NOW - timedelta(seconds=ago_s), boot_id=boot)


def sxid(code, *, switch=1, ago_s=60.0, text="Fatal, Link 4 LTSSM Fault Up"):
    line = f"nvidia-nvswitch{switch}: SXid (PCI:0000:0{switch + 5}:00.0): {code}, {text}"
    ev = parse_line(line)
    assert ev is not None
    return ev.with_(time=NOW - timedelta(seconds=ago_s), boot_id="b1")


@dataclass
class Case:
    name: str
    events: list[XidEvent]
    want: list[tuple[str, str, Status, Action]]  # (code, component, status, action)
    kw: dict = field(default_factory=dict)


LOADED = NOW - timedelta(hours=5)
CASES = [
    Case("nothing", [], []),
    Case("xid 79 maps to its gpu", [xid(79)], [("XID_79", "gpu:3", Status.FAILED, Action.REBOOT)]),
    Case(
        "unmapped bus is a pci component",
        [xid(79, bus="0000:99:00")],
        [("XID_79", "pci:0000:99:00.0", Status.FAILED, Action.REBOOT)],
    ),
    Case(
        "unknown xid fails closed",
        [xid(4321)],
        [("XID_4321", "gpu:3", Status.FAILED, Action.INVESTIGATE)],
    ),
    Case(
        "sxid on an nvswitch",
        [sxid(20034, switch=0), sxid(20034, switch=2)],
        [
            ("SXID_20034", "nvswitch:0", Status.FAILED, Action.REBOOT),
            ("SXID_20034", "nvswitch:2", Status.FAILED, Action.REBOOT),
        ],
    ),
    Case(
        "two gpus two findings, worst first",
        [xid(13, gpu=0), xid(48, gpu=7)],
        [
            ("XID_48", "gpu:7", Status.FAILED, Action.RESET_GPU),
            ("XID_13", "gpu:0", Status.WARNING, Action.RESTART_APP),
        ],
    ),
    # clearing
    Case(
        "app xid inside its window",
        [xid(13, ago_s=3000)],
        [("XID_13", "gpu:3", Status.WARNING, Action.RESTART_APP)],
    ),
    Case("app xid after its window", [xid(13, ago_s=3700)], []),
    Case(
        "reset-class xid stays past any window",
        [xid(48, ago_s=86400 * 3)],
        [("XID_48", "gpu:3", Status.FAILED, Action.RESET_GPU)],
        {"driver_loaded_at": NOW - timedelta(days=5)},
    ),
    Case(
        "reset-class xid cleared by a driver load after it",
        [xid(48, ago_s=600)],
        [],
        {"driver_loaded_at": NOW - timedelta(seconds=300)},
    ),
    Case(
        "reset-class xid cleared by a reset of that gpu",
        [xid(48, ago_s=600), xid(95, gpu=7, ago_s=600)],
        [("XID_95", "gpu:7", Status.FAILED, Action.RESET_GPU)],
        {"resets": GpuResets((GpuReset(NOW - timedelta(seconds=60), bus_ids=("0000:3b:00.0",)),))},
    ),
    Case(
        "a reset before the event does not clear it",
        [xid(48, ago_s=600)],
        [("XID_48", "gpu:3", Status.FAILED, Action.RESET_GPU)],
        {"resets": GpuResets((GpuReset(NOW - timedelta(seconds=900), gpus=(3,)),))},
    ),
    Case(
        "a reset does not clear a reboot-class xid",
        [xid(79, ago_s=600)],
        [("XID_79", "gpu:3", Status.FAILED, Action.REBOOT)],
        {"driver_loaded_at": NOW - timedelta(seconds=60)},
    ),
    Case("reboot clears a reboot-class xid", [xid(79, boot="b0")], [], {"boot_id": "b1"}),
    Case(
        "same boot keeps it",
        [xid(79, boot="b1", ago_s=86400 * 30)],
        [("XID_79", "gpu:3", Status.FAILED, Action.REBOOT)],
        {"boot_id": "b1"},
    ),
    Case(
        "replace-class survives a reboot",
        [xid(64, boot="b0")],
        [("XID_64", "gpu:3", Status.FAILED, Action.REPLACE)],
        {"boot_id": "b1"},
    ),
    Case(
        "a release clears replace-class",
        [xid(64, boot="b0", ago_s=600)],
        [],
        {"boot_id": "b1", "released_at": NOW - timedelta(seconds=60)},
    ),
    # Xid 45 only when alone
    Case(
        "xid 45 after another xid is ignored",
        [xid(31, ago_s=65), xid(45, ago_s=60)],
        [("XID_31", "gpu:3", Status.WARNING, Action.RESTART_APP)],
    ),
    Case(
        "xid 45 alone counts", [xid(45)], [("XID_45", "gpu:3", Status.WARNING, Action.RESTART_APP)]
    ),
    Case(
        "xid 45 near an xid on another gpu still counts",
        [xid(31, gpu=0, ago_s=61), xid(45, ago_s=60)],
        [
            ("XID_31", "gpu:0", Status.WARNING, Action.RESTART_APP),
            ("XID_45", "gpu:3", Status.WARNING, Action.RESTART_APP),
        ],
    ),
    # escalation
    Case("xid 92 once is informational", [xid(92)], [("XID_92", "gpu:3", Status.OK, Action.NONE)]),
    Case(
        "xid 92 three times in a day escalates",
        [xid(92, ago_s=80000), xid(92, ago_s=40000), xid(92, ago_s=60)],
        [("XID_92", "gpu:3", Status.FAILED, Action.INVESTIGATE)],
    ),
    Case(
        "xid 92 spread over more than a day does not",
        [xid(92, ago_s=200000), xid(92, ago_s=100000), xid(92, ago_s=60)],
        [("XID_92", "gpu:3", Status.OK, Action.NONE)],
    ),
    Case(
        "xid 68 repeated escalates to a reset",
        [xid(68, ago_s=60 * i) for i in range(1, 6)],
        [("XID_68", "gpu:3", Status.FAILED, Action.RESET_GPU)],
    ),
    # message rules
    Case(
        "nvlink5 nonfatal",
        [xid(145, text="RLW_RXPIPE Nonfatal XC0 i0 Link 3 (0x1)")],
        [("XID_145", "gpu:3", Status.WARNING, Action.NONE)],
    ),
    Case(
        "nvlink5 worst line wins",
        [
            xid(149, text="NETIR_BER_EVENT Nonfatal (0x0)", ago_s=70),
            xid(149, text="NETIR_LINK_EVT Fatal (0x0)"),
        ],
        [("XID_149", "gpu:3", Status.FAILED, Action.RESET_GPU)],
    ),
    Case(
        "xid 154 follows the announced action",
        [
            xid(
                154,
                text="GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            )
        ],
        [("XID_154", "gpu:3", Status.FAILED, Action.REBOOT)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_rules(case):
    got = evaluate(case.events, catalog=CAT, now=NOW, gpus=GPUS, **case.kw)
    assert [(f.code, f.component, f.status, f.action) for f in got] == case.want


def test_evidence_and_message():
    evs = [xid(79, ago_s=120), xid(79, ago_s=60, text="GPU has fallen off the bus.")]
    (f,) = evaluate(evs, catalog=CAT, now=NOW, gpus=GPUS)
    assert f.fatal and f.check == "kernel_log" and f.family == "GPUXidError"
    assert f.evidence["count"] == 2
    assert f.evidence["gpu"] == 3 and f.evidence["family"] == "hopper"
    assert f.evidence["lines"][0].startswith("NVRM: Xid (PCI:0000:3b:00): 79")
    assert f.evidence["first_seen_at"] == (NOW - timedelta(seconds=120)).isoformat()
    assert f.evidence["last_seen_at"] == (NOW - timedelta(seconds=60)).isoformat()
    assert f.evidence["clears_on"] == "reboot"
    assert f.observed_at == NOW - timedelta(seconds=60)
    assert "Xid 79 on GPU 3 (0000:3b:00)" in f.message and "REBOOT" in f.message


def test_many_lines_keep_first_and_last():
    evs = [xid(13, ago_s=100 - i, text=f"n{i}") for i in range(20)]
    (f,) = evaluate(evs, catalog=CAT, now=NOW, gpus=GPUS)
    assert f.evidence["count"] == 20 and len(f.evidence["lines"]) == 5
    assert f.evidence["lines"][-1].endswith("n19")


# --- reconciliation -----------------------------------------------------------------------


def _nvml(code, *, gpu=3, ago_s=60.0):
    return XidEvent(
        kind="xid",
        code=code,
        pci_bus_id=f"{BUS[gpu]}.0",
        bus_id=f"{BUS[gpu]}.0",
        message="",
        line="",
        time=NOW - timedelta(seconds=ago_s),
        source="nvml",
    )


def test_nvml_and_kernel_log_are_one_event():
    (f,) = evaluate([xid(79, ago_s=60), _nvml(79, ago_s=58)], catalog=CAT, now=NOW, gpus=GPUS)
    assert f.evidence["count"] == 1
    assert f.evidence["sources"] == ["kmsg", "nvml"]
    assert f.evidence["lines"][0].startswith("NVRM: Xid")


def test_nvml_only_event_still_counts():
    (f,) = evaluate([_nvml(48)], catalog=CAT, now=NOW, gpus=GPUS)
    assert (f.code, f.component, f.evidence["sources"]) == ("XID_48", "gpu:3", ["nvml"])


def _nvml_no_bus(code, *, gpu=3, ago_s=60.0):
    """An NVML event from a GPU that answers nothing: its index, no bus (Xid 79)."""
    ev = _nvml(code, ago_s=ago_s)
    return ev.with_(pci_bus_id="", bus_id=None, gpu_index=gpu)


def test_nvml_event_without_a_bus_is_the_kernel_event_on_its_gpu():
    """Issue #26: Xid 79 gave a second finding on an empty `pci:` and attribution named it."""
    (f,) = evaluate([xid(79, ago_s=60), _nvml_no_bus(79, ago_s=58)], catalog=CAT, now=NOW,
                    gpus=GPUS)  # fmt: skip
    assert (f.code, f.component) == ("XID_79", "gpu:3")
    assert f.evidence["count"] == 1 and f.evidence["sources"] == ["kmsg", "nvml"]


def test_an_event_that_names_no_gpu_is_never_on_an_empty_pci():
    lost = _nvml_no_bus(79, gpu=5)  # a GPU the map does not hold: still the one NVML named
    nameless = lost.with_(gpu_index=None)
    assert [f.component for f in evaluate([lost], catalog=CAT, now=NOW, gpus=GPUS)] == ["gpu:5"]
    assert [f.component for f in evaluate([nameless], catalog=CAT, now=NOW, gpus=GPUS)] == ["node"]


def test_nvml_far_from_the_kernel_event_is_another_event():
    (f,) = evaluate([xid(79, ago_s=600), _nvml(79, ago_s=60)], catalog=CAT, now=NOW, gpus=GPUS)
    assert f.evidence["count"] == 2


def test_two_nvml_events_match_two_kernel_events():
    evs = [xid(13, ago_s=61), xid(13, ago_s=60, text="y"), _nvml(13, ago_s=60), _nvml(13, ago_s=59)]
    assert len(reconcile(evs)) == 2


def test_same_line_from_two_sources_counts_once():
    a = xid(48, source="kmsg")
    b = a.with_(source="journal", time=a.time + timedelta(milliseconds=300))
    c = a.with_()  # the same record read again
    (f,) = evaluate([a, b, c], catalog=CAT, now=NOW, gpus=GPUS)
    assert f.evidence["count"] == 1 and f.evidence["sources"] == ["journal", "kmsg"]


def test_boot_noise_is_ignored_only_right_after_driver_load():
    cat = load_catalog(
        CatalogOverrides.model_validate({"families": {"hopper": {"boot_noise": [43]}}})
    )
    loaded = NOW - timedelta(seconds=300)
    early = xid(43, ago_s=250)  # 50 s after the driver loaded
    late = xid(43, ago_s=10)  # 290 s after: still within 600 s
    assert evaluate([early, late], catalog=cat, now=NOW, gpus=GPUS, driver_loaded_at=loaded) == []
    cat2 = load_catalog(
        CatalogOverrides.model_validate(
            {"families": {"hopper": {"boot_noise": [43]}}, "boot_noise_window_s": 100}
        )
    )
    (f,) = evaluate([early, late], catalog=cat2, now=NOW, gpus=GPUS, driver_loaded_at=loaded)
    assert f.evidence["count"] == 1
    # a GPU of another family is not covered
    other = gpu_map([GpuRef(index=3, bus_id="0000:3b:00.0", family="ampere")])
    assert len(evaluate([early], catalog=cat, now=NOW, gpus=other, driver_loaded_at=loaded)) == 1


def test_family_changes_the_verdict():
    volta = gpu_map([GpuRef(index=3, bus_id="0000:3b:00.0", family="volta")])
    (f,) = evaluate([xid(64)], catalog=CAT, now=NOW, gpus=volta)
    assert f.evidence["mnemonic"] == "ECC_PAGE_RETIREMENT_FAILURE"


def test_evaluate_log_uses_the_reading():
    log = KernelLog(events=(xid(48, ago_s=600),), boot_id="b1", driver_loaded_at=NOW)
    assert evaluate_log(log, catalog=CAT, now=NOW, gpus=GPUS) == []
    log2 = KernelLog(events=(xid(79, boot="b0"),), boot_id="b1")
    assert evaluate_log(log2, catalog=CAT, now=NOW, gpus=GPUS) == []


def test_events_without_time_never_expire_or_clear_by_reset():
    ev = parse_line("Nov 30 07:31:02 h kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, m")
    (f,) = evaluate(
        [ev],
        catalog=CAT,
        now=NOW + timedelta(days=9),
        gpus=GPUS,
        driver_loaded_at=NOW + timedelta(days=8),
    )
    assert f.code == "XID_13" and f.observed_at == NOW + timedelta(days=9)


# --- property: any mix of events gives one finding per (code, component), never raises ---


_events = st.builds(
    lambda code, gpu, ago, boot, src, text, timeless: xid(
        code, gpu=gpu, ago_s=ago, boot=boot, source=src, text=text
    ).with_(time=None if timeless else NOW - timedelta(seconds=ago)),
    code=st.sampled_from([13, 31, 43, 45, 48, 63, 64, 68, 79, 92, 94, 95, 109, 144, 154, 999]),
    gpu=st.sampled_from([0, 3, 7, 5]),
    ago=st.floats(min_value=0, max_value=3e5, allow_nan=False),
    boot=st.sampled_from(["b0", "b1", None]),
    src=st.sampled_from(["kmsg", "dmesg", "journal", "nvml"]),
    text=st.sampled_from(["x", "Nonfatal", "to 0x1 (GPU Reset Required)", ""]),
    timeless=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_events, max_size=25), st.sampled_from(["b0", "b1", None]))
def test_rules_never_raise_and_group(events, boot):
    got = evaluate(
        events,
        catalog=CAT,
        now=NOW,
        gpus=GPUS,
        boot_id=boot,
        driver_loaded_at=NOW - timedelta(hours=1),
    )
    keys = [(f.code, f.component) for f in got]
    assert len(keys) == len(set(keys))
    for f in got:
        assert 1 <= f.evidence["count"] <= len(events)
        assert f.code.startswith("XID_")
