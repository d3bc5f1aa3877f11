"""`gpuvigil lab --fault xid79 --workload serving --json`, for real (issue #23): a fatal Xid
on the job's node that holds most replicas of an inference Deployment (4 replicas of one
GPU, demand 4 from its HPA, a PDB of minAvailable 100%). The controller, configured with
the pool in its config file and running from the built image as its ServiceAccount, must
scale the Deployment up before it drains, wait for the new replicas, pass the PDB only at
the drain deadline and say so, reboot the node, validate it and put the replicas back;
Ready replicas never fewer than the demand. About three minutes on two cores."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_lab import _show, built_of_this_code, events

from gpuvigil.lab import control_plane
from testkit import cli_env, gpuvigil_argv, require

pytestmark = [pytest.mark.realparts, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    why = control_plane.missing()
    require(not why, why or "")
    built_of_this_code()
    workdir: Path = tmp_path_factory.mktemp("lab") / "lab"
    argv = ["lab", "--fault", "xid79", "--workload", "serving", "--json", "--quiet",
            "--workdir", str(workdir)]  # fmt: skip
    r = subprocess.run(gpuvigil_argv(*argv), env=cli_env(), capture_output=True, text=True,
                       timeout=1100)  # fmt: skip
    assert r.stdout.strip(), f"no result (exit {r.returncode}):\n{r.stderr[-3000:]}"
    (workdir.parent / "lab.json").write_text(r.stdout)  # kept by pytest, with the lab's files
    out: dict[str, Any] = json.loads(r.stdout)
    assert r.returncode == 0 and out["settled"], f"exit {r.returncode}:\n{_show(out)}"
    return out


def remediations(r: dict[str, Any], detail: str) -> list[float]:
    return [e["t_s"] for e in events(r, "remediation", r["node"]) if e["detail"] == detail]


def test_ready_replicas_never_fall_below_demand(result: dict[str, Any]) -> None:
    s, shown = result["serving"], _show(result)
    assert s["min_ready"] is not None and s["min_ready"] >= s["demand"] == 4, (s, shown)
    assert s["samples"] >= 100, s  # the bound holds at any gap; this says the loop ran
    assert s["restored"] and s["replicas_now"] == s["ready_now"] == 4, (s, shown)


def test_the_node_is_repaired_after_a_make_before_break(result: dict[str, Any]) -> None:
    r, shown = result, _show(result)
    assert r["serving"]["peak_replicas"] > r["serving"]["demand"], shown  # scaled up
    assert r["remediation_steps"] == ["REBOOT"] and r["final_state"][r["node"]] == "HEALTHY"
    scaled, forced = remediations(r, "CAPACITY scale-up"), remediations(r, "DRAIN pdb-overridden")
    rebooted, restored = remediations(r, "REBOOT started"), remediations(r, "CAPACITY restored")
    # made before it broke: the replicas up before the drain passed the PDB, once each
    assert len(scaled) == len(restored) == 1, shown
    assert scaled[0] < forced[0] < rebooted[0] < restored[0], shown
    assert r["figures"]["back_in_service_s"] is not None, shown


def test_a_pdb_that_blocks_past_the_deadline_shows_in_the_timeline(
    result: dict[str, Any],
) -> None:
    """The 100% PDB refuses every eviction; at the drain deadline (60 s in the lab) the
    replicas are deleted, and the timeline says so."""
    r, shown = result, _show(result)
    (began,) = remediations(r, "DRAIN started")
    (forced,) = remediations(r, "DRAIN pdb-overridden")
    assert 55 <= forced - began <= 90, shown


def test_the_controller_is_refused_nothing(result: dict[str, Any]) -> None:
    """Its RBAC allows the Deployment, its scale and the HPA: the audit log refused no call."""
    (ctl,) = [p for p in result["parts"] if p["name"] == "controller"]
    assert ctl["refused"] == [] and ctl["runs_from"] == "image", ctl
    assert result["job"]["finished"], _show(result)
