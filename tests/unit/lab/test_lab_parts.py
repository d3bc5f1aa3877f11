"""The lab's parts that need no cluster: the Job's podFailurePolicy as Kubernetes applies it,
the shipped example against the one exit-code table, the machine's tools and faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuvigil.core import exit_codes
from gpuvigil.core.exit_codes import policy_action as match_policy
from gpuvigil.fakes.gpu import FakeNode
from gpuvigil.lab import faults
from gpuvigil.lab.follow import Follower
from gpuvigil.lab.jobs import load_example
from gpuvigil.lab.kubelet import _expand
from gpuvigil.lab.machine import Machine
from gpuvigil.node.checks.kernel_log.kernel_log_parser import parse_line
from testkit import cli_env

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "deploy/kubernetes/examples/training-job.yaml"
POLICY = load_example(EXAMPLE)["spec"]["podFailurePolicy"]


def status(code: int | None = None, *, container: str = "trainer", init: bool = False,
           disrupted: str | None = None) -> dict:  # fmt: skip
    st: dict = {"phase": "Failed", "conditions": []}
    if code is not None:
        key = "initContainerStatuses" if init else "containerStatuses"
        st[key] = [{"name": container, "state": {"terminated": {"exitCode": code}}}]
    if disrupted is not None:
        st["conditions"].append({"type": "DisruptionTarget", "status": disrupted})
    return st


@pytest.mark.parametrize(
    ("pod", "action"),
    [
        (status(1, disrupted="True"), "Ignore"),  # evicted by the drain: whatever the code
        (status(137, disrupted="True"), "Ignore"),
        (status(1, disrupted="False"), "Count"),  # a PDB refused the eviction
        (status(exit_codes.NODE_UNHEALTHY), "Ignore"),
        (status(exit_codes.NODE_STATE_UNKNOWN), "Ignore"),
        (status(exit_codes.DRAINED), "Ignore"),
        (status(exit_codes.HANG), "Count"),  # a program that deadlocks itself must not loop
        (status(exit_codes.CHECKPOINT_FAILED), "Count"),
        (status(exit_codes.NO_VERIFIED_CHECKPOINT), "FailJob"),  # every retry reads the same
        (status(1), "Count"),
        (status(exit_codes.NODE_UNHEALTHY, container="sidecar"), "Count"),  # not the trainer
        (status(exit_codes.DRAINED, init=True), "Ignore"),  # init containers count too
        (status(None), "Count"),
    ],
)
def test_the_shipped_policy_as_kubernetes_applies_it(pod: dict, action: str) -> None:
    assert match_policy(POLICY, pod) == action


def test_exit_code_zero_and_unknown_actions_never_match() -> None:
    policy = {"rules": [
        {"action": "Retry", "onExitCodes": {"operator": "In", "values": [3]}},  # unknown
        {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [3]}},
    ]}  # fmt: skip
    assert match_policy(policy, status(3)) == "Count"  # the unknown action is skipped
    assert match_policy(policy, status(0)) == "Count"  # success is never a match
    assert match_policy(policy, status(4)) == "FailJob"
    assert match_policy(None, status(87)) == "Count"


def test_the_example_holds_the_tables_policy_and_passes_the_apis_rules() -> None:
    """Upstream validation of podFailurePolicy (kubernetes-client/python,
    kubernetes/docs/V1PodFailurePolicyOnExitCodesRequirement.md and
    V1PodFailurePolicyRule.md): at most 20 rules, onExitCodes or onPodConditions (not both),
    values ordered, unique, 1 to 255 of them, no 0 with In, containerName a container of
    the template, restartPolicy Never."""
    job = yaml.safe_load(EXAMPLE.read_text())
    spec = job["spec"]
    assert spec["podFailurePolicy"] == exit_codes.pod_failure_policy(container="trainer")
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    names = {c["name"] for c in spec["template"]["spec"]["containers"]}
    rules = spec["podFailurePolicy"]["rules"]
    assert 1 <= len(rules) <= 20
    for rule in rules:
        assert rule["action"] in ("Ignore", "Count", "FailJob")
        assert ("onExitCodes" in rule) != ("onPodConditions" in rule)
        req = rule.get("onExitCodes")
        if req:
            vals = req["values"]
            assert vals == sorted(set(vals)) and 1 <= len(vals) <= 255
            assert not (req["operator"] == "In" and 0 in vals)
            assert req.get("containerName", "trainer") in names
    spared = [r for r in rules if r["action"] == "Ignore" and "onExitCodes" in r]
    assert spared[0]["onExitCodes"]["values"] == list(exit_codes.spared())


def test_docs_show_the_same_policy() -> None:
    text = (REPO / "docs/controller.md").read_text()
    codes = ", ".join(str(c) for c in exit_codes.spared())
    assert f"operator: In, values: [{codes}]" in text


def test_env_expansion_as_kubernetes_does_it() -> None:
    env = {"A": "/m/1"}
    assert _expand("$(A)/run/report.json", env) == "/m/1/run/report.json"
    assert _expand("$$(A) $(B)", env) == "$(A) $(B)"  # escaped; unknown stays as written


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    m = Machine("lab-gpu-1", tmp_path / "m", kubeconfig=tmp_path / "kubeconfig",
                agent_config={"agent": {}})  # fmt: skip
    m.create()
    return m


def tool(m: Machine, *argv: str) -> subprocess.CompletedProcess[str]:
    env = cli_env({**m.host_env(), "PATH": f"{m.bin}{os.pathsep}{os.environ['PATH']}"})
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kind", sorted(faults.GPU_FAULTS))
def test_gpu_faults_print_a_line_the_parser_reads_for_that_gpu(machine: Machine,
                                                               kind: str) -> None:  # fmt: skip
    line = faults.GPU_FAULTS[kind](machine, 3)
    ev = parse_line(line)
    assert ev is not None and ev.uptime_s is not None and ev.uptime_s > 1.21  # after load
    assert ev.bus_id is not None
    assert ev.bus_id.lower() == machine.fake_node().gpu(3).pci_bus_id[4:].lower()
    assert line in machine.kmsg.read_text()
    assert ev.code == {"xid48": 48, "xid79": 79, "row-remap-failure": 64}[kind]


def test_reset_and_reboot_tools_act_on_the_fakes(machine: Machine) -> None:
    faults.xid48(machine, 3)
    faults.xid79(machine, 5)
    assert tool(machine, "nvidia-smi", "--gpu-reset", "-i", "5").returncode == 255  # lost
    done = tool(machine, "nvidia-smi", "--gpu-reset", "-i", "3")
    assert done.returncode == 0, done.stderr
    node = FakeNode.load(machine.scenario)
    assert node.gpu(3).ecc_volatile_uncorrected == 0 and node.gpu(3).ecc_aggregate_uncorrected
    assert node.gpu(5).lost
    assert "<nvidia_smi_log>" in tool(machine, "nvidia-smi", "-q", "-x").stdout
    # The shipped agent config reboots through nsenter into PID 1's systemctl.
    r = tool(machine, "nsenter", "--target", "1", "--mount", "--", "systemctl", "reboot")
    assert r.returncode == 0, r.stderr
    assert machine.reboot_requested()
    old = machine.boot_id
    machine.reboot()
    machine.stop_agent()
    assert machine.boot_id != old and not machine.reboot_requested()
    assert not FakeNode.load(machine.scenario).gpu(5).lost
    assert "Xid" not in machine.kmsg.read_text()  # a fresh boot's log


def test_follower_reads_the_parts_event_logs(tmp_path: Path) -> None:
    ev = tmp_path / "events"
    ev.mkdir()
    lines = [
        {"ts": 100.0, "kind": "finding.set", "source": "agent", "node": "n1",
         "data": {"code": "XID_48", "status": "FAILED", "component": "gpu:3",
                  "action": "RESET_GPU"}},
        {"ts": 101.0, "kind": "node.state", "source": "controller", "node": "n1",
         "data": {"from": "HEALTHY", "to": "DRAINING", "reason": "fatal"}},
        {"ts": 102.0, "kind": "remediation", "source": "controller", "node": "n1",
         "data": {"action": "RESET_GPU", "result": "started"}},
        {"ts": 103.0, "kind": "job.restart", "source": "training", "job": "j",
         "data": {"lost_steps": 1}},
        {"ts": 104.0, "kind": "remediation", "source": "controller", "node": "n2",
         "data": {"action": "NONE", "result": "skipped",
                  "reason": "held: disruption budget of pool default in use (1/1)"}},
        {"ts": 105.0, "kind": "remediation", "source": "controller", "node": "n3",
         "data": {"action": "NONE", "result": "skipped",
                  "reason": "excluded by label: observed, never acted on"}},
    ]  # fmt: skip
    (ev / "a.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"torn')
    f = Follower(ev)
    f.fault_ts = 99.0
    f.read_logs()
    f.read_logs()  # nothing read twice; the torn line waits
    assert [e["event"] for e in f.timeline()] == ["finding", "state", "remediation",
                                                  "job.restart", "held"]  # fmt: skip
    assert f.timeline()[0]["t_s"] == 1.0
    held = f.timeline()[-1]
    assert (held["node"], held["detail"]) == ("n2", "disruption budget of pool default in use "
                                              "(1/1)")  # fmt: skip
    assert f.states == {"n1": "DRAINING"} and f.left_service == {"n1"}
    assert f.steps == [("n1", "RESET_GPU")] and f.lost_steps == [1]


def test_the_agents_answer_is_said_once() -> None:
    """The agent's `started` answer names what it does; the timeline never says "REBOOT
    started: REBOOT started"."""
    from gpuvigil.core import wire

    f = Follower(Path("/nonexistent"))
    node = {"metadata": {"name": "n1", "annotations": {}}, "status": {}, "spec": {}}
    f._node("n1", node)
    for detail in ("rebooting from boot 1234abcd", "REBOOT started", ""):
        res = {"id": "r", "action": "REBOOT", "result": "started", "detail": detail, "at": detail}
        node["metadata"]["annotations"] = {wire.RESULT_ANNOTATION: json.dumps(res)}
        f._node("n1", node)
    assert [e.detail for e in f.entries] == [
        "REBOOT started: rebooting from boot 1234abcd",
        "REBOOT started",
        "REBOOT started",
    ]


