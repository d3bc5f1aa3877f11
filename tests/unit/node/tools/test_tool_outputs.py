"""`gpuvigil analyze` on the real outputs of the tools operators paste: each file is taken
for its kind and judged as the post shows (the codes its lines support; nothing that
shows a failure reads healthy). Every file under data/ is a verbatim copy or excerpt of a
public output; its source is named beside it below (repository @ path, or the issue).
Files named `*_fixture_*` are another project's test fixtures, cited the same way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tool_data import DATA, FABRIC, REMAPPED_ROWS, corpus_excerpt

from gpuvigil.core.findings import Status
from gpuvigil.node.capture.bundle import Limits
from gpuvigil.node.capture.judge import Expect
from gpuvigil.node.capture.session import Options, analyze
from gpuvigil.node.checks.fabric.rules import FabricExpectation
from gpuvigil.node.config import NodeConfig

OK, WARN, FAIL = Status.OK, Status.WARNING, Status.FAILED

# file -> (kind, worst status, {(code, component)} of the problems, source)
CASES: dict[str, tuple[str, Status, set[tuple[str, str]], str]] = {
    # Fabric Manager: journal (FM 520, r550 start script), log file, systemctl status.
    "fm_journal_real_gpu_operator_610.txt": (
        "fabric-manager",
        FAIL,
        {("FABRIC_MANAGER_FAILED", "fabric_manager"), ("FABRIC_MANAGER_ERROR", "fabric_manager")},
        "https://github.com/NVIDIA/gpu-operator/issues/610 (FM 520.61.05, NV_WARN_NOTHING_TO_DO)",
    ),
    "fm_journal_real_cube_studio_29.txt": (
        "fabric-manager",
        FAIL,
        {("FABRIC_MANAGER_FAILED", "fabric_manager"), ("FABRIC_MANAGER_ERROR", "fabric_manager")},
        "https://github.com/data-infra/cube-studio/issues/29 (nvidia-fabricmanager-start.sh)",
    ),
    "fm_log_real_gpud_testdata.txt": (
        "fabric-manager",
        WARN,
        {("SXID_12028", "nvswitch:00000000:86:00.0")},
        "leptonai/gpud components/accelerator/nvidia/fabric-manager/testdata/fabricmanager.log"
        " @ 15b320f7 (tail excerpt)",
    ),
    "fm_status_real_bottlerocket_142.txt": (
        "fabric-manager",
        OK,
        set(),
        "https://github.com/bottlerocket-os/bottlerocket-kernel-kit/pull/142 (active, running)",
    ),
    # rdma link (iproute2): RoCE, soft-RoCE, InfiniBand down/polling and active.
    "rdma_link_real_3fs_283_roce.txt": (
        "rdma-link",
        OK,
        set(),
        "https://github.com/deepseek-ai/3FS/pull/283",
    ),
    "rdma_link_real_3fs_263_rxe.txt": (
        "rdma-link",
        OK,
        set(),
        "https://github.com/deepseek-ai/3FS/issues/263",
    ),
    "rdma_link_real_rccl_1423_ib_polling.txt": (
        "rdma-link",
        FAIL,
        {("FABRIC_PORT_DOWN", "nic:mlx5_7")},
        "https://github.com/ROCm/rccl/issues/1423 (first of three states)",
    ),
    "rdma_link_real_rccl_1423_ib_active.txt": (
        "rdma-link",
        OK,
        set(),
        "https://github.com/ROCm/rccl/issues/1423 (third state)",
    ),
    # nvidia-smi topo -m: spaces (A100 NV12, H100 NV18), tabs with NICs (r535).
    "topo_m_real_ml_engineering_a100.txt": (
        "nvidia-smi-topo",
        OK,
        set(),
        "stas00/ml-engineering network/README.md @ 744d01e1",
    ),
    "topo_m_real_ml_engineering_h100.txt": (
        "nvidia-smi-topo",
        OK,
        set(),
        "stas00/ml-engineering network/README.md @ 744d01e1",
    ),
    "topo_m_real_sglang_661_a100x2_535.txt": (
        "nvidia-smi-topo",
        OK,
        set(),
        "https://github.com/sgl-project/sglang/pull/661",
    ),
    "topo_m_real_sglang_645_a100x1_535.txt": (
        "nvidia-smi-topo",
        OK,
        set(),
        "https://github.com/sgl-project/sglang/pull/645",
    ),
    # The plain nvidia-smi table: 555 (markdown-indented in the post, dedented here).
    "table_real_hpe_elearning_a100_555.txt": (
        "nvidia-smi-table",
        OK,
        set(),
        "HPE-Japan-Presales/e-learning gpu/a100/mgmt_on_ubuntu22.04.4lts.md @ b3530162",
    ),
    # NVLink counters: nvidia-smi nvlink -e (H100 r535 with [...] elisions, GB300), dcgmi.
    "nvlink_e_real_ml_engineering_h100.txt": (
        "nvlink-counters",
        OK,
        set(),
        "stas00/ml-engineering compute/accelerator/nvidia/debug.md @ 744d01e1",
    ),
    "nvlink_e_real_srt_slurm_307_gb300.txt": (
        "nvlink-counters",
        OK,
        set(),
        "https://github.com/NVIDIA/srt-slurm/pull/307",
    ),
    "dcgmi_nvlink_e_real_gcm_check_dcgmi.txt": (
        "nvlink-counters",
        OK,
        set(),
        "facebookresearch/gcm gcm/health_checks/checks/check_dcgmi.py @ 1b7bde97 (docstring)",
    ),
    "dcgmi_nvlink_s_real_gcm_check_dcgmi.txt": (
        "nvlink-counters",
        OK,
        set(),
        "facebookresearch/gcm gcm/health_checks/checks/check_dcgmi.py @ 1b7bde97 (docstring)",
    ),
    "dcgmi_nvlink_s_real_llm_action_h800.txt": (
        "nvlink-counters",
        OK,
        set(),
        "liguodongiot/llm-action docs/llm-base/dcgmi.md @ 2a7d856c (8x H800, 8 of 18 links)",
    ),
    "dcgmi_nvlink_s_gcm_fixture_links_down.txt": (
        "nvlink-counters",
        FAIL,
        {("NVLINK_DOWN", "gpu:0"), ("NVLINK_DOWN", "gpu:1")},
        "facebookresearch/gcm gcm/tests/health_checks_tests/test_check_dcgmi.py @ 1b7bde97",
    ),
    # perfquery: extended counters of a switch (2 ports), -x on an HCA, PortRcvErrorDetails.
    "perfquery_x_real_infiniband_exporter_switch.txt": (
        "perfquery",
        OK,
        set(),
        "treydock/infiniband_exporter collectors/fixtures/perfquery/0x7cfe9003009ce5b0.out",
    ),
    "perfquery_x_real_infiniband_diags_16.txt": (
        "perfquery",
        OK,
        set(),
        "https://github.com/linux-rdma/infiniband-diags/issues/16",
    ),
    "perfquery_e_real_infiniband_exporter_rcv_error_details.txt": (
        "perfquery",
        OK,
        set(),
        "treydock/infiniband_exporter collectors/fixtures/perfquery-rcv-error/"
        "0x7cfe9003003b4b96-1.out",
    ),
    # ethtool -S: ENA shaped by its allowances, mlx5 (ConnectX-4), be2net with a jabber.
    "ethtool_s_real_sliderule_518_ena.txt": (
        "ethtool-stats",
        WARN,
        {("NIC_ERROR_COUNTS", "nic:ens34")},
        "https://github.com/SlideRuleEarth/sliderule/issues/518",
    ),
    "ethtool_s_real_ethq_8_mlx5.txt": (
        "ethtool-stats",
        OK,
        set(),
        "https://github.com/isc-projects/ethq/issues/8 (head)",
    ),
    "ethtool_s_real_ethq_7_be2net.txt": (
        "ethtool-stats",
        OK,
        set(),
        "https://github.com/isc-projects/ethq/issues/7",
    ),
    "ethtool_s_real_netutils_208_jabber.txt": (
        "ethtool-stats",
        WARN,
        {("NIC_ERROR_COUNTS", "nic:nic0")},
        "https://github.com/strizhechenko/netutils-linux/issues/208 (head)",
    ),
    # Partial -q: -d ECC and -d PERFORMANCE (555, 2x A100 PCIe); one-section excerpts.
    "q_d_ecc_real_hpe_elearning_a100_555.txt": (
        "nvidia-smi-q",
        OK,
        set(),
        "HPE-Japan-Presales/e-learning gpu/a100/mgmt_on_ubuntu22.04.4lts.md @ b3530162",
    ),
    "q_d_performance_real_hpe_elearning_a100_555.txt": (
        "nvidia-smi-q",
        OK,
        set(),
        "HPE-Japan-Presales/e-learning gpu/a100/mgmt_on_ubuntu22.04.4lts.md @ b3530162",
    ),
    # DCGM 3.x diag table fragments without a header, each showing a failed memory test.
    "dcgmi_diag_fragment_real_go_dcgm_52.txt": (
        "dcgmi-diag",
        FAIL,
        {("DCGM_DIAG_FAIL", "gpu:0"), ("CHECK_ERROR", "node")},
        "https://github.com/NVIDIA/go-dcgm/issues/52 (the fragment as posted)",
    ),
    "dcgmi_diag_fragment_real_ml_engineering_r2.txt": (
        "dcgmi-diag",
        FAIL,
        {("DCGM_DIAG_FAIL", "gpu:0")},
        "stas00/ml-engineering compute/accelerator/nvidia/debug.md @ 744d01e1 (-r 2, faulty node)",
    ),
}
OPTS = Options(node=NodeConfig(), expect=Expect(), limits=Limits())


def test_every_data_file_has_a_case() -> None:
    assert sorted(p.name for p in DATA.iterdir()) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_real_output_is_judged_as_it_shows(name: str) -> None:
    kind, worst, problems, _source = CASES[name]
    report, [inp] = analyze([(str(DATA / name), None)], opts=OPTS)
    assert inp.kind == kind, inp.how
    assert {(f.code, f.component) for f in report.problems} == problems
    assert Status.worst(f.status for f in report.findings) == worst
    assert report.exit_code() == {OK: 0, WARN: 0, FAIL: 1}[worst]


def test_topology_against_the_instance_type() -> None:
    # 2 A100 and 5 NICs, judged as a DGX H100 would be (8 GPUs, 8 InfiniBand adapters).
    opts = Options(
        node=NodeConfig(),
        expect=Expect(gpus=8, ib=FabricExpectation(kind="ib", count=8, source="catalog:dgx")),
    )
    report, _ = analyze([(str(DATA / "topo_m_real_sglang_661_a100x2_535.txt"), None)], opts=opts)
    assert {f.code for f in report.problems} == {"GPU_COUNT_LOW", "FABRIC_COUNT_LOW"}
    h100 = DATA / "topo_m_real_ml_engineering_h100.txt"
    report, _ = analyze([(str(h100), None)], opts=Options(node=NodeConfig(), expect=Expect(gpus=8)))
    assert report.exit_code() == 0


@pytest.mark.parametrize(
    ("excerpt", "want"),
    [(REMAPPED_ROWS, {("ROW_REMAP_PENDING", "gpu:?")}), (FABRIC, set())],
    ids=["remapped-rows", "fabric"],
)
def test_a_one_section_excerpt_of_a_real_q(corpus: Path, tmp_path: Path, excerpt, want) -> None:
    # One section of the corpus's real `-q` outputs (leptonai/gpud testdata), as
    # `nvidia-smi -q | grep -A 10 "Remapped Rows"` keeps it: no header, no GPU line.
    path = tmp_path / "excerpt.txt"
    path.write_text(corpus_excerpt(corpus, *excerpt))
    report, [inp] = analyze([(str(path), None)], opts=OPTS)
    assert inp.kind == "nvidia-smi-q"
    assert {(f.code, f.component) for f in report.problems} == want
    assert any(f.code == "PARTIAL_INPUT" for f in report.findings)


def test_a_partial_q_says_which_checks_it_could_not_make() -> None:
    report, _ = analyze([(str(DATA / "q_d_ecc_real_hpe_elearning_a100_555.txt"), None)], opts=OPTS)
    [note] = [f for f in report.findings if f.code == "PARTIAL_INPUT"]
    assert note.status is OK and note.evidence["command"] == "nvidia-smi -q -d ECC"
    assert "ecc errors" in note.evidence["sections"]
    assert {"temperature", "row remapping", "PCIe link"} <= set(note.evidence["not_checked"])
    assert "ECC error counts" not in note.evidence["not_checked"]
