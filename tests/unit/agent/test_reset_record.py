"""A reset cures what it can (issue #11 item 2): the remediator records each successful GPU
reset as a typed fact (`GpuReset`), and the kernel-log rule clears the reset-class Xids
logged before it, on the streamed path (the agent's KernelWatch) and the polled path (the
one-shot `kernel_log` check) alike. The whole loop on a real kube-apiserver with the real
controller is tests/integration/agent/test_agent_reset_cures.py."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuvigil.core.findings import Finding, NodeReport, Status
from gpuvigil.core.wire import RemediationRequest, RemediationResult
from gpuvigil.node import sweep
from gpuvigil.node.agent import Agent, AgentConfig
from gpuvigil.node.checks import REGISTRY, CheckContext, CheckSpec, Needs, Readout, run_check
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuReading, GpuReset, GpuResets
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.kernel_watch import KernelStreamConfig, KernelWatch
from gpuvigil.node.metrics import build
from gpuvigil.node.scheduler import Scheduler
from gpuvigil.node.sinks import SinkWorker
from gpuvigil.node.sinks.remediation import RemediationConfig, Remediator

BUS = "00000000:3B:00.0"


def request(rid: str, action: str, gpus: tuple[int, ...]) -> RemediationRequest:
    return RemediationRequest(id=rid, action=action, gpus=gpus, at=datetime.now(UTC))


def inventory() -> GpuInventory:
    gpus = (
        GpuReading(index=3, pci_bus_id=BUS, architecture="Hopper"),
        GpuReading(index=4, pci_bus_id="00000000:4C:00.0", architecture="Hopper"),
    )
    return GpuInventory("nvml", datetime.now(UTC), gpus=gpus, count=2)


def xid_line(code: int, *, ago_s: float) -> str:
    at = datetime.now(UTC) - timedelta(seconds=ago_s)
    return (
        f"{at.strftime('%Y-%m-%dT%H:%M:%S,%f+00:00')} NVRM: Xid (PCI:0000:3b:00): {code}, "
        "pid=77, name=python3, An uncorrectable double bit error (DBE) has been detected"
    )


def xids(findings: list[Finding]) -> set[tuple[str, str]]:
    return {(f.code, f.component) for f in findings if f.code.startswith("XID")}


def ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


# --- the remediator records the reset before it says succeeded -------------------------------


def test_a_successful_reset_is_recorded_before_succeeded_is_answered(fake_bin, tmp_path):
    fake_bin("nvidia-smi", "#!/bin/sh\nexit 0\n")
    env = {"PATH": f"{fake_bin.dir}:{os.environ['PATH']}"}
    (tmp_path / "boot").write_text("boot-a\n")
    order: list[str] = []
    recorded: list[GpuReset] = []

    def on_reset(reset: GpuReset) -> None:
        recorded.append(reset)
        order.append("recorded")

    rem = Remediator(RemediationConfig(boot_id_path=tmp_path / "boot"), env=env,
                     on_reset=on_reset)  # fmt: skip
    answers: list[RemediationResult] = []

    def answer(a: RemediationResult) -> None:
        answers.append(a)
        order.append(a.result)

    before = datetime.now(UTC)
    rem.handle(request("r1", "RESET_GPU", (3,)), None, answer)
    deadline = time.monotonic() + 5
    while len(answers) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert order == ["started", "recorded", "succeeded"]
    (reset,) = recorded
    assert reset.gpus == (3,) and reset.boot_id == "boot-a"
    assert before <= reset.at <= answers[-1].at


@pytest.mark.parametrize(("req", "script"), [
    (("r2", "RESET_GPU", (3,)), "#!/bin/sh\nexit 1\n"),  # reset failed
    (("r3", "REBOOT", ()), "#!/bin/sh\nexit 0\n"),  # not a GPU reset
])  # fmt: skip
def test_nothing_is_recorded_for_a_failed_reset_or_a_reboot(fake_bin, tmp_path, req, script):
    fake_bin("nvidia-smi", script)
    fake_bin("systemctl", script)
    env = {"PATH": f"{fake_bin.dir}:{os.environ['PATH']}"}
    recorded: list[GpuReset] = []
    rem = Remediator(RemediationConfig(boot_id_path=tmp_path / "boot"), env=env,
                     on_reset=recorded.append)  # fmt: skip
    answers: list[RemediationResult] = []
    rem.handle(request(*req), None, answers.append)
    time.sleep(0.5)
    assert recorded == []


# --- the streamed path: the agent's KernelWatch ----------------------------------------------


def stream(tmp_path: Path, *lines: str, boot_id: str = "boot-a") -> KernelWatch:
    log = tmp_path / "kern.log"
    if not log.exists():
        log.write_text("".join(f"{ln}\n" for ln in lines))
    random = tmp_path / "root/proc/sys/kernel/random"
    random.mkdir(parents=True, exist_ok=True)
    (random / "boot_id").write_text(f"{boot_id}\n")
    ctx = CheckContext(config=NodeConfig(), root=tmp_path / "root", env={"PATH": ""})
    ctx.facts.put(inventory())
    cfg = KernelStreamConfig(source="file", file=log)
    w = KernelWatch(cfg, ctx=ctx, changed=threading.Event(), metrics=None,
                    state_dir=tmp_path / "state")  # fmt: skip
    w.start()
    assert w.ready.wait(10)
    return w


def test_stream_clears_the_xid_a_reset_of_its_gpu_cured(tmp_path: Path) -> None:
    w = stream(tmp_path, xid_line(48, ago_s=60))
    try:
        assert xids(w.snapshot(time.monotonic())[0]) == {("XID_48", "gpu:3")}
        w.record_reset(GpuReset(at=ago(600), gpus=(3,)))  # before the Xid: cures nothing
        w.record_reset(GpuReset(at=ago(1), gpus=(4,)))  # another GPU
        assert xids(w.snapshot(time.monotonic())[0]) == {("XID_48", "gpu:3")}
        w.record_reset(GpuReset(at=ago(1), gpus=(3,)))
        assert xids(w.snapshot(time.monotonic())[0]) == set()
    finally:
        w.stop()


def test_a_reset_does_not_clear_what_needs_a_reboot(tmp_path: Path) -> None:
    w = stream(tmp_path, xid_line(79, ago_s=60))
    try:
        w.record_reset(GpuReset(at=ago(1)))  # every GPU
        assert xids(w.snapshot(time.monotonic())[0]) == {("XID_79", "gpu:3")}
    finally:
        w.stop()


def test_the_reset_outlives_an_agent_restart_in_the_same_boot_only(tmp_path: Path) -> None:
    w = stream(tmp_path, xid_line(48, ago_s=60))
    w.record_reset(GpuReset(at=ago(1), gpus=(3,)))
    w.stop()
    again = stream(tmp_path)  # a new agent reads the whole boot's log again
    try:
        assert xids(again.snapshot(time.monotonic())[0]) == set()
    finally:
        again.stop()
    rebooted = stream(tmp_path, boot_id="boot-b")  # same file, another boot id
    try:
        assert rebooted.ctx.facts.get(GpuResets) is None
    finally:
        rebooted.stop()


# --- the polled path: the one-shot kernel_log check ------------------------------------------


def test_the_polled_check_reads_the_same_reset_fact(tmp_path: Path) -> None:
    sweep.load_checks()
    log = tmp_path / "kern.log"
    log.write_text(xid_line(48, ago_s=60) + "\n")
    ctx = CheckContext(config=NodeConfig.model_validate({"kernel_log": {"file": str(log)}}),
                       env={"PATH": ""})  # fmt: skip
    ctx.facts.put(inventory())
    assert xids(run_check(REGISTRY["kernel_log"], ctx)[0]) == {("XID_48", "gpu:3")}
    ctx.facts.put(GpuResets((GpuReset(at=ago(1), gpus=(3,)),)))
    assert xids(run_check(REGISTRY["kernel_log"], ctx)[0]) == set()


# --- the agent answers only once its sinks hold the cured verdict ----------------------------


class _Sink:
    name = "memory"

    def __init__(self) -> None:
        self.reports: list[NodeReport] = []

    def publish(self, report: NodeReport) -> None:
        self.reports.append(report)

    def close(self) -> None:
        pass


def test_after_reset_reruns_the_gpu_check_and_waits_for_the_publish(tmp_path):
    runs: list[datetime] = []

    def gpu(ctx: CheckContext) -> Readout:
        runs.append(datetime.now(UTC))
        return Readout((inventory(),))

    spec = CheckSpec("gpu", gpu, "fast", interval_s=3600.0, timeout_s=5.0, needs=Needs(),
                     description="the GPUs")  # fmt: skip
    ctx = CheckContext(config=NodeConfig(expect_gpus=2), root=tmp_path, env={"PATH": ""})
    sched = Scheduler([spec], ctx)
    sink = _Sink()
    cfg = AgentConfig(publish_interval_s=3600.0, kernel_log=KernelStreamConfig(enabled=False))
    agent = Agent(node="n1", config=cfg, scheduler=sched, kernel=None,
                  workers=[SinkWorker(sink)], metrics=build(CollectorRegistry()))  # fmt: skip
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while not sink.reports and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(runs) == 1 and sink.reports
        reset = GpuReset(at=ago(0.5), gpus=(3,))
        assert agent.after_reset(reset, timeout_s=10)
        assert len(runs) == 2 and runs[1] > reset.at  # the GPUs were read again after it
        assert sink.reports[-1].generated_at > runs[1]
        assert ctx.facts.get(GpuResets) == GpuResets((reset,))
        assert all(f.status is Status.OK for f in sink.reports[-1].findings)
    finally:
        agent.stop()
        loop.join(10)