def test_the_lab_command_says_what_is_missing(tmp_path: Path) -> None:
    env = cli_env({"GPUVIGIL_KUBE_BIN": str(tmp_path / "nothing")})
    r = subprocess.run([sys.executable, "-m", "gpuvigil", "lab", "--fault", "xid48"],
                       env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2
    assert "make kube" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    bad = subprocess.run([sys.executable, "-m", "gpuvigil", "lab", "--fault", "meteor"],
                         env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "xid48" in bad.stderr


def test_a_container_kill_reaches_children_orphaned_before_it(tmp_path: Path) -> None:
    """torchrun's workers run in sessions of their own: when torchrun dies first they are
    init's, and only what `remember` saw before still finds them (as a cgroup would)."""
    import signal
    import time

    from gpuvigil.lab.procs import Proc

    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)'], start_new_session=True); time.sleep(60)"
    )
    p = Proc([sys.executable, "-c", code], log=tmp_path / "p.log")
    deadline = time.monotonic() + 30
    while not p._seen and time.monotonic() < deadline:
        p.remember()
        time.sleep(0.1)
    ((child, _),) = p._seen
    os.kill(p.pid, signal.SIGKILL)
    p.popen.wait(5)
    p.kill_all()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or state == "Z"


def test_figures_from_the_timeline() -> None:
    from gpuvigil.lab.run import figures

    t = [
        {"t_s": -3.0, "event": "block", "node": "n2", "detail": ""},
        {"t_s": 0.0, "event": "fault", "node": "n2", "detail": ""},
        {"t_s": 1.0, "event": "block", "node": "n2", "detail": "taint added"},
        {"t_s": 30.0, "event": "job_resumed", "node": "n1", "detail": ""},
        {"t_s": 20.0, "event": "job.restart", "node": "n1", "detail": ""},
        {"t_s": 40.0, "event": "state", "node": "n2", "detail": "VALIDATING -> HEALTHY: validated"},
    ]
    # no job.attempt in this timeline: no gang restart, so no restart phases
    assert figures(t, "n2", gpus_out=8) == {
        "blocked_s": 1.0, "job_resumed_s": 20.0, "back_in_service_s": 40.0,
        "gpu_isolated_s": None, "gpus_out": 8, "restart_phases": None}  # fmt: skip
    assert figures(t[:2], "n2") == {"blocked_s": None, "job_resumed_s": None,
                                    "back_in_service_s": None, "gpu_isolated_s": None,
                                    "gpus_out": None, "restart_phases": None}  # fmt: skip
    iso = [*t[1:2], {"t_s": 9.5, "event": "gpu", "node": "n2", "detail": "gpu:7 isolated: x"}]
    assert figures(iso, "n2", gpus_out=1)["gpu_isolated_s"] == 9.5


