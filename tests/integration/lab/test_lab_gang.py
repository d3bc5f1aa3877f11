"""`gpuvigil lab --fault xid79 --restart gang --json`, for real: the whole-gang mode the lab
ran before the in-process restart (issue #24) stays reachable. The torchrun example Job
(`deploy/kubernetes/examples/training-job.yaml`): the drain stops every rank, the next
attempt starts both on the nodes the scheduler finds, no rank's pod is kept, and the job
finishes with at most one step lost. From this machine's Python (`--no-image`): the image's
parts are test_lab.py's. About a minute and a half on two cores."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_lab import _show, events

from gpuvigil.lab import control_plane
from testkit import cli_env, gpuvigil_argv, require

pytestmark = [pytest.mark.realparts, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    why = control_plane.missing()
    require(not why, why or "")
    workdir: Path = tmp_path_factory.mktemp("lab") / "lab"
    argv = ["lab", "--fault", "xid79", "--restart", "gang", "--no-image", "--json", "--quiet",
            "--workdir", str(workdir)]  # fmt: skip
    r = subprocess.run(gpuvigil_argv(*argv), env=cli_env(), capture_output=True, text=True,
                       timeout=800)  # fmt: skip
    assert r.stdout.strip(), f"no result (exit {r.returncode}):\n{r.stderr[-3000:]}"
    (workdir.parent / "lab.json").write_text(r.stdout)  # kept by pytest, with the lab's files
    out: dict[str, Any] = json.loads(r.stdout)
    assert r.returncode == 0 and out["settled"], f"exit {r.returncode}:\n{_show(out)}"
    return out


def test_the_gang_mode_restarts_every_rank(result: dict[str, Any]) -> None:
    job, shown = result["job"], _show(result)
    assert job["finished"] and job["mode"] == "gang", shown
    assert events(result, "job.gang_stopped") and not events(result, "job.pod_replaced"), shown
    assert job["survivors"] == [] and job["restarted"] == [0, 1] and job["restarts"] == 1, shown
    assert len(job["attempts"]) == 2 and all(len(a["nodes"]) == 2 for a in job["attempts"]), shown
    assert job["lost_steps"] is not None and job["lost_steps"] <= 1, shown
    phases = result["figures"]["restart_phases"]
    assert phases is not None and phases["process_start"] is not None, shown
