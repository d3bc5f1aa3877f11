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

import pytest

from gpuvigil.lab.image import Image
from testkit import require

pytestmark = pytest.mark.realparts


def test_a_part_runs_as_its_user_on_a_read_only_root(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "entering a root needs root (mount, chroot), as a runtime does")
    for tool in ("unshare", "mount"):
        require(shutil.which(tool) is not None, f"{tool} not installed")
    root, vol, out = tmp_path / "root", tmp_path / "config", tmp_path / "events"
    root.mkdir()
    for link in ("bin", "lib", "lib64", "sbin"):  # usrmerge: /bin etc. point into /usr
        if Path(f"/{link}").is_symlink():
            (root / link).symlink_to(os.readlink(f"/{link}"))
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