def _node(name: str, *, alloc: int = 8, isolation: dict | None = None, cordoned: bool = False,
          blocked: bool = False) -> dict:  # fmt: skip
    from gpuvigil.core import wire
    from gpuvigil.platform.isolation import ISOLATION_ANNOTATION

    ann = {ISOLATION_ANNOTATION: json.dumps(isolation)} if isolation else {}
    taints = [{"key": wire.UNHEALTHY_TAINT, "effect": "NoSchedule"}] if blocked else []
    return {"metadata": {"name": name, "annotations": ann},
            "spec": {"unschedulable": cordoned, "taints": taints},
            "status": {"capacity": {"nvidia.com/gpu": "8"},
                       "allocatable": {"nvidia.com/gpu": str(alloc)}}}  # fmt: skip


def test_the_follower_counts_the_gpus_out_of_service() -> None:
    """One GPU the device plugin withholds or the controller isolates costs 1; a node
    blocked, cordoned or removed costs its 8; the figure is the most at once since the
    fault, and the timeline says what changed."""
    f = Follower(Path("/nonexistent"))
    f.read_nodes([_node("n1"), _node("n2", alloc=7)], ["n1", "n2"])
    assert f.gpus_out == 0  # before the fault: not counted
    f.fault_ts = 1.0
    rec = {"node": "n2", "gpu_uuid": "GPU-7", "index": 7, "since": "2026-12-03T11:00:00Z",
           "step": "isolated", "reason": "ROW_REMAP_FAILURE needs a new GPU"}  # fmt: skip
    f.read_nodes([_node("n1", alloc=7), _node("n2", isolation=rec)], ["n1", "n2"])
    assert f.gpus_out == 2 and f.isolated == {"n2": "isolated"}
    f.read_nodes([_node("n1", cordoned=True), _node("n2")], ["n1", "n2"])
    assert f.gpus_out == 8 and f.isolated == {}
    f.read_nodes([_node("n2", blocked=True)], ["n1", "n2"])  # n1 deleted, n2 blocked
    assert f.gpus_out == 16
    said = [(e.event, e.node, e.detail.split(" (")[0]) for e in f.entries]
    assert said == [
        ("allocatable", "n1", "nvidia.com/gpu 8 -> 7 of 8"),
        ("allocatable", "n2", "nvidia.com/gpu 7 -> 8 of 8"),
        ("gpu", "n2", "gpu:7 isolated: ROW_REMAP_FAILURE needs a new GPU"),
        ("cordon", "n1", "spec.unschedulable true"),
        ("allocatable", "n1", "nvidia.com/gpu 7 -> 8 of 8"),
        ("gpu", "n2", "gpu:7 released"),
        ("node_removed", "n1", "the Node object was deleted"),
        ("block", "n2", "taint gpuvigil.io/unhealthy added"),
    ]
    f.next_fault()
    assert f.gpus_out == 0


