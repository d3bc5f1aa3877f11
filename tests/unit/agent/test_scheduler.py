"""The scheduler's isolation: deadlines, no relaunch on top of a stuck check, staleness."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import agent_unit_fixtures

from gpuvigil.core.findings import Finding, Status
from gpuvigil.node.checks import CheckContext, Needs
from gpuvigil.node.scheduler import Scheduler

register = agent_unit_fixtures.register  # the fixture


def ok_check(name: str):
    def fn(ctx: CheckContext) -> list[Finding]:
        return [Finding(check=name, status=Status.OK, code="CHECK_DISABLED")][:0]

    return fn


def wait_for(pred, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def by_check(findings: list[Finding], name: str) -> list[Finding]:
    return [f for f in findings if f.check == name]


def test_hung_check_times_out_is_not_relaunched_and_blocks_nothing(register, tmp_path: Path):
    release = threading.Event()
    calls = {"hang": 0, "quick": 0}

    def hang(ctx):
        calls["hang"] += 1
        release.wait(30)
        return []

    def quick(ctx):
        calls["quick"] += 1
        return [Finding(check="t_quick", status=Status.WARNING, code="TEMPERATURE_HIGH")]

    specs = [
        register("t_hang", hang, timeout_s=0.3, interval_s=0.2),
        register("t_quick", quick, interval_s=0.2),
    ]
    s = Scheduler(specs, CheckContext(config=None, root=tmp_path))
    t0 = time.monotonic()
    s.tick(t0)
    wait_for(lambda: by_check(s.snapshot(time.monotonic())[0], "t_hang"))
    assert time.monotonic() - t0 < 1.0  # within its deadline (+ slack), not later
    (f,) = by_check(s.snapshot(time.monotonic())[0], "t_hang")
    assert f.code == "CHECK_TIMEOUT" and f.status is Status.FAILED
    # Keep ticking: the quick check keeps running, the stuck one is never started again.
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        s.tick(time.monotonic())
        time.sleep(0.05)
    assert calls["hang"] == 1
    assert calls["quick"] >= 5
    findings, _ = s.snapshot(time.monotonic())
    (f,) = by_check(findings, "t_hang")
    assert f.code == "CHECK_TIMEOUT" and f.evidence.get("relaunched") is False
    assert not any(x.code == "RESULT_STALE" for x in findings)  # stuck stays TIMEOUT
    # Once it returns, it is launched again on its next due time.
    release.set()
    end = time.monotonic() + 3
    while calls["hang"] < 2 and time.monotonic() < end:
        s.tick(time.monotonic())
        time.sleep(0.05)
    assert calls["hang"] == 2


def test_result_older_than_twice_the_interval_is_stale_and_keeps_last_problems(register, tmp_path):
    def bad(ctx):
        return [Finding(check="t_bad", status=Status.FAILED, code="NVLINK_DOWN", component="gpu:1")]

    spec = register("t_bad", bad, interval_s=10.0, timeout_s=1.0)
    s = Scheduler([spec], CheckContext(config=None, root=tmp_path))
    now = time.monotonic()
    s.tick(now)
    wait_for(s.first_sweep_done)
    findings, _ = s.snapshot(time.monotonic() + 19.0)
    assert {f.code for f in findings} == {"NVLINK_DOWN"}
    findings, _ = s.snapshot(time.monotonic() + 21.0)
    codes = {f.code for f in findings}
    assert codes == {"NVLINK_DOWN", "RESULT_STALE"}
    stale = next(f for f in findings if f.code == "RESULT_STALE")
    assert stale.status is Status.FAILED and stale.could_not_run
    assert stale.evidence["last_codes"] == ["NVLINK_DOWN"]


def test_optional_check_without_its_tool_is_reported_disabled_not_failed(register, tmp_path):
    spec = register("t_opt", ok_check("t_opt"), needs=Needs(binaries=("gpuvigil-no-such-dcgmi",)))
    spec_opt = replace(spec, required=False)
    s = Scheduler([spec_opt], CheckContext(config=None, root=tmp_path, env={"PATH": ""}))
    s.tick(time.monotonic())
    wait_for(s.first_sweep_done)
    findings, runs = s.snapshot(time.monotonic())
    assert [(f.code, f.status) for f in findings] == [("CHECK_DISABLED", Status.OK)]
    assert runs[0].disabled
    # The same need on a required check is DEPENDENCY_MISSING, FAILED.
    s2 = Scheduler([spec], CheckContext(config=None, root=tmp_path, env={"PATH": ""}))
    s2.tick(time.monotonic())
    wait_for(s2.first_sweep_done)
    (f,) = s2.snapshot(time.monotonic())[0]
    assert f.code == "DEPENDENCY_MISSING" and f.status is Status.FAILED


def test_checks_switched_off_in_config_are_reported(tmp_path):
    s = Scheduler([], CheckContext(config=None, root=tmp_path), disabled=["nvml"])
    findings, runs = s.snapshot(time.monotonic())
    assert findings[0].code == "CHECK_DISABLED" and findings[0].check == "nvml"
    assert runs[0].disabled


def test_crashing_check_is_check_error_and_others_still_run(register, tmp_path):
    def boom(ctx):
        raise RuntimeError("driver said no")

    specs = [register("t_boom", boom), register("t_fine", ok_check("t_fine"))]
    s = Scheduler(specs, CheckContext(config=None, root=tmp_path))
    s.tick(time.monotonic())
    wait_for(s.first_sweep_done)
    findings, runs = s.snapshot(time.monotonic())
    assert [f.code for f in findings] == ["CHECK_ERROR"]
    assert {r.check for r in runs} == {"t_boom", "t_fine"}


def test_first_run_can_be_delayed_for_fleet_wide_splay(register, tmp_path):
    calls = []
    spec = register("t_diag", lambda ctx: calls.append(1) or [], group="diag", interval_s=100.0)
    s = Scheduler([spec], CheckContext(config=None, root=tmp_path), first_delay_s={"t_diag": 30.0})
    t0 = time.monotonic()
    assert s.tick(t0) == t0 + 30.0
    s.tick(t0 + 29.0)
    time.sleep(0.1)
    assert calls == []
    s.tick(t0 + 30.0)
    wait_for(lambda: calls == [1])
    assert s.slots[0].next_due == t0 + 130.0


def test_threads_are_kept_between_runs(register, tmp_path):
    """One thread per check (and one deadline watcher) for the scheduler's life: starting
    threads on every sweep cost the agent more CPU than the checks' own reads."""
    calls = []
    specs = [register(f"t_keep{i}", lambda ctx, i=i: calls.append(i) or [], interval_s=0.05)
             for i in range(3)]  # fmt: skip
    s = Scheduler(specs, CheckContext(config=None, root=tmp_path))
    t = time.monotonic()
    s.tick(t)
    wait_for(lambda: len(calls) >= 3)
    first = {th.ident for th in threading.enumerate() if th.name.startswith("check:t_keep")}
    for k in range(1, 6):
        s.tick(t + k * 0.1)
        wait_for(lambda k=k: len(calls) >= 3 * (k + 1))
    now = {th.ident for th in threading.enumerate() if th.name.startswith("check:t_keep")}
    assert len(first) == 3 and now == first
