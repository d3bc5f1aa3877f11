"""`node.capture`: every real output and fixture is taken for what it is; bundles, archives
and the caps on them; hostile inputs get a clear verdict (no silent healthy, no raise).

Real outputs come from ../shared/corpus (provenance in its MANIFEST files); the fixtures
under tests/unit/node/*/data cite the public outputs they follow in their own tests.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from gpuvigil.core.findings import Status
from gpuvigil.node.capture.bundle import Limits, expand
from gpuvigil.node.capture.inputs import open_input
from gpuvigil.node.capture.judge import Expect
from gpuvigil.node.capture.kinds import detect
from gpuvigil.node.capture.session import Options, analyze
from gpuvigil.node.checks.fabric.rules import FabricExpectation
from gpuvigil.node.config import NodeConfig

UNIT = Path(__file__).resolve().parents[1]
GPU, DCGM, FAB = (
    UNIT / "gpu" / "data" / "smi",
    UNIT / "gpu" / "data" / "dcgm",
    UNIT / "fabric" / "data",
)

FIXTURES = {
    **{p.name: "dcgmi-diag" for p in DCGM.glob("diag_*")},
    **{p.name: "dcgmi-health" for p in DCGM.glob("health_*")},
    **{p.name: "nvidia-smi-csv" for p in GPU.glob("query_gpu_*")},
    **{p.name: "nvidia-smi-nvlink" for p in GPU.glob("nvlink_*")},
    **{p.name: "dcgmi-discovery" for p in GPU.glob("discovery_*")},
    **{
        p.name: p.name.split("_")[0] + ("_devinfo" if "ibv" in p.name else "")
        for p in FAB.glob("ib*")
    },
    **{p.name: "fi_info" for p in FAB.glob("fi_info_*")},
}
FIXTURES |= {"ibv_devinfo_roce9_mlx5_5_down.txt": "ibv_devinfo"}
FIXTURES |= {k: "ibv_devinfo" for k in FIXTURES if k.startswith("ibv_devinfo")}
FIXTURES["discovery_no_hostengine.txt"] = None  # dcgmi's own error: no command named in it
FIXTURES["diag_v4_runtime_error.json"] = "dcgmi-diag"


def files() -> dict[Path, str | None]:
    found = {}
    for d in (GPU, DCGM, FAB):
        for p in sorted(d.iterdir()):
            found[p] = FIXTURES.get(p.name, "?")
    return found


@pytest.mark.parametrize("path", list(files()), ids=lambda p: p.name)
def test_every_fixture_is_taken_for_its_kind(path: Path) -> None:
    want = files()[path]
    assert want != "?", f"add {path.name} to FIXTURES"
    assert detect(path.read_bytes()[:65536]) == want


def test_ibdev2netdev_with_only_padded_states_is_recognised() -> None:
    # The VF lines of the real `ibdev2netdev -v` (k8snetworkplumbingwg/ib-sriov-cni README),
    # "port 1 (DOWN  ) ==> ib2 (Down)", without the ACTIVE lines that would carry the file.
    lines = (FAB / "ibdev2netdev_v_real_ib_sriov_cni.txt").read_text().splitlines()
    padded = "\n".join(ln for ln in lines if "(DOWN  )" in ln) + "\n"
    assert padded.count("\n") == 4 and detect(padded.encode()) == "ibdev2netdev"


def test_every_corpus_output_is_taken_for_its_kind(corpus: Path) -> None:
    expected = {"kernel_logs": "kernel-log", "network": None, "nvidia_smi": None}
    seen = 0
    for folder, kind in expected.items():
        for p in sorted((corpus / folder).iterdir()):
            if p.is_dir() or p.suffix == ".tsv" or p.name.endswith(".md"):
                continue
            name = p.name
            want = kind or (
                "ibstat"
                if name.startswith("ibstat_")
                else "ibstatus"
                if name.startswith("ibstatus")
                else "nvidia-smi-xml"
                if name.startswith("x_")
                else "nvidia-smi-q"
                if name.startswith("q_")
                else "nvidia-smi-nvlink"
                if name.startswith("nvlink")
                else "nvidia-smi-table"
                if name.startswith("table_")
                else None
            )
            assert detect(p.read_bytes()[:65536]) == want, name
            seen += 1
    assert seen >= 25


def opts(**kw) -> Options:
    return Options(node=NodeConfig(), expect=Expect(**kw), limits=Limits())


def codes(report) -> set[tuple[str, str]]:
    return {(f.code, f.component) for f in report.findings}


def test_a_bundle_of_real_outputs(corpus: Path) -> None:
    # A node's outputs, as a ticket would carry them: nvidia-smi -q (H100, HW power brake),
    # its kernel log, ibstat with three Ethernet ports down and a fixture's dcgmi diag.
    paths = [
        corpus / "nvidia_smi" / "q_h100x8_535.161.08_hw-power-brake_gpud.txt",
        corpus / "network" / "ibstat_12ca_ib8-eth4_3down_gpud.txt",
        DCGM / "diag_v335_r3_pcie_fail.txt",
        corpus / "kernel_logs" / "xid48_63_94_dmesg-iso_gpud-testdata.log",
    ]
    report, inputs = analyze(
        [(str(p), None) for p in paths],
        opts=opts(gpus=8, ib=FabricExpectation(kind="ib", count=8)),
    )
    assert [i.kind for i in inputs] == ["nvidia-smi-q", "ibstat", "dcgmi-diag", "kernel-log"]
    found = codes(report)
    assert ("DCGM_DIAG_FAIL", "gpu:3") in found
    assert {c for c, _ in found} >= {"POWER_BRAKE", "XID_48"}
    assert not any(c.startswith("FABRIC") for c, _ in found)  # the IB compute ports are up
    assert report.exit_code() == 1
    assert all("input" in f.evidence or "inputs" in f.evidence for f in report.findings)


def test_an_unrecognised_file_is_named_and_never_judged(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("rebooted the node twice, then it was fine\n")
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    report, inputs = analyze([(str(notes), None), (str(empty), None)], opts=opts())
    assert [(i.kind, i.how) for i in inputs] == [(None, "not recognised"), (None, "empty")]
    assert [f.code for f in report.findings] == ["CHECK_ERROR", "CHECK_ERROR"]
    assert str(notes) in report.findings[0].message
    assert report.exit_code() == 2


def make_tar(path: Path, members: dict[str, bytes], *, mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_tar_bundle_with_a_nested_sysfs_archive(tmp_path: Path) -> None:
    inner = tmp_path / "inner.tar"
    make_tar(
        inner,
        {
            "sys/class/infiniband/mlx5_0/ports/1/state": b"1: DOWN\n",
            "sys/class/infiniband/mlx5_0/ports/1/phys_state": b"3: Disabled\n",
            "sys/class/infiniband/mlx5_0/ports/1/rate": b"400 Gb/sec (4X NDR)\n",
        },
        mode="w",
    )
    bundle = make_tar(
        tmp_path / "bundle.tar.gz",
        {
            "node7/dmesg.txt": b"[    1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, gone\n",
            "node7/sysfs.tar": inner.read_bytes(),
        },
    )
    report, inputs = analyze([(str(bundle), None)], opts=opts())
    kinds = {i.path.removeprefix(f"{bundle}:"): i.kind for i in inputs}
    assert kinds == {"node7/dmesg.txt": "kernel-log", "node7/sysfs.tar": "sysfs"}
    assert {("XID_79", "pci:0000:3b:00.0"), ("FABRIC_PORT_DOWN", "nic:mlx5_0")} <= codes(report)


def test_a_tar_bomb_stops_at_the_cap(tmp_path: Path) -> None:
    bomb = make_tar(tmp_path / "bomb.tar.gz", {f"f{i}.log": b"\0" * (8 << 20) for i in range(8)})
    assert bomb.stat().st_size < 1 << 20  # 64 MiB of zeros compress to almost nothing
    work = tmp_path / "work"
    entries = expand([str(bomb)], workdir=work, limits=Limits(max_extract_bytes=20 << 20))
    problems = [e.problem for e in entries if e.problem]
    assert problems and "more than" in problems[0]
    unpacked = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    assert unpacked <= 20 << 20


def test_an_archive_cannot_write_outside_its_folder(tmp_path: Path) -> None:
    evil = make_tar(
        tmp_path / "evil.tar",
        {"../../escaped.txt": b"x", "/etc/abs.txt": b"y", "ok/dmesg.txt": b"[ 1.0] usb 1-1: hi\n"},
        mode="w",
    )
    entries = expand([str(evil)], workdir=tmp_path / "w", limits=Limits())
    assert (
        not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()
    )
    assert any(e.skipped and "not unpacked" in e.skipped for e in entries)
    assert any(e.path.endswith("ok/dmesg.txt") for e in entries)


def test_links_in_a_folder_are_not_followed(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "shadow").symlink_to("/etc/passwd")
    entries = expand([str(tmp_path / "b")], workdir=tmp_path / "w", limits=Limits())
    assert [e.skipped for e in entries] == ["a symbolic link (not followed)"]


def test_gzip_and_utf16_logs_are_decoded(tmp_path: Path) -> None:
    line = "[  12.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    gz = tmp_path / "kern.log.gz"
    gz.write_bytes(gzip.compress(line.encode()))
    u16 = tmp_path / "dmesg-windows.txt"
    u16.write_bytes(line.encode("utf-16"))
    u16le = tmp_path / "dmesg-nobom.txt"
    u16le.write_bytes(line.encode("utf-16-le"))
    for p in (gz, u16, u16le):
        with open_input(p, timeout_s=5) as inp:
            assert detect(inp.head) == "kernel-log", p.name
        report, _ = analyze([(str(p), None)], opts=opts())
        assert codes(report) == {("XID_79", "pci:0000:3b:00.0")}, p.name


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"", Status.FAILED),
        (bytes(range(256)) * 100, Status.FAILED),
        ("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 13, x\n".encode("utf-32"), Status.FAILED),
        (b"[    1.0] usb 1-1: new high-speed USB device\n", Status.OK),
    ],
    ids=["empty", "binary", "utf32", "quiet"],
)
def test_a_forced_kernel_log_is_never_silently_healthy(tmp_path: Path, data: bytes, status) -> None:
    p = tmp_path / "kmsg.log"
    p.write_bytes(data)
    report, _ = analyze([(str(p), "kernel-log")], opts=opts())
    assert report.status is status
    if status is Status.FAILED:
        assert report.exit_code() == 2


def test_a_copy_of_sys_class_infiniband_is_a_sysfs_capture(corpus: Path) -> None:
    # corpus network/sysfs_class_infiniband_h100_gpud (leptonai/gpud testdata, MANIFEST):
    # 8 IB ports ACTIVE at 400 and a bond at 200; mlx5_1's link_downed is saturated (255).
    tree = corpus / "network" / "sysfs_class_infiniband_h100_gpud"
    report, inputs = analyze(
        [(str(tree), None)], opts=opts(ib=FabricExpectation(kind="ib", count=8))
    )
    assert [(i.kind, i.status) for i in inputs] == [("sysfs", Status.WARNING)]
    assert codes(report) == {("FABRIC_ERRORS", "nic:mlx5_1")}
    assert [r.check for r in report.checks] == ["fabric"]  # no PCI devices in this capture
    assert report.exit_code() == 0


def test_a_bundles_readme_and_checksum_files_are_listed_never_judged(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    log = "[  100.000001] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07\n"
    (bundle / "dmesg.txt").write_text(log)
    # A README may quote the very errors the bundle shows: still not an output.
    (bundle / "README.md").write_text("# node 7\nGPU 3 has fallen off the bus, see dmesg\n")
    (bundle / "SHA256SUMS").write_text(f"{'a' * 64}  dmesg.txt\n{'b' * 64} *README.md\n")
    report, inputs = analyze(
        [(str(bundle), None)], opts=Options(node=NodeConfig(), expect=Expect())
    )
    how = {Path(i.path).name: i.how for i in inputs}
    assert how["README.md"].startswith("skipped: not an output")
    assert how["SHA256SUMS"].startswith("skipped: a checksum file")
    assert how["dmesg.txt"] == "detected"
    assert report.exit_code() == 0, [f.message for f in report.problems]


def test_a_2_gib_file_of_nul_bytes_is_answered_fast(tmp_path: Path) -> None:
    """A sparse 2 GiB file (no disk used): not a tar (magic bytes first, no decompressor
    run over it), not an output; forced to be a kernel log, the reader stops at 64 MiB
    of binary data. Timed in bench/, not here: this proves the early stops are taken."""
    big = tmp_path / "zeros.bin"
    with big.open("wb") as f:
        f.truncate(2 * 1024**3)
    opts = Options(node=NodeConfig(), expect=Expect())
    report, inputs = analyze([(str(big), None)], opts=opts)
    assert report.exit_code() == 2 and inputs[0].how == "not recognised"
    report, inputs = analyze([(str(big), "kernel-log")], opts=opts)
    assert report.exit_code() == 2
    (why,) = [f.message for f in report.problems]
    assert "not text" in why and "stopped after" in why, why


def test_a_log_cut_by_the_read_deadline_is_judged_for_what_was_read(tmp_path: Path) -> None:
    """A FIFO whose writer sent an Xid 79 (and more) then hung: the read deadline ends the read,
    the Xid already read still fails the node (a definite failure wins, as at the size
    cap), and the rest is "could not tell"."""
    import os
    import threading

    fifo = tmp_path / "dmesg.fifo"
    os.mkfifo(fifo)
    release = threading.Event()

    def writer() -> None:
        with fifo.open("wb") as f:
            f.write(b"[  812.4] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
            f.write(b"[  812.5] pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200\n" * 2000)
            f.flush()  # more than the head that opening the input reads
            release.wait(30)  # holds the FIFO open past the reader's deadline

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        opts = Options(node=NodeConfig(), expect=Expect(), timeout_s=1.0)
        report, _ = analyze([(str(fifo), "kernel-log")], opts=opts)
    finally:
        release.set()
        t.join(10)
    codes = {f.code: f for f in report.problems}
    assert codes["XID_79"].status is Status.FAILED, codes
    assert "read deadline" in codes["CHECK_ERROR"].message, codes["CHECK_ERROR"].message
    assert report.exit_code() == 1
