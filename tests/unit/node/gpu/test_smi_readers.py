"""The other GPU outputs people attach: `nvidia-smi --query-gpu` CSV, `nvidia-smi nvlink -s`,
`nvidia-smi -q -d PAGE_RETIREMENT`, `dcgmi discovery -l`, and nvidia-smi's error answers.

Real outputs: the corpus (`../shared/corpus/nvidia_smi`, leptonai/gpud testdata, MANIFEST),
and data/smi/*_real_*: verbatim public outputs, each cited on its test. The other fixtures
under data/smi are ours, each reproducing the structure of a public output cited on its test.
Every reader feeds the same GPU rules (`rules.gpu.judge_inventory`).
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuvigil.core.findings import NodeReport, utcnow
from gpuvigil.node.capture.kinds import detect
from gpuvigil.node.catalog import gpus as catalog
from gpuvigil.node.checks.dcgm.dcgm_discovery import parse_discovery
from gpuvigil.node.checks.gpu import nvidia_smi
from gpuvigil.node.checks.gpu.nvidia_smi_csv import parse_csv
from gpuvigil.node.checks.gpu.rules import gpu as rules
from gpuvigil.node.checks.nvlink.nvidia_smi_nvlink import parse_nvlink_status
from gpuvigil.node.config import GpuConfig

DATA = Path(__file__).parent / "data" / "smi"


def judge(inv, expect=None):
    found = rules.judge_inventory(
        inv, cfg=GpuConfig(), catalog=catalog.load(), now=utcnow(), expect=expect
    )
    return found, sorted((f.code, f.component) for f in found)


def exit_code(found) -> int:
    return NodeReport(node="n", findings=tuple(found)).exit_code()


# --- nvidia-smi --query-gpu --format=csv ----------------------------------------------------
def test_csv_8xh100_healthy() -> None:
    # Columns and values as in microsoft/VirtualClient
    # src/VirtualClient/VirtualClient.Monitors.UnitTests/Examples/nvidia-smi/query-gpu-8xH100.csv
    # @ 342976c52ffae03cc0d791fec163e1048dc1a81b (driver 535.161.07, units in the header).
    inv = parse_csv((DATA / "query_gpu_8xh100.csv").read_text())
    assert len(inv.gpus) == 8 and not inv.errors
    g = inv.gpus[7]
    assert (g.index, g.pci_bus_id, g.memory_total_mib, g.pcie_gen, g.pcie_width) == (
        7,
        "00000000:E9:00.0",
        81559,
        5,
        16,
    )
    assert g.architecture == "Hopper" and g.ecc_volatile_uncorrected == 0
    _, codes = judge(inv, expect=8)
    assert codes == []
    assert judge(inv, expect=9)[1] == [("GPU_COUNT_LOW", "node")]


def test_csv_na_values_are_unknown_not_zero() -> None:
    # The "N/A" and "[N/A]" cells of microsoft/VirtualClient .../query-gpu-1xT4-NA.csv
    # @ 42e8037caf22e2888a31965d42e2c65711ed7854 (Tesla T4, PCI domain 00000001).
    (g,) = parse_csv((DATA / "query_gpu_t4_na.csv").read_text()).gpus
    assert g.temperature_memory_c is None and g.temperature_gpu_c == 26
    assert g.pci_bus_id == "00000001:01:00.0" and g.pcie_gen == 1


def test_csv_laptop_with_units_in_values() -> None:
    # Header and row as in con/duct test/test_report.py ("16384 MiB" with units, no nounits).
    (g,) = parse_csv((DATA / "query_gpu_laptop.csv").read_text()).gpus
    assert g.name == "NVIDIA RTX A5500 Laptop GPU" and g.memory_total_mib == 16384


def test_csv_health_fields_are_judged() -> None:
    inv = parse_csv((DATA / "query_gpu_health_faulty.csv").read_text())
    found, codes = judge(inv, expect=8)
    assert ("GPU_LOST", "gpu:3") in codes  # "[GPU is lost]" cells
    assert {("ECC_UNCORRECTED_VOLATILE", "gpu:5"), ("ROW_REMAP_PENDING", "gpu:5")} <= set(codes)
    assert ("POWER_BRAKE", "gpu:6") in codes
    assert exit_code(found) == 1


def test_csv_without_header_is_could_not_tell() -> None:
    text = "0, NVIDIA H100 80GB HBM3, 00000000:0A:00.0, 535.161.07\n"
    found, codes = judge(parse_csv(text), expect=8)
    assert codes == [("CHECK_ERROR", "node")] and exit_code(found) == 2


# --- nvidia-smi nvlink -s -------------------------------------------------------------------
def test_nvlink_status_corpus_a100(corpus: Path) -> None:
    # leptonai/gpud pkg/nvidia-query/testdata/nvidia-smi.nvlink.status.a100 (MANIFEST).
    path = corpus / "nvidia_smi" / "nvlink-status_a100x8_gpud.txt"
    inv = parse_nvlink_status(path.read_text())
    assert len(inv.gpus) == 8 and all(len(g.nvlinks) == 12 for g in inv.gpus)
    assert all(link.active for g in inv.gpus for link in g.nvlinks)
    assert judge(inv, expect=8)[1] == []


def test_nvlink_status_one_link_down() -> None:
    inv = parse_nvlink_status((DATA / "nvlink_s_a100_gpu6_link4_inactive.txt").read_text())
    found, codes = judge(inv)
    assert codes == [("NVLINK_DOWN", "gpu:6")]
    assert found[0].evidence["links_down"] == [4]


def test_nvlink_status_all_links_inactive_on_an_nvlink_gpu() -> None:
    # The answer quoted in https://github.com/leptonai/gpud/issues/1085 (B200) and
    # https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1150 (driver 590.48.01):
    # "NVML: Unable to retrieve NVLink information as all links are inActive".
    inv = parse_nvlink_status((DATA / "nvlink_s_b200_gpu2_all_inactive.txt").read_text())
    found, codes = judge(inv, expect=8)
    assert codes == [("NVLINK_DOWN", "gpu:2")]
    assert len(found[0].evidence["links_down"]) == 18
    # The same words from a PCIe card (no NVLink in the catalog) are not a problem.
    assert judge(parse_nvlink_status((DATA / "nvlink_s_l40s_pcie.txt").read_text()))[1] == []


def test_nvlink_throughput_counters_are_not_states() -> None:
    # `nvidia-smi nvlink -gt d` looks alike ("Link 0: Data Tx: 1040 KiB"; layout of
    # microsoft/VirtualClient .../nvidia-smi/query-nvlink.txt @ 2c0ad3b1f5...): not judged
    # as "links up", could not tell.
    inv = parse_nvlink_status((DATA / "nvlink_gt_throughput_lookalike.txt").read_text())
    _, codes = judge(inv)
    assert codes == [("CHECK_ERROR", "node")]


# --- nvidia-smi -q -d PAGE_RETIREMENT ----------------------------------------------------------
def page_retirement_of(q_text: str) -> str:
    """What `nvidia-smi -q -d PAGE_RETIREMENT` prints, cut from a full `-q` of the same
    driver: the log header, `Attached GPUs`, and each GPU's `Retired Pages` section."""
    out, keep = [], True
    for line in q_text.splitlines():
        if line.startswith("GPU "):
            out.append(line)
            keep = False
            continue
        if not line.startswith(" "):
            keep = True
        elif line.startswith("    ") and not line.startswith("        "):
            keep = line.strip().startswith("Retired Pages")
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def test_page_retirement_from_three_drivers(corpus: Path) -> None:
    # Sections of the real -q outputs in the corpus: H100 535.161.08, A10 535.129.03,
    # TITAN V 560.35.03 (leptonai/gpud testdata, MANIFEST). Layout as NVIDIA's Dynamic
    # Page Retirement guide shows it (docs.nvidia.com/deploy/dynamic-page-retirement).
    for name, gpus in (
        ("q_h100x8_535.161.08_hw-power-brake_gpud.txt", 8),
        ("q_a10_535.129.03_remap-pending_gpud.txt", 1),
        ("q_titanv_560.35.03_gpud.txt", 1),
    ):
        text = page_retirement_of((corpus / "nvidia_smi" / name).read_text())
        assert "Retired Pages" in text and "Clocks" not in text, name
        inv = nvidia_smi.parse_xml(text)
        assert len(inv.gpus) == gpus and inv.count == gpus, name
        _, codes = judge(inv, expect=gpus)
        assert codes == [], (name, codes)  # nothing pending on these GPUs


