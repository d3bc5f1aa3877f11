"""`gpuvigil agent` as a real process: an INVESTIGATE-class Xid is still reported after a
reboot (a new boot id and an empty kernel log), and gone after a person's release marker."""

from __future__ import annotations

import json
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import yaml
from agent_helpers import wait_until

from gpuvigil.core.findings import utcnow
from testkit import cli_env, gpuvigil_argv


class Node:
    """A machine the agent runs on: its boot id (read below --sysfs-root, like
    /proc/sys/kernel/random/boot_id), its kernel log, and the agent's state folder."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        (self.root / "proc/sys/kernel/random").mkdir(parents=True)
        self.kmsg = tmp / "kern.log"
        self.state_dir = tmp / "state"
        self.report = tmp / "report.json"
        self.config = tmp / "agent.yaml"
        self.config.write_text(yaml.safe_dump({"agent": {"publish_interval_s": 0.5}}))
        self.proc: subprocess.Popen[bytes] | None = None

    def boot(self, boot_id: str, *lines: str) -> None:
        (self.root / "proc/sys/kernel/random/boot_id").write_text(boot_id + "\n")
        self.kmsg.write_text(
            "\n".join(["[    0.000000] Linux version 6.1.0 (test)", *lines]) + "\n"
        )

    def start(self) -> None:
        self.report.unlink(missing_ok=True)
        argv = gpuvigil_argv(
            "agent",
            "--config",
            str(self.config),
            "--kmsg-file",
            str(self.kmsg),
            "--state-file",
            str(self.report),
            "--sink",
            "state-file",
            "--state-dir",
            str(self.state_dir),
            "--sysfs-root",
            str(self.root),
            "--expect-gpus",
            "0",
            "--interval",
            "1",
            "--log-level",
            "warning",
        )
        log = (self.tmp / "agent.log").open("ab")
        self.proc = subprocess.Popen(argv, env=cli_env(), stdout=log, stderr=subprocess.STDOUT)
        wait_until(self.report.exists, 30, "the first report")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def xid(self, code: str) -> dict | None:
        for f in json.loads(self.report.read_text())["findings"]:
            if f["code"] == code:
                return f
        return None


def test_investigate_xid_survives_reboot_until_released(tmp_path):
    node = Node(tmp_path)
    at = utcnow() - timedelta(minutes=10)
    xid = (
        f"{at.isoformat().replace('.', ',')} NVRM: Xid (PCI:0000:3b:00): 54, pid=4242, "
        "name=python3, Auxiliary power is not connected to the GPU board"
    )
    try:
        node.boot("boot-a", xid)
        node.start()
        f = wait_until(lambda: node.xid("XID_54"), 15, "XID_54 in boot a")
        assert f["status"] == "FAILED" and f["action"] == "INVESTIGATE"
        kept = json.loads((node.state_dir / "xid-events.json").read_text())["events"]
        assert [(e["code"], e["boot_id"]) for e in kept] == [(54, "boot-a")]
        node.stop()

        # The node reboots: a new boot id, a kernel log without the Xid.
        node.boot("boot-b")
        node.start()
        f = wait_until(lambda: node.xid("XID_54"), 15, "XID_54 after the reboot")
        assert f["action"] == "INVESTIGATE" and xid in f["evidence"]["lines"]

        # A person looked at the node and released it.
        (node.state_dir / "released-at").write_text(utcnow().isoformat() + "\n")
        wait_until(lambda: node.xid("XID_54") is None, 15, "XID_54 gone after the release")
        node.stop()
        assert json.loads((node.state_dir / "xid-events.json").read_text())["events"] == []

        node.start()  # and it stays gone after the next start
        wait_until(
            lambda: json.loads(node.report.read_text())["findings"] is not None, 5, "a report"
        )
        assert node.xid("XID_54") is None and node.xid("AGENT_STATE") is None
    finally:
        node.stop()