def test_the_device_plugin_marks_a_gpu_unhealthy_until_it_restarts(machine: Machine) -> None:
    """As NVIDIA's plugin: a critical Xid on a GPU marks it Unhealthy for good, the
    application errors and the DP_DISABLE_HEALTHCHECKS Xids do not, and a restart (the
    machine's reboot) marks every GPU healthy and reads only later events."""
    from gpuvigil.fakes.gpu import FakeXid
    from gpuvigil.lab.device_plugin import DevicePlugin

    plugin = DevicePlugin(machine, skip_xids=(48,))
    faults.xid79(machine, 5)  # before the plugin starts: not its event
    plugin.start()
    uuids = [g.uuid for g in machine.fake_node().gpus]
    node = machine.fake_node()
    node.gpu(1).xids.append(FakeXid(13))  # an application error
    machine.save(node)
    faults.xid48(machine, 2)  # skipped, as DP_DISABLE_HEALTHCHECKS=48
    assert not plugin.check() and plugin.healthy(uuids) == uuids
    faults.row_remap_failure(machine, 7)
    assert plugin.check() and plugin.unhealthy == {uuids[7]}
    assert not plugin.check() and plugin.healthy(uuids) == uuids[:7]  # for good
    plugin.restart()
    assert plugin.healthy(uuids) == uuids and not plugin.check() and plugin.restarts == 1