def test_page_retirement_pending_is_judged() -> None:
    text = (
        "==============NVSMI LOG==============\n\nTimestamp : Tue Aug 27 01:29:36 2019\n"
        "Driver Version : 410.104\nCUDA Version : 10.0\n\nAttached GPUs : 1\n"
        "GPU 00000000:34:00.0\n    Retired Pages\n        Single Bit ECC : 0\n"
        "        Double Bit ECC : 2\n        Pending : Yes\n"
    )
    _, codes = judge(nvidia_smi.parse_xml(text), expect=1)
    assert codes == [("RETIRED_PAGES_PENDING", "gpu:0")]


# --- dcgmi discovery -l ----------------------------------------------------------------------
def test_discovery_real_null_names_dcgm_3_1_7() -> None:
    # Verbatim (trailing blanks kept) from https://github.com/NVIDIA/DCGM/issues/229, DCGM 3.1.7,
    # four H100 SXM: every name reads "<<<NULL>>>"; bus ids 4C, 5D, CC, DC; no NvSwitches.
    inv = parse_discovery((DATA / "discovery_real_h100x4_null_names_dcgm317.txt").read_text())
    assert inv.count == 4 and not inv.errors and [g.name for g in inv.gpus] == [None] * 4
    assert [g.pci_bus_id for g in inv.gpus] == [
        f"00000000:{b}:00.0" for b in ("4C", "5D", "CC", "DC")
    ]
    assert inv.gpus[3].uuid == "GPU-5ea04b20-4cc3-4d84-0bb2-e4143be8e874"
    assert judge(inv, expect=4)[1] == []
    assert judge(inv, expect=8)[1] == [("GPU_COUNT_LOW", "node")]


