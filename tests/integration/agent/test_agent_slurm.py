"""The Slurm sink against a real Slurm 22.05 (slurmctld + slurmd on loopback): the agent
writes its summary into the node's Extra field (read back with scontrol and sinfo), and in
standalone mode drains its node on a fatal Xid and resumes it once a GPU reset (driver
reload) has cleared the Xid; in publish mode it never drains."""

from __future__ import annotations

import json

import agent_helpers
import pytest
from agent_helpers import wait_until

from gpuvigil.core import wire
from gpuvigil.node.sinks.slurm import parse_show_node

start_agent = agent_helpers.start_agent  # the fixture
pytestmark = pytest.mark.realparts
XID74 = (
    "[ 2000.000000] NVRM: Xid (PCI:0000:18:00): 74, pid=4242, name=python, "
    "NVLink: fatal error detected on link 3"
)
DRIVER_RELOAD = "[ 2100.000000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07"


def node_info(slurm, name: str) -> dict[str, str]:
    return parse_show_node(slurm.run("scontrol", "show", "node", name, "-o").stdout)


def extra_status(slurm, name: str) -> str | None:
    summary = wire.decode_health(node_info(slurm, name).get(wire.SLURM_HEALTH_FIELD))
    return summary.status.value if summary else None


def test_standalone_drains_on_fatal_xid_and_resumes_after_it_clears(start_agent, slurm, tmp_path):
    a = start_agent(
        {"agent": {"sinks": {"slurm": {"marker_path": str(tmp_path / "drained")}}}},
        "--interval",
        "1",
        "--node-name",
        "gpu2",
        "--sink",
        "slurm",
        "--sink",
        "state-file",
        "--sink",
        "http",
        "--slurm-mode",
        "standalone",
        env=slurm.env(),
    )
    wait_until(lambda: extra_status(slurm, "gpu2") == "OK", 15, "Extra with status OK")
    # Readable by sinfo too (what a site's own tooling would use).
    out = slurm.run("sinfo", "-N", "-n", "gpu2", "-h", "-O", "Extra:1000").stdout.strip()
    assert wire.decode_health(out) is not None
    sinfo = json.loads(slurm.run("sinfo", "--json").stdout)
    assert any(n["name"] == "gpu2" and wire.decode_health(n.get("extra")) for n in sinfo["nodes"])

    a.machine.log(XID74)
    info = wait_until(
        lambda: (i := node_info(slurm, "gpu2")) and "DRAIN" in i["State"] and i, 10, "gpu2 drained"
    )
    assert info["Reason"] == "gpuvigil:SUSPECT:-:XID_74 gpu:0"
    assert extra_status(slurm, "gpu2") == "FAILED"
    assert "DRAIN" not in node_info(slurm, "gpu1")["State"]  # only its own node

    a.machine.log(DRIVER_RELOAD)  # the GPU was reset: the Xid no longer counts
    wait_until(lambda: "DRAIN" not in node_info(slurm, "gpu2")["State"], 10, "gpu2 resumed")
    wait_until(lambda: extra_status(slurm, "gpu2") == "OK", 5, "Extra back to OK")


def test_publish_mode_never_drains(start_agent, slurm, tmp_path):
    a = start_agent(
        {"agent": {"sinks": {"slurm": {"marker_path": str(tmp_path / "drained")}}}},
        "--interval",
        "1",
        "--node-name",
        "gpu3",
        "--sink",
        "slurm",
        "--sink",
        "state-file",
        env=slurm.env(),
    )
    wait_until(lambda: extra_status(slurm, "gpu3") == "OK", 15, "Extra with status OK")
    a.machine.log(XID74)
    wait_until(lambda: extra_status(slurm, "gpu3") == "FAILED", 10, "Extra FAILED")
    assert "DRAIN" not in node_info(slurm, "gpu3")["State"]
