"""GPU rules, table-driven: one reading in, the exact findings out. Pure: no fakes, no I/O."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpuvigil.node.catalog import gpus as catalog
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuReading, NvLinkReading, ReadError
from gpuvigil.node.checks.gpu.rules import gpu as rules
from gpuvigil.node.config import GpuConfig

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
H100 = GpuReading(
    index=0,
    name="NVIDIA H100 80GB HBM3",
    uuid="GPU-0",
    pci_bus_id="00000000:18:00.0",
    ecc_enabled=True,
    ecc_volatile_uncorrected=0,
    ecc_aggregate_uncorrected=0,
    remap_pending=False,
    remap_failure=False,
    temperature_gpu_c=40,
    temperature_memory_c=45,
    clock_event_reasons=0x1,
    pcie_gen=5,
    pcie_gen_max=5,
    pcie_width=16,
    pcie_width_max=16,
    nvlinks=tuple(NvLinkReading(i, True, 0, 0, 0, 0) for i in range(18)),
)
RTX = replace(H100, name="NVIDIA GeForce RTX 4090", nvlinks=(), ecc_enabled=None)


def judge(*gpus: GpuReading, cfg: GpuConfig | None = None, **kw):
    inv = GpuInventory(source="nvml", observed_at=NOW, gpus=gpus, count=len(gpus))
    cfg = cfg or GpuConfig()
    return sorted(
        (f.code, f.status.value, f.action.value)
        for f in rules.judge_inventory(inv, cfg=cfg, catalog=catalog.load(), now=NOW, **kw)
    )


CASES = [
    ("healthy", H100, []),
    (
        "ecc volatile",
        replace(H100, ecc_volatile_uncorrected=2),
        [("ECC_UNCORRECTED_VOLATILE", "FAILED", "RESET_GPU")],
    ),
    (
        "ecc aggregate only",
        replace(H100, ecc_aggregate_uncorrected=3),
        [("ECC_UNCORRECTED_AGGREGATE", "WARNING", "NONE")],
    ),
    (
        "ecc disabled on datacenter GPU",
        replace(H100, ecc_enabled=False),
        [("ECC_DISABLED", "WARNING", "NONE")],
    ),
    ("ecc disabled on consumer GPU", replace(RTX, ecc_enabled=False), []),
    (
        "remap pending",
        replace(H100, remap_pending=True),
        [("ROW_REMAP_PENDING", "FAILED", "RESET_GPU")],
    ),
    (
        "remap failure wins over pending",
        replace(H100, remap_pending=True, remap_failure=True),
        [("ROW_REMAP_FAILURE", "FAILED", "REPLACE")],
    ),
    (
        "pages pending",
        replace(H100, retired_pending=True),
        [("RETIRED_PAGES_PENDING", "FAILED", "RESET_GPU")],
    ),
    (
        "pages limit",
        replace(H100, retired_sbe=40, retired_dbe=24),
        [("RETIRED_PAGES_LIMIT", "FAILED", "REPLACE")],
    ),
    ("pages below limit", replace(H100, retired_sbe=40, retired_dbe=23), []),
    (
        "hw slowdown alone",
        replace(H100, clock_event_reasons=0x8),
        [("HW_SLOWDOWN", "FAILED", "INVESTIGATE")],
    ),
    (
        "power brake (with its parent bit)",
        replace(H100, clock_event_reasons=0x88),
        [("POWER_BRAKE", "FAILED", "INVESTIGATE")],
    ),
    (
        "hw thermal",
        replace(H100, clock_event_reasons=0x48),
        [("THERMAL_SLOWDOWN", "FAILED", "INVESTIGATE")],
    ),
    (
        "sw thermal",
        replace(H100, clock_event_reasons=0x20),
        [("THERMAL_SLOWDOWN", "WARNING", "NONE")],
    ),
    ("sw power cap is normal", replace(H100, clock_event_reasons=0x4), []),
    (
        "hot gpu vs catalog",
        replace(H100, temperature_gpu_c=88),
        [("TEMPERATURE_HIGH", "WARNING", "NONE")],
    ),
    (
        "hot gpu vs its own threshold",
        replace(H100, temperature_gpu_c=80, slowdown_temp_c=84),
        [("TEMPERATURE_HIGH", "WARNING", "NONE")],
    ),
    (
        "relative tlimit threshold ignored",
        replace(H100, temperature_gpu_c=80, slowdown_temp_c=-2),
        [],
    ),
    (
        "hot memory",
        replace(H100, temperature_memory_c=97),
        [("TEMPERATURE_HIGH", "WARNING", "NONE")],
    ),
    (
        "pcie narrow on SXM board",
        replace(H100, pcie_width=8),
        [("PCIE_DEGRADED", "FAILED", "REBOOT")],
    ),
    ("pcie narrow PCIe card", replace(RTX, pcie_width=8), [("PCIE_DEGRADED", "WARNING", "NONE")]),
    ("pcie gen low at idle", replace(H100, pcie_gen=1), []),
    (
        "nvlink down",
        replace(H100, nvlinks=(NvLinkReading(0, False), *H100.nvlinks[1:])),
        [("NVLINK_DOWN", "FAILED", "RESET_GPU")],
    ),
    (
        "nvlink links missing",
        replace(H100, nvlinks=H100.nvlinks[:12]),
        [("NVLINK_DOWN", "FAILED", "RESET_GPU")],
    ),
    ("no nvlink info", replace(H100, nvlinks=()), []),
    (
        "lost",
        replace(H100, lost=True, errors=(ReadError("name", "GpuIsLost"),)),
        [("GPU_LOST", "FAILED", "REBOOT")],
    ),
    (
        "reset required",
        replace(H100, lost=True, errors=(ReadError("name", "ResetRequired"),)),
        [("GPU_LOST", "FAILED", "RESET_GPU")],
    ),
    (
        "read error",
        replace(H100, errors=(ReadError("ecc", "NoPermission"),)),
        [("CHECK_ERROR", "FAILED", "NONE")],
    ),
    (
        "read timeout",
        replace(H100, errors=(ReadError("ecc", "Timeout"),)),
        [("CHECK_TIMEOUT", "FAILED", "NONE")],
    ),
    ("all unknown", GpuReading(index=0), []),
    ("recovery none", replace(H100, recovery_action="NONE"), []),
    (
        "recovery reset",
        replace(H100, recovery_action="GPU_RESET"),
        [("GPU_RECOVERY_REQUIRED", "FAILED", "RESET_GPU")],
    ),
    (
        "recovery drain and reset",
        replace(H100, recovery_action="DRAIN_AND_RESET"),
        [("GPU_RECOVERY_REQUIRED", "FAILED", "RESET_GPU")],
    ),
    (
        "recovery reboot",
        replace(H100, recovery_action="NODE_REBOOT"),
        [("GPU_RECOVERY_REQUIRED", "FAILED", "REBOOT")],
    ),
    (
        "recovery unknown to us",
        replace(H100, recovery_action="UNKNOWN_9"),
        [("GPU_RECOVERY_REQUIRED", "FAILED", "INVESTIGATE")],
    ),
]


@pytest.mark.parametrize(("reading", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_table(reading: GpuReading, expected) -> None:
    assert judge(reading) == expected


def test_count() -> None:
    assert judge(H100, expect=2) == [("GPU_COUNT_LOW", "FAILED", "REBOOT")]
    assert judge(H100, expect=1) == []
    assert judge(H100) == []


def test_config_overrides() -> None:
    cfg = GpuConfig(gpu_temperature_max_c=30, ecc_required=False, pcie_expected_width=32)
    got = judge(replace(H100, ecc_enabled=False), cfg=cfg)
    assert got == [("PCIE_DEGRADED", "FAILED", "REBOOT"), ("TEMPERATURE_HIGH", "WARNING", "NONE")]


def inv(links, at):
    g = replace(H100, nvlinks=tuple(NvLinkReading(i, True, *c) for i, c in enumerate(links)))
    return GpuInventory(source="nvml", observed_at=at, gpus=(g,), count=1)


@pytest.mark.parametrize(
    ("before", "after", "seconds", "expected"),
    [
        ((0, 0, 0, 0), (0, 0, 0, 0), 60, False),
        ((0, 0, 0, 0), (0, 0, 50, 0), 60, False),  # 50 CRC/min: under 100
        ((0, 0, 0, 0), (0, 0, 500, 0), 60, True),
        ((0, 0, 10**6, 0), (0, 0, 10**6 + 50, 0), 60, False),  # a huge total is not a rate
        ((0, 0, 0, 0), (0, 1, 0, 0), 600, True),  # any recovery
        ((0, 0, 0, 0), (20, 0, 0, 0), 60, True),  # replay 20/min
        ((0, 0, 900, 0), (0, 0, 3, 0), 60, False),  # counters reset: driver reload
    ],
)
def test_nvlink_rates(before, after, seconds, expected) -> None:
    # NvLinkReading fields: replay, recovery, crc_flit, crc_data
    prev = inv([before], NOW)
    cur = inv([after], NOW + timedelta(seconds=seconds))
    found = rules.judge_inventory(
        cur, cfg=GpuConfig(), catalog=catalog.load(), now=cur.observed_at, previous=prev
    )
    assert any(f.code == "NVLINK_ERRORS" for f in found) is expected


def test_driver_unavailable() -> None:
    err = ReadError("init", "DriverNotLoaded", "Driver Not Loaded")
    assert rules.driver_unavailable(err, expect=0, now=NOW, check="gpu") == []
    f = rules.driver_unavailable(err, expect=None, now=NOW, check="gpu")
    assert [x.code for x in f] == ["DRIVER_UNAVAILABLE"] and f[0].could_not_run


def test_catalog_lookup() -> None:
    c = catalog.load()
    assert c.lookup("NVIDIA H100 80GB HBM3").nvlinks == 18
    assert c.lookup("NVIDIA A100-SXM4-80GB").family == "Ampere"
    assert c.lookup("NVIDIA A10G").nvlinks == 0
    assert c.lookup("NVIDIA GeForce RTX 4090") is None