def test_discovery_real_h800x8_dcgm_3_1_8() -> None:
    # Verbatim from liguodongiot/llm-action docs/llm-base/dcgmi.md (dcgmi -v: 3.1.8): eight
    # "NVIDIA H800", GPU 7 at 00000000:E2:00.0, "0 NvSwitches found.".
    inv = parse_discovery((DATA / "discovery_real_h800x8_dcgm318.txt").read_text())
    assert inv.count == 8 and not inv.errors
    assert {g.name for g in inv.gpus} == {"NVIDIA H800"}
    assert inv.gpus[7].pci_bus_id == "00000000:E2:00.0" and not any(g.lost for g in inv.gpus)
    assert judge(inv, expect=8)[1] == []


def test_discovery_real_single_t4_with_pci_domain() -> None:
    # Verbatim from microsoft/VirtualClient src/VirtualClient/VirtualClient.Actions.UnitTests/
    # Examples/DCGMI/DCGMIDiscoveryResults.txt: one Tesla T4 in PCI domain 0001 (an Azure VM).
    inv = parse_discovery((DATA / "discovery_real_t4_virtualclient.txt").read_text())
    assert inv.count == 1 and not inv.errors
    (gpu,) = inv.gpus
    assert (gpu.name, gpu.pci_bus_id) == ("Tesla T4", "00000001:00:00.0")
    assert judge(inv, expect=1)[1] == []
    assert judge(inv, expect=2)[1] == [("GPU_COUNT_LOW", "node")]


def test_discovery_real_dcgm4_active_count() -> None:
    # From littlemex/zenn books/eks-distributed-ai/eks-gpu-fault-injection.md (DCGM 4.x in the
    # EKS node monitoring agent's dcgm-server, g5): "1 GPU found (Active).", NVIDIA A10G at
    # 00000000:00:1E.0. The post shows the table trimmed (no UUID row, uneven widths).
    text = (DATA / "discovery_real_a10g_active_dcgm4.txt").read_text()
    inv = parse_discovery(text)
    assert inv.count == 1 and not inv.errors
    assert [(g.name, g.pci_bus_id) for g in inv.gpus] == [("NVIDIA A10G", "00000000:00:1E.0")]
    assert judge(inv, expect=1)[1] == []
    # `analyze` took the "(Active)" count line for no kind at all before.
    assert detect(text.encode()) == "dcgmi-discovery"


