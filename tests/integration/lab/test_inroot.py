"""`gpuvigil.lab.inroot` enters a root folder as a container runtime starts a container:
the manifest's user, a read-only root, read-only and writable volumes, its own /proc, and
the same PID (the lab stops a part by PID). Run here on a root made of the host's /usr,
without the image (the lab test runs the controller from the real one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuvigil.lab import inroot
from gpuvigil.lab.image import Image
from testkit import require

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.realparts


def usr_root(tmp_path: Path) -> Path:
    """A root folder that the host's /usr, bound read-only, makes runnable."""
    root = tmp_path / "root"
    root.mkdir(parents=True)
    for link in ("bin", "lib", "lib64", "sbin"):  # usrmerge: /bin etc. point into /usr
        if Path(f"/{link}").is_symlink():
            (root / link).symlink_to(os.readlink(f"/{link}"))
    return root


def test_a_part_runs_as_its_user_on_a_read_only_root(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "entering a root needs root (mount, chroot), as a runtime does")
    for tool in ("unshare", "mount"):
        require(shutil.which(tool) is not None, f"{tool} not installed")
    root, vol, out = usr_root(tmp_path), tmp_path / "config", tmp_path / "events"
    vol.mkdir()
    (tmp_path / "etc").mkdir()  # a volume at /etc, listed after /etc/gpuvigil: must not hide it
    (vol / "config.yaml").write_text("controller: {}\n")
    os.chown(vol / "config.yaml", 65532, 65532)
    out.mkdir(mode=0o1777)
    out.chmod(0o1777)
    image = Image("test:0", "none", root, "sha256:" + "0" * 64, {"PATH": "/usr/bin:/bin"})
    script = (
        "id -u; id -g; cat /etc/gpuvigil/config.yaml; echo $$ > /events/pid; "
        "touch /etc/gpuvigil/x 2>/dev/null || echo volume-ro; "
        "touch /written 2>/dev/null || echo root-ro; echo ok > /events/w; "
        "test -r /proc/self/status && echo proc"
    )
    argv = image.argv(["sh", "-c", script], uid=65532, gid=65532, env={"A": "1"},
                      binds=[(str(vol), "/etc/gpuvigil", True), (str(out), "/events", False),
                             ("/usr", "/usr", True), (str(tmp_path / "etc"), "/etc", False)],
                      read_only_root=True)  # fmt: skip
    assert "shell=True" not in " ".join(argv) and argv[0] == "unshare"
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={"PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 0, stderr
    assert stdout.split() == ["65532", "65532", "controller:", "{}", "volume-ro", "root-ro",
                              "proc"], (stdout, stderr)  # fmt: skip
    assert (out / "w").read_text() == "ok\n" and (out / "w").stat().st_uid == 65532
    # exec all the way: the shell kept the PID the lab started (so it stops it by PID)
    assert int((out / "pid").read_text()) == p.pid
    assert not (root / "written").exists()


def test_a_root_that_cannot_be_entered_is_one_line_and_non_zero(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "entering a root needs root")
    image = Image("test:0", "none", tmp_path / "absent", "sha256:" + "0" * 64, {})
    p = subprocess.run(image.argv(["true"], uid=1, gid=1, binds=[], env={},
                                  read_only_root=True),
                       capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert p.returncode != 0
    assert "gpuvigil.lab.inroot:" in p.stderr and "Traceback" not in p.stderr, p.stderr


def status_inside(tmp_path: Path, security: dict[str, Any]) -> dict[str, str]:
    """/proc/self/status, and the namespaces, of a process started in a root as `security`
    (`Image.security` of a securityContext) asks."""
    root = usr_root(tmp_path)
    image = Image("test:0", "none", root, "sha256:" + "0" * 64, {"PATH": "/usr/bin:/bin"})
    script = (
        "cat /proc/self/status; "
        "for n in net pid ipc uts mnt; do echo ns_$n: $(readlink /proc/self/ns/$n); done"
    )
    argv = image.argv(["sh", "-c", script], binds=[("/usr", "/usr", True)], env={},
                      **security)  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert p.returncode == 0, p.stderr
    return fields(p.stdout)


def fields(status: str) -> dict[str, str]:
    return {k: v.strip() for k, v in (ln.split(":", 1) for ln in status.splitlines() if ":" in ln)}


def mask(names: list[str] | tuple[str, ...]) -> int:
    return sum(1 << inroot.CAPABILITIES.index(n) for n in names)


def test_what_the_chroot_enforces_and_what_only_a_runtime_does(tmp_path: Path) -> None:
    """docs/lab.md "What the lab's chroot enforces", read from /proc/self/status inside."""
    require(os.geteuid() == 0, "entering a root needs root")
    host_bounding = int(fields(Path("/proc/self/status").read_text())["CapBnd"], 16)
    # The controller's shipped securityContext: uid 65532, drop ALL, no privilege escalation.
    deployment = yaml.safe_load((REPO / "deploy/kubernetes/controller/deployment.yaml").read_text())
    spec = deployment["spec"]["template"]["spec"]
    security = Image.security(spec["securityContext"], spec["containers"][0]["securityContext"])
    assert security["capabilities"] == [] and security["no_new_privs"], security
    got = status_inside(tmp_path / "controller", security)
    assert got["Uid"].split() == ["65532"] * 4, got["Uid"]
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(got[field], 16) == 0, (field, got[field])  # none, and none to regain
    assert got["NoNewPrivs"] == "1"  # a setuid file cannot raise it either
    # What the lab does not do, and a runtime does: RuntimeDefault's seccomp filter
    # (Seccomp 2 under containerd); a PID, network, IPC and UTS namespace of its own
    # (the parts share the host's loopback: the training job's rendezvous is there).
    assert got["Seccomp"] == "0"
    for ns in ("net", "pid", "ipc", "uts"):
        assert got[f"ns_{ns}"] == os.readlink(f"/proc/self/ns/{ns}"), ns
    assert got["ns_mnt"] != os.readlink("/proc/self/ns/mnt")  # its mounts are its own
    # Root, not privileged, no drop: the runtime's default set, and only that, in reach.
    default = Image.security({}, {"runAsUser": 0})
    got = status_inside(tmp_path / "root-default", default)
    want = mask(inroot.RUNTIME_DEFAULT) & host_bounding
    assert int(got["CapBnd"], 16) == int(got["CapEff"], 16) == want
    assert got["NoNewPrivs"] == "0"  # allowPrivilegeEscalation defaults to true
    # Root and privileged (the agent's DaemonSet): every capability the host has.
    agent = yaml.safe_load((REPO / "deploy/kubernetes/agent/daemonset.yaml").read_text())
    (container,) = [c for c in agent["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "agent"]  # fmt: skip
    got = status_inside(tmp_path / "agent", Image.security({}, container["securityContext"]))
    assert int(got["CapEff"], 16) == int(got["CapBnd"], 16) == host_bounding
    # runAsNonRoot with uid 0: refused before anything starts, in one line
    image = Image("test:0", "none", usr_root(tmp_path / "root-refused"), "sha256:" + "0" * 64, {})
    argv = image.argv(["true"], binds=[], env={},
                      **Image.security({"runAsNonRoot": True}, {"runAsUser": 0}))  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert p.returncode != 0 and "runAsNonRoot" in p.stderr and "Traceback" not in p.stderr


def test_a_volume_at_dev_shm_is_the_pods_not_the_hosts(tmp_path: Path) -> None:
    """The in-process example mounts a memory-backed emptyDir at /dev/shm (the in-memory
    tier's folder): it must sit on the host's /dev that the root gets, not under it, or
    every pod of the machine would share the host's /dev/shm."""
    require(os.geteuid() == 0, "entering a root needs root (mount, chroot), as a runtime does")
    for tool in ("unshare", "mount"):
        require(shutil.which(tool) is not None, f"{tool} not installed")
    root, shm = usr_root(tmp_path), tmp_path / "shm"
    shm.mkdir()
    image = Image("test:0", "none", root, "sha256:" + "0" * 64, {"PATH": "/usr/bin:/bin"})
    argv = image.argv(["sh", "-c", "echo mine > /dev/shm/tier && test -c /dev/null && echo dev"],
                      uid=0, gid=0, env={}, binds=[(str(shm), "/dev/shm", False),
                                                   ("/usr", "/usr", True)],
                      read_only_root=True)  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert p.returncode == 0 and p.stdout.split() == ["dev"], (p.stdout, p.stderr)
    assert (shm / "tier").read_text() == "mine\n"
    assert not Path("/dev/shm/tier").exists()
