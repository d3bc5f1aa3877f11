"""Files the agent writes as root: fixed modes whatever the umask, and a planted symlink
never redirects a write (core.files, the state-file sink, the Xid state, the event log)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from gpuvigil.core.events import Event, EventWriter
from gpuvigil.core.files import UnsafePath, write_atomic
from gpuvigil.core.findings import NodeReport
from gpuvigil.node.sinks.state_file import StateFileConfig, StateFileSink

SCRIPT = Path(__file__).resolve().parents[3] / "deploy/slurm/gpuvigil-preflight.sh"


@pytest.fixture
def open_umask():
    old = os.umask(0)
    yield
    os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_state_folder_and_files_keep_their_modes_under_umask_000(tmp_path, open_umask):
    target = tmp_path / "state" / "deep" / "xid-events.json"
    write_atomic(target, b"{}")
    assert mode(target) == 0o640
    assert mode(target.parent) == 0o750 and mode(target.parent.parent) == 0o750
    events = tmp_path / "events" / "e.jsonl"
    with EventWriter(events) as w:
        w.write(Event(ts=1.0, kind="x", source="t"))
    assert mode(events) == 0o640 and mode(events.parent) == 0o750


def test_a_planted_symlink_is_replaced_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root-owned data\n")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "report.json").symlink_to(victim)
    sink = StateFileSink(StateFileConfig(path=folder / "report.json"))
    sink.publish(NodeReport(node="n"))
    assert victim.read_text() == "root-owned data\n"
    assert not (folder / "report.json").is_symlink()
    assert '"node": "n"' in (folder / "report.json").read_text()


def test_the_event_log_refuses_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "events.jsonl").symlink_to(victim)
    with pytest.raises(UnsafePath):
        EventWriter(tmp_path / "events.jsonl")
    assert victim.read_text() == "keep\n"


def test_a_symlinked_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (tmp_path / "state").symlink_to(elsewhere)
    with pytest.raises(UnsafePath):
        write_atomic(tmp_path / "state" / "xid-events.json", b"{}")
    assert list(elsewhere.iterdir()) == []


def test_preflight_script_uses_a_private_temporary_file(tmp_path, fake_bin):
    """A symlink at the old predictable name is never followed (it was, as root)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    for pid in range(1, 400):  # the old name was /tmp/gpuvigil-preflight.$$.err
        (tmpdir / f"gpuvigil-preflight.{pid}.err").symlink_to(victim)
    fake_bin("gpuvigil", '#!/bin/sh\necho boom >&2\necho \'{"result": "pass"}\'\nexit 0\n')
    fake_bin("scontrol", "#!/bin/sh\nexit 0\n")
    fake_bin("squeue", "#!/bin/sh\n")
    env = dict(
        os.environ,
        PATH=f"{fake_bin.dir}:{os.environ['PATH']}",
        TMPDIR=str(tmpdir),
        SLURMD_NODENAME="gpu7",
    )
    env.pop("SLURM_JOB_ID", None)
    p = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert victim.read_text() == "precious\n"
    left = [f for f in tmpdir.iterdir() if not f.is_symlink()]
    assert left == []  # the private file is removed on exit
    assert "mktemp" in SCRIPT.read_text() and "$$.err" not in SCRIPT.read_text()
