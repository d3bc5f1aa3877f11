"""A reset cures what it can, across the seam (issue #11 item 2), on a real kube-apiserver.

The real controller (in this process, on the real Kubernetes adapter) sees Xid 48 on a
fake GPU and asks for RESET_GPU through the Node annotation; the real agent (a subprocess
with its Kubernetes sink) resets the fake GPU with its real remediator, records the reset
as a typed fact of the kernel-log rule, and its real stream path reports the Xid cleared;
the controller validates and returns the node to service. No REBOOT is ever asked for.
Without the reset record the Xid stays FAILED, validation fails and the ladder asks for
a REBOOT: this test fails.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import agent_helpers
import pytest
from agent_helpers import wait_until

from gpuvigil.core import wire
from gpuvigil.fakes import faults
from gpuvigil.fakes.faults import Fault

start_agent = agent_helpers.start_agent  # the fixture
pytestmark = pytest.mark.realparts
# GPU 0 of the fake node sits at 0000:18:00.0 (an H100 DBE as the driver prints it).
XID48 = (
    "[ {t:.6f}] NVRM: Xid (PCI:0000:18:00): 48, pid=2462, name=python3, An uncorrectable "
    "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
    "subpartition 0."
)


def annotations(kube: Any, node: str) -> dict[str, str]:
    return kube.core().read_node(node).metadata.annotations or {}


def test_xid48_is_cured_by_the_reset_and_the_node_returns_without_a_reboot(
    start_agent, kube, tmp_path: Path, fake_bin
) -> None:
    from gpuvigil.platform.clusters.k8s_preflight import label_value
    from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings
    from gpuvigil.platform.controller import Controller, ControllerConfig
    from gpuvigil.platform.policy.values import PolicyConfig
    from gpuvigil.platform.safety import SafetyConfig
    from gpuvigil.platform.state import State, decode_record

    kube.ensure_preflight_template()  # the controller's preflight runs come from it
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(f"gpu-reset-{tag}", labels={"fleet": tag})
    resets = tmp_path / "nvidia-smi.calls"
    # The agent's reset command is a fake nvidia-smi that resets the fake GPUs it reads.
    fake_bin(
        "nvidia-smi",
        f'#!/bin/sh\necho "$@" >> {resets}\nexec {sys.executable} -m fake_gpu_reset "$@"\n',
    )
    # The controller signs its requests; the agent trusts its public key (docs/security.md).
    signer, pub = agent_helpers.controller_key(tmp_path)
    key = tmp_path / "controller.key"
    key.write_bytes(signer.private_pem())
    a = agent_helpers.start_kube_agent(
        start_agent, node, kubeconfig=kube.kubeconfig, trust=pub,
        remediation={"boot_id_path": str(tmp_path / "boot_id")}, wait_ready=False,
    )  # fmt: skip
    # The kubernetes client alone takes seconds of CPU to import: give a loaded machine time.
    wait_until(a.state_file.exists, 90, "the agent's first report")
    # The fault: a DBE on GPU 0, seen by NVML (volatile ECC, a pending row remap) and in
    # the kernel log (Xid 48).
    gpus = a.machine.nvml()
    faults.apply(gpus, Fault.ECC_UNCORRECTABLE, gpu=0)
    a.machine.save_nvml(gpus)
    # Stamped in this machine's uptime, as the kernel would (the fake tree has no /proc).
    a.machine.log(XID48.format(t=time.clock_gettime(time.CLOCK_BOOTTIME) - 2.0))
    wait_until(
        lambda: {("kernel_log", "XID_48"), ("gpu", "ECC_UNCORRECTED_VOLATILE")} <= a.codes(),
        20,
        "Xid 48 and the ECC error in the agent's report",
    )

    settings = KubernetesSettings(node_selector=f"fleet={tag}", eviction_grace_s=0,
                                  signing_key_file=str(key), pool_gpus={"default": 8})  # fmt: skip
    cluster = KubernetesCluster(settings, api_client=kube.api_client())
    ctl = Controller(
        cluster,
        config=ControllerConfig(
            # drain at once: this test is about the reset record, not the breaker's wait
            policy=PolicyConfig(fatal_grace_s=0),
            safety=SafetyConfig(max_disrupted=5, max_disrupted_percent=100),
        ),
    )
    states: list[State] = []
    end = time.monotonic() + 120
    while time.monotonic() < end:
        ctl.reconcile()
        ann = annotations(kube, node)
        rec = decode_record(ann.get("gpuvigil.io/state"))
        if rec is not None and (not states or states[-1] is not rec.state):
            states.append(rec.state)
        if rec is not None and rec.state is State.HEALTHY and State.VALIDATING in states:
            break
        if rec is not None and rec.state is State.VALIDATING:
            # No kubelet runs the controller's preflight pod here: it passes as one would.
            verdict = {"result": "pass", "summary": "ok"}
            kube.run_pods("gpuvigil", node=node, exit_code=0, message=json.dumps(verdict),
                          selector="app.kubernetes.io/name=gpuvigil-preflight,"
                                   f"gpuvigil.io/node={label_value(node)}")  # fmt: skip
        time.sleep(0.5)

    result = json.loads(annotations(kube, node).get(wire.RESULT_ANNOTATION) or "null")
    calls = resets.read_text().splitlines() if resets.exists() else []
    assert states[-1] is State.HEALTHY, (states, result, a.codes(), a.log()[-3000:])
    assert State.REMEDIATING in states
    assert calls == ["--gpu-reset -i 0"]  # one reset, of the GPU the Xid named
    assert result is not None and result["action"] == "RESET_GPU", result
    assert result["result"] == "succeeded"
    # The agent's own verdict: cured by the reset, not by a reboot (no REBOOT asked for).
    report = a.report()
    failed = [f["code"] for f in report["findings"] if f["status"] == "FAILED"]
    assert failed == [], report["findings"]  # the lifetime ECC count stays, as a WARNING
    assert not [f for f in report["findings"] if f["code"].startswith("XID")]
    assert "REBOOT" not in {
        json.loads(v).get("action")
        for k, v in annotations(kube, node).items()
        if k == wire.REQUEST_ANNOTATION
    }
