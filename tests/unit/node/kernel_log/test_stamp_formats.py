"""Kernel logs in every stamp format `analyze` is given, with and without NVIDIA driver
lines: a log with no NVRM line is still a kernel log (quiet: exit 0), and one with an Xid
79 line is that failure (exit 1), whatever the stamps.

Written samples (ours) for each form of dmesg, syslog, journalctl and /dev/kmsg, and the
real logs of ../shared/corpus/kernel_logs (dmesg -T, --time-format iso, --decode, raw;
leptonai/gpud testdata, provenance in its MANIFEST.tsv) with their NVRM lines taken out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvigil.node.capture.judge import Expect
from gpuvigil.node.capture.kinds import detect
from gpuvigil.node.capture.session import Options, analyze
from gpuvigil.node.config import NodeConfig

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
QUIET = (
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "e1000e 0000:00:19.0 eth0: NIC Link is Up 1000 Mbps Full Duplex",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode",
)
# (name, the stamp of each of three lines): the message follows the stamp.
FORMATS = {
    "dmesg-H": ("[Dec 2 10:15] ", "[  +0.000004] ", "[  +1.512345] "),
    "dmesg-H-two-digit-day": ("[Dec12 10:15] ", "[  +0.000004] ", "[  +1.512345] "),
    "dmesg-H-seconds": ("[Dec 2 10:15:01] ", "[  +0.000004] ", "[  +1.512345] "),
    "dmesg-d": (
        "[  123.456789 <    0.000004>] ",
        "[  124.456789 <    1.000000>] ",
        "[  125.5 <    1.0>] ",
    ),
    "dmesg-raw": ("[  123.456789] ", "[  124.456789] ", "[  125.456789] "),
    "dmesg-r": ("<6>[  123.456789] ", "<6>[  124.456789] ", "<4>[  125.456789] "),
    "dmesg-T": (
        "[Wed Dec  2 10:15:01 2026] ",
        "[Wed Dec  2 10:15:02 2026] ",
        "[Wed Dec  2 10:15:03 2026] ",
    ),
    "dmesg-iso": (
        "2026-12-02T10:15:01,123456+00:00 ",
        "2026-12-02T10:15:02,123456+00:00 ",
        "2026-12-02T10:15:03,1+00:00 ",
    ),
    "dmesg-decode": (
        "kern  :info  : [  123.456789] ",
        "kern  :warn  : [  124.456789] ",
        "kern  :err   : [  125.4] ",
    ),
    "syslog": (
        "Dec  2 10:15:01 gpu-7 kernel: [  123.456789] ",
        "Dec  2 10:15:02 gpu-7 kernel: ",
        "Dec  2 10:15:03 gpu-7 kernel: ",
    ),
    "journalctl-short-precise": (
        "Dec 02 10:15:01.123456 gpu-7 kernel: ",
        "Dec 02 10:15:02.123456 gpu-7 kernel: ",
        "Dec 02 10:15:03.1 gpu-7 kernel: ",
    ),
    "journalctl-short-iso": (
        "2026-12-02T10:15:01+0000 gpu-7 kernel: ",
        "2026-12-02T10:15:02+0000 gpu-7 kernel: ",
        "2026-12-02T10:15:03+0000 gpu-7 kernel: ",
    ),
    "kmsg": ("6,1201,123456789,-;", "6,1202,124456789,-;", "6,1203,125456789,-;"),
}


def verdict(path: Path) -> tuple[int, str | None, set[str]]:
    report, inputs = analyze([(str(path), None)], opts=Options(node=NodeConfig(), expect=Expect()))
    return report.exit_code(), inputs[0].kind, {f.code for f in report.problems}


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_quiet_log_and_one_with_an_xid(name: str, tmp_path: Path) -> None:
    stamps = FORMATS[name]
    quiet = tmp_path / f"{name}.log"
    quiet.write_text("".join(s + m + "\n" for s, m in zip(stamps, QUIET, strict=True)))
    assert detect(quiet.read_bytes()) == "kernel-log", name
    assert verdict(quiet) == (0, "kernel-log", set()), name
    failing = tmp_path / f"{name}-xid.log"
    lines = [s + m for s, m in zip(stamps, QUIET, strict=True)]
    failing.write_text("\n".join([*lines[:2], stamps[2] + XID, lines[2]]) + "\n")
    code, kind, problems = verdict(failing)
    assert (code, kind) == (1, "kernel-log") and "XID_79" in problems, (name, problems)


def test_real_logs_without_their_nvrm_lines_are_still_kernel_logs(
    corpus: Path, tmp_path: Path
) -> None:
    for real in sorted((corpus / "kernel_logs").glob("*.log")):
        kept = [ln for ln in real.read_text().splitlines() if "NVRM" not in ln and "Xid" not in ln]
        if not [ln for ln in kept if ln.strip()]:
            continue  # an excerpt of driver lines only
        quiet = tmp_path / real.name
        quiet.write_text("\n".join(kept) + "\n")
        code, kind, problems = verdict(quiet)
        assert kind == "kernel-log", real.name
        assert code == 0, (real.name, problems)
        code, kind, problems = verdict(real)
        assert (kind == "kernel-log" and code != 0) or "XID_13" in problems, (real.name, problems)
