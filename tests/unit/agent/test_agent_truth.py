"""The agent tells the truth (issue #13 item 5): output cut at the bound is "could not
tell", output followed by death on a signal is CHECK_ERROR, `npd-plugin --family` fails
closed, and /healthz fails once a sink has kept failing past its grace. (The process tree
at the deadline: tests/unit/io/test_exec.py; the kernel-log file that is truncated,
replaced, deleted or flooded: test_kmsg_stream.py; a mistyped NODE_NAME on a real
kube-apiserver: tests/integration/agent/test_agent_liveness.py.)"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from gpuvigil.commands import npd
from gpuvigil.core import codes
from gpuvigil.core.findings import Action, Finding, NodeReport, Status
from gpuvigil.fakes import gpu as fake_gpu
from gpuvigil.fakes import nvidia_smi as fake_smi
from gpuvigil.fakes.gpu import SCENARIO_ENV
from gpuvigil.node import sweep
from gpuvigil.node.agent import Agent, AgentConfig
from gpuvigil.node.checks import REGISTRY, CheckContext, run_check
from gpuvigil.node.checks.gpu import nvidia_smi
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.kernel_watch import KernelStreamConfig
from gpuvigil.node.metrics import build
from gpuvigil.node.scheduler import Scheduler
from gpuvigil.node.sinks import SinkWorker

HEALTHY_DCGM = json.dumps({"body": {"Overall Health": {"value": "Healthy"}}})


def test_a_healthy_dcgmi_answer_padded_past_the_cap_is_could_not_tell(fake_bin) -> None:
    sweep.load_checks()
    pad = "head -c 9000000 /dev/zero | tr '\\0' ' '"  # past the runner's 8 MiB bound
    fake_bin("dcgmi", f"#!/bin/sh\necho '{HEALTHY_DCGM}'\n{pad}\n")
    ctx = CheckContext(config=NodeConfig(), env={"PATH": f"{fake_bin.dir}:/usr/bin:/bin"})
    findings, run = run_check(REGISTRY["dcgm_health"], ctx)
    assert run.status == "FAILED"
    assert [(f.code, f.could_not_run) for f in findings] == [("CHECK_ERROR", True)]
    assert findings[0].evidence["output_truncated"] is True


def test_nvidia_smi_that_prints_everything_then_dies_is_no_reading(fake_bin, tmp_path) -> None:
    xml = tmp_path / "q.xml"
    xml.write_text(fake_smi.render_xml(fake_gpu.make_node(8)))
    fake_bin("nvidia-smi", f"#!/bin/sh\ncat {xml}\nkill -SEGV $$\n")
    ctx = CheckContext(config=NodeConfig(), env={"PATH": f"{fake_bin.dir}:/usr/bin:/bin"})
    inv, failure = nvidia_smi.collect(ctx, timeout_s=10)
    assert inv is None and failure is not None
    assert failure.code == "CHECK_ERROR" and "SIGSEGV" in failure.message


# --- npd-plugin --family fails closed ---------------------------------------------------------

NO_DRIVER = Finding(check="gpu", status=Status.FAILED, code="DRIVER_UNAVAILABLE",
                    action=Action.REBOOT, message="NVML cannot initialise")  # fmt: skip
ECC = Finding(check="gpu", status=Status.FAILED, code="ECC_UNCORRECTED_VOLATILE",
              component="gpu:2", action=Action.RESET_GPU)  # fmt: skip
HOT = Finding(check="gpu", status=Status.WARNING, code="THERMAL_SLOWDOWN", component="gpu:1")


@pytest.mark.parametrize(("findings", "family", "want"), [
    ((NO_DRIVER,), codes.GPU_MEMORY, 2),  # no driver: memory unknown, never healthy
    ((NO_DRIVER, ECC), codes.GPU_MEMORY, 1),  # a definite failure of the family wins
    ((HOT,), codes.GPU_MEMORY, 0),  # another family's problem is not this condition's
    ((NO_DRIVER,), codes.HEALTH_CHECK, 2),  # the health-check condition: as without --family
    ((), codes.GPU_MEMORY, 0),
])  # fmt: skip
def test_family_verdicts(findings, family, want) -> None:
    report = npd.only_family(NodeReport(node="n", findings=findings), family)
    assert npd.verdict(report, family=family) == want


def test_npd_plugin_family_without_a_driver_is_unknown(run_cli, tmp_path) -> None:
    """The shipped NPD config's form: `npd-plugin gpu --family GPUMemoryError`."""
    node = fake_gpu.make_node(8)
    node.driver_loaded = False
    scenario = tmp_path / "nvml.json"
    node.save(scenario)
    cfg = tmp_path / "gpuvigil.yaml"
    cfg.write_text("node:\n  expect_gpus: 8\n  gpu:\n    nvml_module: gpuvigil.fakes.nvml\n")
    env = {SCENARIO_ENV: str(scenario), "PATH": os.environ["PATH"]}
    p = run_cli("npd-plugin", "gpu", "--family", "GPUMemoryError", "--config", str(cfg), env=env)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stdout.startswith("DRIVER_UNAVAILABLE")


# --- /healthz fails when a sink keeps failing -------------------------------------------------


class _Broken:
    name = "kubernetes"

    def publish(self, report: NodeReport) -> None:
        raise RuntimeError('nodes "gpu-tpyo-7" not found')

    def close(self) -> None:
        pass


def test_healthz_fails_after_the_grace_when_a_sink_keeps_failing(tmp_path) -> None:
    ctx = CheckContext(config=NodeConfig(expect_gpus=0), root=tmp_path, env={"PATH": ""})
    cfg = AgentConfig(sink_failure_grace_s=0.5, publish_interval_s=0.1,
                      kernel_log=KernelStreamConfig(enabled=False))  # fmt: skip
    worker = SinkWorker(_Broken(), backoff_initial_s=0.05, backoff_max_s=0.1)
    agent = Agent(node="gpu-tpyo-7", config=cfg, scheduler=Scheduler([], ctx), kernel=None,
                  workers=[worker], metrics=build(CollectorRegistry()))  # fmt: skip
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 5
        while worker.failing_since is None and time.monotonic() < deadline:
            time.sleep(0.02)
        ok, body = agent.health()
        assert ok, body  # failing, but within the grace: an API server restart is survived
        while agent.health()[0] and time.monotonic() < deadline + 5:
            time.sleep(0.05)
        ok, body = agent.health()
        assert not ok and body["sinks_failing_s"]["kubernetes"] >= 0.5
        assert "not found" in body["sinks"]["kubernetes"]
    finally:
        agent.stop()
        loop.join(10)
