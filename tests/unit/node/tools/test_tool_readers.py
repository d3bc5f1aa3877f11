"""The pasted-tool readers are written for the tool, not the samples: changed real outputs
(a failure planted, a column added, a GPU named by `-i`) read as the change says, and
garbage never raises and never reads healthy. Every variant below starts from a real
output in data/ (cited in test_tool_outputs.py); what was changed is said beside it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tool_data import FABRIC, REMAPPED_ROWS, corpus_excerpt, real

from gpuvigil.node.capture.bundle import Limits
from gpuvigil.node.capture.judge import Expect
from gpuvigil.node.capture.kinds import detect
from gpuvigil.node.capture.session import Options, analyze
from gpuvigil.node.checks.counters import nic_counters, nvlink_counters
from gpuvigil.node.checks.fabric import rdma_link
from gpuvigil.node.checks.fabric_manager import fabric_manager_log
from gpuvigil.node.checks.gpu import nvidia_smi_partial, nvidia_smi_table
from gpuvigil.node.checks.topology import topology
from gpuvigil.node.config import NodeConfig

OPTS = Options(node=NodeConfig(), expect=Expect(), limits=Limits())


def judged(tmp_path: Path, text: str, kind: str | None = None):
    path = tmp_path / "input.txt"
    path.write_text(text)
    report, [inp] = analyze([(str(path), kind)], opts=OPTS)
    return report, inp


def problems(report) -> set[tuple[str, str]]:
    return {(f.code, f.component) for f in report.problems}


def test_fabric_manager_fatal_sxid_and_a_restart(tmp_path: Path) -> None:
    # The fatal-SXid line leptonai/gpud's log_matcher.go quotes from a real fabricmanager.log,
    # appended to the real log tail: FAILED and a reboot, on the switch it names.
    fatal = (
        "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 "
        "on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 33\n"
    )
    report, inp = judged(tmp_path, real("fm_log_real_gpud_testdata.txt") + fatal)
    assert inp.kind == "fabric-manager" and report.exit_code() == 1
    [sxid] = [f for f in report.findings if f.code == "SXID_20034"]
    assert sxid.component == "nvswitch:00000000:86:00.0" and sxid.fatal
    # The real failed start, then systemd's own "Started" line (invented order): the service
    # runs again, so it is not FAILED; its error lines still say WARNING.
    restarted = real("fm_journal_real_gpu_operator_610.txt") + (
        "11月 15 14:16:47 leon-NF5468M6 systemd[1]: Started NVIDIA fabric manager service.\n"
    )
    report, _ = judged(tmp_path, restarted)
    assert {c for c, _ in problems(report)} == {"FABRIC_MANAGER_ERROR"}
    stopped = restarted + (
        "11月 15 15:00:00 leon-NF5468M6 systemd[1]: Stopped NVIDIA fabric manager service.\n"
    )
    report, _ = judged(tmp_path, stopped)
    assert "FABRIC_MANAGER_STOPPED" in {c for c, _ in problems(report)}


def test_a_kernel_log_with_fabric_manager_lines_stays_a_kernel_log() -> None:
    text = (
        "Feb 27 15:10:02 host kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off\n"
        + real("fm_journal_real_cube_studio_29.txt")
    )
    assert detect(text.encode()) == "kernel-log"


def test_a_whole_q_pasted_with_the_table_stays_a_q() -> None:
    # A support bundle's one file: the real `-q -d ECC` then the real table (both real).
    text = real("q_d_ecc_real_hpe_elearning_a100_555.txt") + real(
        "table_real_hpe_elearning_a100_555.txt"
    )
    assert detect(text.encode()) == "nvidia-smi-q"


def test_topology_nvlink_missing_and_extra_columns(tmp_path: Path) -> None:
    # The real H100 matrix with GPU3's links replaced by SYS (as when its NVLinks are down),
    # and an extra column: GPU3 is named, no other GPU.
    lines = real("topo_m_real_ml_engineering_h100.txt").splitlines()
    broken = [lines[0].replace("CPU Affinity", "NIC0  CPU Affinity")]
    for ln in lines[1:]:
        cells = ln.split()  # GPUn, 8 link cells, CPU affinity, NUMA affinity
        if cells[0] == "GPU3":
            cells = [cells[0]] + [c if c == "X" else "SYS" for c in cells[1:9]] + cells[9:]
        else:
            cells[4] = "SYS"  # the column of GPU3
        broken.append("  ".join([*cells[:9], "PIX", *cells[9:]]))
    report, inp = judged(tmp_path, "\n".join(broken) + "\n")
    assert inp.kind == "nvidia-smi-topo"
    assert problems(report) == {("TOPOLOGY_NVLINK_MISSING", "gpu:3")}
    parsed = topology.parse("\n".join(broken))
    assert parsed.nics == ("NIC0",) and len(parsed.gpus) == 8


def test_the_plain_table_ecc_and_a_lost_gpu(tmp_path: Path) -> None:
    text = real("table_real_hpe_elearning_a100_555.txt")
    # GPU 1's Volatile Uncorr. ECC cell set to 2 (the real one says 0).
    ecc = text.replace(
        "00000000:8A:00.0 Off |                    0 |",
        "00000000:8A:00.0 Off |                    2 |",
    )
    report, _ = judged(tmp_path, ecc)
    assert problems(report) == {("ECC_UNCORRECTED_VOLATILE", "gpu:1")}
    # nvidia-smi's line for a GPU it cannot reach, printed before the table.
    lost = "Unable to determine the device handle for GPU0000:8A:00.0: Unknown Error\n" + text
    report, _ = judged(tmp_path, lost)
    assert ("GPU_LOST", "gpu:1") in problems(report)
    inv = nvidia_smi_table.parse(text)
    assert [g.pci_bus_id for g in inv.gpus] == ["00000000:12:00.0", "00000000:8A:00.0"]
    assert inv.driver_version == "555.42.02" and inv.gpus[0].temperature_gpu_c == 38.0


def test_the_corpus_table_with_err_is_never_healthy(corpus: Path) -> None:
    # The 525 table whose Fan cell reads ERR! (leptonai/gpud testdata, via the corpus).
    text = (corpus / "nvidia_smi" / "table_525.125.06_gpud.txt").read_text()
    inv = nvidia_smi_table.parse(text)
    assert [e.field for e in inv.gpus[0].errors] == ["fan/temperature/performance/power"]


def test_a_q_for_one_gpu_is_pinned_to_the_gpu_it_names(tmp_path: Path) -> None:
    # The real `-q -d ECC` cut to its second GPU block, as `-i 1` prints it, with its volatile
    # DRAM Uncorrectable set to 3. Before: "8 attached, 1 described" and gpu:0.
    text = real("q_d_ecc_real_hpe_elearning_a100_555.txt")
    head, first, second = (
        text.partition("GPU 00000000:12:00.0")[0],
        *text.split("GPU 00000000:8A:00.0"),
    )
    one = (
        head.replace("-d ECC", "-d ECC -i 1")
        + "GPU 00000000:8A:00.0"
        + second.replace(
            "DRAM Uncorrectable            : 0", "DRAM Uncorrectable            : 3", 1
        )
    )
    report, _ = judged(tmp_path, one)
    assert problems(report) == {("ECC_UNCORRECTED_VOLATILE", "gpu:1")}
    # Without -i the block cannot be placed: it is named by its bus id, never gpu:0.
    report, _ = judged(tmp_path, one.replace(" -i 1", ""))
    assert problems(report) == {("ECC_UNCORRECTED_VOLATILE", "gpu:00000000:8A:00.0")}
    assert first  # the real output had both blocks


def test_fabric_state_in_progress(corpus: Path, tmp_path: Path) -> None:
    # The corpus's real H100 Fabric section with the state siderolabs/extensions#717
    # describes for a GPU whose fabric manager is not running ("In Progress").
    text = corpus_excerpt(corpus, *FABRIC).replace("Completed", "In Progress")
    report, _ = judged(tmp_path, text)
    assert problems(report) == {("GPU_FABRIC_NOT_REGISTERED", "gpu:?")}


def test_counters_over_their_thresholds(tmp_path: Path) -> None:
    # dcgmi -e: CRC Data Error 12 on link 0, as facebookresearch/gcm's own failing fixture.
    dcgmi = real("dcgmi_nvlink_e_real_gcm_check_dcgmi.txt").replace(
        "| -> CRC Data Error           | 0 ", "| -> CRC Data Error           | 12"
    )
    report, _ = judged(tmp_path, dcgmi)
    assert problems(report) == {("NVLINK_ERROR_COUNTS", "gpu:0")}
    # nvidia-smi -e: a recovery on GB300 link 0.
    smi = real("nvlink_e_real_srt_slurm_307_gb300.txt").replace(
        "Recovery Errors: 0", "Recovery Errors: 2"
    )
    report, _ = judged(tmp_path, smi)
    assert problems(report) == {("NVLINK_ERROR_COUNTS", "gpu:0")}
    # perfquery: symbol errors and a link-down on the switch's port 1.
    pq = real("perfquery_x_real_infiniband_exporter_switch.txt").replace(
        "SymbolErrorCounter:..............0", "SymbolErrorCounter:..............1542", 1
    )
    report, _ = judged(tmp_path, pq)
    assert problems(report) == {("NIC_ERROR_COUNTS", "nic:lid 1719 port 1")}


def test_rdma_link_reads_fields_by_name() -> None:
    # A newer iproute2 adds fields; order changes: read alike.
    line = "link mlx5_3/1 netdev ib3 state DOWN lid 7 physical_state DISABLED extra 1\n"
    reading = rdma_link.parse(line)
    [port] = reading.adapters[0].ports
    assert (port.state, port.phys_state, port.link_layer) == ("DOWN", "Disabled", "InfiniBand")


def test_every_new_kind_forced_on_garbage_is_never_healthy(tmp_path: Path) -> None:
    pasted = ["fabric-manager", "nvidia-smi-table", "nvidia-smi-topo", "nvlink-counters"]
    pasted += ["rdma-link", "perfquery", "ethtool-stats"]
    for kind in [*pasted, "nvidia-smi-q", "dcgmi-diag"]:
        report, _ = judged(tmp_path, "hello\nthis is not a tool output\n", kind=kind)
        assert report.exit_code() == 2, kind


PARSERS = (
    fabric_manager_log.parse,
    nic_counters.parse,
    nvidia_smi_partial.parse,
    nvidia_smi_table.parse,
    nvlink_counters.parse,
    rdma_link.parse,
    topology.parse,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(
            [
                "GPU0",
                "GPU1",
                "X",
                "NV18",
                "|",
                "Link 0:",
                "Replay Errors: 9",
                "gpuId 0:",
                "U D X _",
                "link mlx5_0/1 state",
                "NIC statistics:",
                "# Port counters: Lid 1 port 1",
                "SymbolErrorCounter:....x",
                "[ERROR]",
                "Fabric",
                "State : ",
                "NVIDIA-SMI 1 Driver Version: 2",
                "{",
                "\t",
                "    ",
                "ERR!",
                "00000000:3B:00.0",
            ]
        ),
        max_size=40,
    ),
    st.text(max_size=200),
)
def test_no_reader_raises_on_garbage(tokens: list[str], noise: str) -> None:
    text = " ".join(tokens).replace(" | ", "\n") + noise
    for parse in PARSERS:
        parse(text)
    detect(text.encode("utf-8", "replace"))


@pytest.mark.parametrize(
    "name", ["fm_log_real_gpud_testdata.txt", "perfquery_x_real_infiniband_diags_16.txt"]
)
def test_a_cut_real_output_still_reads(tmp_path: Path, name: str) -> None:
    text = real(name)
    _, inp = judged(tmp_path, text[: len(text) // 2])
    assert inp.kind is not None


def test_rdma_link_json(tmp_path: Path) -> None:
    # `rdma -j link`: the keys iproute2's rdma/link.c prints (invented values; no JSON
    # output has been posted with a port down).
    text = (
        '[{"ifindex":0,"ifname":"mlx5_0","port":1,"state":"ACTIVE","physical_state":"LINK_UP",'
        '"netdev":"ens1f0","netdev_index":4},{"ifindex":1,"ifname":"mlx5_1","port":1,'
        '"state":"DOWN","physical_state":"DISABLED","netdev":"ens1f1","netdev_index":5}]\n'
    )
    report, inp = judged(tmp_path, text)
    assert inp.kind == "rdma-link"
    assert problems(report) == {("FABRIC_PORT_DOWN", "nic:mlx5_1")}


def test_nvlink_e_r570_counter_names(tmp_path: Path) -> None:
    # The r570+ per-link layout (counter names as facebookresearch/gcm's parser test quotes
    # them; values invented): a BER is a rate, not unreadable; post-FEC errors are judged.
    text = (
        "GPU 0: NVIDIA B200 (UUID: GPU-0)\n"
        "\t Link 0: Tx Packets: 10, Rx Errors: 0, Effective Errors: 2, Effective BER: 1.5e-15\n"
        "\t Link 1: Tx Packets: 10, Rx Errors: 0, Effective Errors: 0, Effective BER: 0\n"
    )
    report, inp = judged(tmp_path, text)
    assert inp.kind == "nvlink-counters"
    assert problems(report) == {("NVLINK_ERROR_COUNTS", "gpu:0")}
    [finding] = report.problems
    assert [o["link"] for o in finding.evidence["over"]] == [0]


def test_fabric_manager_log_file_that_could_not_start(tmp_path: Path) -> None:
    # FM's own log when its config is rejected (the line siderolabs/extensions#511 quotes),
    # then a FATAL line (invented): FAILED, from the log file alone.
    text = (
        "[Nov 03 2024 10:00:00] [ERROR] [tid 12] fabric manager config file item: "
        "FABRIC_NODE_CONFIG_FILE has an invalid value\n"
        "[Nov 03 2024 10:00:00] [FATAL] [tid 12] Fabric Manager initialization failed\n"
    )
    report, inp = judged(tmp_path, text)
    assert inp.kind == "fabric-manager"
    assert {c for c, _ in problems(report)} == {"FABRIC_MANAGER_FAILED", "FABRIC_MANAGER_ERROR"}


def test_fabric_managers_line_behind_a_collectors_host_prefix(tmp_path: Path) -> None:
    # siderolabs/extensions#511 as posted: Talos relays FM's message behind `<host>: `, the
    # host redacted; the bare message and a real address read the same.
    line = "fabric manager config file item: FABRIC_NODE_CONFIG_FILE has an invalid value\n"
    for prefix in ("<node ip>: ", "10.0.7.139: ", ""):
        report, inp = judged(tmp_path, prefix + line)
        assert inp.kind == "fabric-manager", prefix
        assert {c for c, _ in problems(report)} == {"FABRIC_MANAGER_ERROR"}, prefix
    # A host-prefixed line that is not FM's stays unread.
    assert detect(b"10.0.7.139: kubelet started\n") != "fabric-manager"


def test_a_journal_with_nvswitch_sxid_kernel_lines_is_a_kernel_log() -> None:
    # The real FM journal lines with an NVSwitch driver line (the corpus's SXid form).
    sxid = "Jul 23 07:53:55 host kernel: nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal\n"
    assert detect((real("fm_journal_real_cube_studio_29.txt") + sxid).encode()) == "kernel-log"


def test_dcgmi_nvlink_s_switch_rows_are_read_not_judged(tmp_path: Path) -> None:
    # The real H800 listing with an NvSwitches section as DCGM's dcgmi/Nvlink.cpp prints it
    # (`physicalId N:` then its row; invented states): unused switch ports print D.
    text = real("dcgmi_nvlink_s_real_llm_action_h800.txt").replace(
        "    No NvSwitches found.\n", "    physicalId 8:\n        U U U U D D D D _ _\n"
    )
    report, _ = judged(tmp_path, text)
    assert report.exit_code() == 0
    owners = nvlink_counters.parse(text).owners
    assert owners[-1].component == "nvswitch:8" and len(owners) == 9


def test_grepped_sections_of_several_gpus_are_kept_apart(corpus: Path, tmp_path: Path) -> None:
    # `-q | grep -A 10 "Remapped Rows"` on two GPUs: the corpus's real A10 section (pending)
    # then the same section with its pending flag cleared, grep's `--` between. The healthy
    # second must not overwrite the first: each section is a GPU of its own.
    pending = corpus_excerpt(corpus, *REMAPPED_ROWS)
    clean = pending.replace(
        "Pending                           : Yes", "Pending                           : No"
    )
    report, _ = judged(tmp_path, pending + "--\n" + clean)
    assert problems(report) == {("ROW_REMAP_PENDING", "gpu:?1")}
    report, _ = judged(tmp_path, clean + "--\n" + pending)
    assert problems(report) == {("ROW_REMAP_PENDING", "gpu:?2")}
