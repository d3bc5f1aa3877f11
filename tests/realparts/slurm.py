"""A real Slurm 22.05 cluster on loopback: munged, slurmctld and one slurmd per node.

Several slurmd run on one host with a distinct Port each; fake GPUs are character
devices made with mknod. Commands (scontrol, sinfo, squeue, sbatch, srun) must run with
`env()` so they find this cluster's slurm.conf.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from realparts.procs import Proc, free_port, wait_until

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "mknod")


def available() -> tuple[bool, str]:
    for b in BINARIES:
        if shutil.which(b) is None:
            return False, f"{b} not installed (Debian slurm-wlm, slurmd, munge)"
    if os.geteuid() != 0:
        return False, "the Slurm fixture needs root (mknod, SlurmUser=root)"
    return True, ""


class SlurmCluster:
    def __init__(
        self,
        workdir: Path,
        *,
        nodes: int = 4,
        gpus: int = 8,
        node_fragment: bool = False,
        task_prolog: str | None = None,
    ) -> None:
        """`node_fragment`: the NodeName lines live in `nodes.conf`, which slurm.conf
        Includes (the layout gpuvigil's degraded-node procedure edits); `task_prolog`: the
        TaskProlog command."""
        self.dir = workdir
        self.node_fragment = node_fragment
        self.task_prolog = task_prolog
        self.n = nodes
        self.gpus = gpus
        self.names = [f"gpu{i}" for i in range(1, nodes + 1)]
        self.procs: list[Proc] = []
        self.slurmd: dict[str, Proc] = {}
        self.conf = workdir / "slurm.conf"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=30)
        if check and r.returncode != 0:
            raise RuntimeError(f"{argv}: exit {r.returncode}: {r.stderr.strip()}")
        return r

    def start(self) -> None:
        d = self.dir
        d.chmod(0o755)
        munge_dir = d / "munge"
        munge_dir.mkdir(mode=0o755)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        shutil.chown(munge_dir, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
        self.munge_socket = munge_dir / "munge.socket"
        self.procs.append(
            Proc(
                [
                    "munged", "--foreground", "--force",
                    "--key-file", str(key),
                    "--socket", str(self.munge_socket),
                    "--pid-file", str(munge_dir / "munged.pid"),
                    "--log-file", str(munge_dir / "munged.log"),
                    "--seed-file", str(munge_dir / "munged.seed"),
                ],
                log=d / "munged.out",
                user="munge",
            )
        )  # fmt: skip
        wait_until(self.munge_socket.exists, timeout=10, what="munged socket")

        devdir = d / "dev"
        devdir.mkdir()
        for i in range(self.gpus):
            subprocess.run(["mknod", str(devdir / f"nvidia{i}"), "c", "1", "3"], check=True)
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir()
        host = socket.gethostname().split(".")[0]
        self.ctld_port = free_port()
        ports = [free_port() for _ in self.names]
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs=2 "
            f"RealMemory=1000 Gres=gpu:{self.gpus} State=UNKNOWN"
            for n, p in zip(self.names, ports, strict=True)
        )
        self.node_conf = d / "nodes.conf"
        if self.node_fragment:
            self.node_conf.write_text(node_lines + "\n")
            node_lines = f"Include {self.node_conf}"
        prolog = f"TaskProlog={self.task_prolog}\n" if self.task_prolog else ""
        self.conf.write_text(
            prolog
            + f"""ClusterName=gpuvigil-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
RebootProgram=/bin/true
GresTypes=gpu
{node_lines}
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        (d / "gres.conf").write_text(
            f"NodeName={','.join(self.names)} Name=gpu File={devdir}/nvidia[0-{self.gpus - 1}]\n"
        )
        self.procs.append(
            Proc(["slurmctld", "-D", "-i", "-f", str(self.conf)], log=d / "slurmctld.out",
                 env=self.env())
        )  # fmt: skip
        for n in self.names:
            self.start_slurmd(n)
        wait_until(self.all_idle, timeout=60, interval=0.5, what="Slurm nodes idle")

    def start_slurmd(self, node: str) -> None:
        self.slurmd[node] = Proc(
            ["slurmd", "-D", "-N", node, "-f", str(self.conf)],
            log=self.dir / f"slurmd-{node}.out",
            env=self.env(),
        )

    def stop_slurmd(self, node: str) -> None:
        p = self.slurmd.pop(node, None)
        if p:
            p.stop()

    def stop(self) -> None:
        # Batch steps run under slurmstepd in sessions of their own: cancel the jobs first so
        # nothing outlives the cluster.
        if self.procs and (self.procs[-1].alive() or self._pidfile_slurmctld()):
            self.run("scancel", "--full", "--quiet", "--user=root", check=False)
            time.sleep(0.5)
        for p in self.slurmd.values():
            p.stop()
        self.slurmd.clear()
        for p in self.procs[::-1]:
            p.stop()
        self._stop_restarted_slurmctld()

    def restart_argv(self) -> list[str]:
        """A command that restarts this cluster's slurmctld (as `systemctl restart
        slurmctld` would), for gpuvigil's `degrade.restart_slurmctld`."""
        return [
            sys.executable,
            str(Path(__file__).with_name("restart_slurmctld.py")),
            str(self.conf),
        ]

    def _pidfile_slurmctld(self) -> int | None:
        """The pid in slurmctld's pid file when that process is a slurmctld."""
        try:
            pid = int((self.dir / "slurmctld.pid").read_text().strip())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            return None
        return pid if "slurmctld" in cmd else None

    def _stop_restarted_slurmctld(self) -> None:
        """A slurmctld that `restart_argv` started is no child of ours: stop it by its pid
        file."""
        pid = self._pidfile_slurmctld()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        # wait for it: it saves its state on the way out, into the folder about to go
        end = time.monotonic() + 15
        while Path(f"/proc/{pid}").exists() and time.monotonic() < end:
            time.sleep(0.1)

    # -- reading state ---------------------------------------------------------------------
    def nodes(self) -> dict[str, dict[str, Any]]:
        data = json.loads(self.run("sinfo", "--json").stdout)
        return {n["name"]: n for n in data.get("nodes", [])}

    def node_state(self, node: str) -> str:
        """`scontrol show node`'s State= field, e.g. IDLE, IDLE+DRAIN, DOWN*+DRAIN."""
        out = self.run("scontrol", "show", "node", node).stdout
        for tok in out.split():
            if tok.startswith("State="):
                return tok.split("=", 1)[1]
        return ""

    def all_idle(self) -> bool:
        return all(self.node_state(n).startswith("IDLE") for n in self.names)

    def reset(self) -> None:
        """Return every node to service between tests (RESUME, clearing reasons), with
        nothing of gpuvigil's left on it (the controller's record in Comment, the agent's
        summary in Extra, a pending reboot): a test never inherits another's node state."""
        for n in self.names:
            if n not in self.slurmd:
                self.start_slurmd(n)
            self.run("scontrol", "cancel_reboot", n, check=False)
            self.run("scontrol", "update", f"NodeName={n}", "Comment=", "Extra=", check=False)
            state = self.node_state(n)
            if "DRAIN" in state or "DOWN" in state or "FAIL" in state:
                self.run("scontrol", "update", f"NodeName={n}", "State=RESUME", check=False)
        self.run("scancel", "--full", "--quiet", "--user=root", check=False)
        wait_until(self.all_idle, timeout=60, interval=0.5, what="Slurm nodes idle after reset")


def make_workdir() -> Path:
    # Under /tmp with mode 755: munged (as the munge user) must traverse it.
    return Path(tempfile.mkdtemp(prefix="gpuvigil-slurm-", dir="/tmp"))