def test_faults_run_in_an_order_that_keeps_the_lab(tmp_path: Path) -> None:
    from gpuvigil.lab.run import LabError, check_faults

    check_faults(["rank-hang", "agent-stop", "xid48", "xid79", "row-remap-failure"])
    for bad, says in ((["row-remap-failure", "xid48"], "last"), (["xid48", "meteor"], "meteor"),
                      ([], "no fault")):  # fmt: skip
        with pytest.raises(LabError, match=says):
            check_faults(bad)
    env = cli_env({"GPUVIGIL_KUBE_BIN": str(tmp_path / "nothing")})
    r = subprocess.run([sys.executable, "-m", "gpuvigil", "lab", "--fault", "row-remap-failure",
                        "--fault", "xid48"], env=env, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 2 and "give it last" in r.stderr


def test_each_fault_reports_on_its_own_events_and_the_follower_keeps_the_parts(
    tmp_path: Path,
) -> None:
    """The second fault's report reads what the logs gained after the first (whole lines);
    its timeline starts empty while the node states and the read positions carry over."""
    from gpuvigil.lab.result import log_offsets, slice_logs

    ev = tmp_path / "events"
    ev.mkdir()
    first = {"ts": 1.0, "kind": "node.state", "node": "n1",
             "data": {"from": "HEALTHY", "to": "DRAINING", "reason": "x"}}  # fmt: skip
    second = {"ts": 2.0, "kind": "job.restart", "node": "n2", "data": {"lost_steps": 3}}
    (ev / "controller.jsonl").write_text(json.dumps(first) + "\n")
    f = Follower(ev)
    f.read_logs()
    at = log_offsets(ev)
    with (ev / "controller.jsonl").open("a") as fh:
        fh.write(json.dumps(second) + "\n" + '{"torn')
    (ev / "training.jsonl").write_text(json.dumps(second) + "\n")  # a log born later
    out = slice_logs(ev, at, tmp_path / "fault-2")
    assert (out / "controller.jsonl").read_text() == json.dumps(second) + "\n"
    assert (out / "training.jsonl").read_text() == json.dumps(second) + "\n"
    f.next_fault()
    assert f.entries == [] and f.left_service == set() and f.states == {"n1": "DRAINING"}
    f.read_logs()
    assert f.lost_steps == [3, 3] and [e.event for e in f.entries] == ["job.restart"] * 2