def test_discovery_with_nvswitches() -> None:
    # Invented edge case: an NvSwitch table after the GPUs (not GPUs, not counted).
    inv = parse_discovery((DATA / "discovery_a100x8_nvswitch6.txt").read_text())
    assert inv.count == 8 and len(inv.gpus) == 8 and not inv.errors


def test_discovery_all_shows_an_inactive_gpu() -> None:
    # `dcgmi discovery -l -a` (docs.nvidia.com/datacenter/dcgm/latest/reference/
    # command-line-reference/dcgmi/dcgmi-discovery.html): "Status: <state>" and
    # "(last known)" for a GPU that is not OK.
    inv = parse_discovery((DATA / "discovery_all_h100x8_gpu5_inaccessible.txt").read_text())
    assert inv.gpus[5].pci_bus_id == "00000000:AB:00.0" and inv.gpus[5].lost
    found, codes = judge(inv, expect=8)
    assert codes == [("GPU_LOST", "gpu:5")] and exit_code(found) == 1


def test_discovery_without_host_engine_is_could_not_tell() -> None:
    found, codes = judge(parse_discovery((DATA / "discovery_no_hostengine.txt").read_text()), 8)
    assert codes == [("CHECK_ERROR", "node")] and exit_code(found) == 2


# --- nvidia-smi's own error answers ----------------------------------------------------------
LOST = (
    "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the "
    "system to recover this GPU\n"
)


def test_lost_gpu_on_stdout_is_gpu_lost_exit_1() -> None:
    for form in (LOST, LOST.replace("GPU0000", "gpu 0000")):
        found, codes = judge(nvidia_smi.parse_xml(form), expect=8)
        assert ("GPU_LOST", "gpu:0") in codes
        assert not any("nvidia_smi_log" in f.message for f in found)
        assert exit_code(found) == 1


def test_no_driver_is_driver_unavailable() -> None:
    text = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make "
        "sure that the latest NVIDIA driver is installed and running.\n\n"
    )
    for parse in (nvidia_smi.parse_xml, parse_csv, parse_nvlink_status):
        found, codes = judge(parse(text), expect=8)
        assert codes == [("DRIVER_UNAVAILABLE", "node")], parse
        assert found[0].action == "REBOOT"
    assert judge(nvidia_smi.parse_xml(text), expect=0)[1] == []


def test_no_devices_found_is_judged_against_the_expected_count() -> None:
    text = "No devices were found\n"
    for parse in (nvidia_smi.parse_xml, parse_csv, parse_nvlink_status):
        found, codes = judge(parse(text), expect=8)
        assert codes == [("GPU_COUNT_LOW", "node")] and exit_code(found) == 1, parse
        assert judge(parse(text), expect=0)[1] == []
        unknown, codes = judge(parse(text))
        assert codes == [("CHECK_ERROR", "node")] and exit_code(unknown) == 2
        assert re.search(r"--expect-gpus", unknown[0].message)


def test_health_says_healthy_while_the_driver_asks_for_a_reset() -> None:
    # https://github.com/NVIDIA/DCGM/issues/263: `dcgmi health -c -j` answers Healthy (with
    # its "Health monitor systems set successfully." preamble) while
    # `nvidia-smi --query-gpu=index,gpu_recovery_action` says GPU 1 needs a Reset.
    from gpuvigil.node.checks.dcgm import rules as dcgm_rules
    from gpuvigil.node.checks.dcgm.dcgm_health_parse import parse_health

    health = parse_health(
        (DATA.parent / "dcgm" / "health_real_dcgm263_healthy_preamble.json").read_text()
    )
    assert health.complete and health.overall == "Pass"
    assert dcgm_rules.health(health, now=utcnow()) == []
    inv = parse_csv((DATA / "query_gpu_recovery_action.csv").read_text())
    assert judge(inv, expect=8)[1] == [("GPU_RECOVERY_REQUIRED", "gpu:1")]
