"""Helpers of the agent's integration tests: run `gpuvigil agent` for real as a
subprocess with fake tools and a fake kernel log (`start_agent`), poll for outcomes.

Test modules take the fixture with `start_agent = agent_helpers.start_agent`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuvigil.fakes.gpu import SCENARIO_ENV, FakeNode, make_node
from gpuvigil.fakes.sysfs import FakeSysfs


def _root_conftest() -> Any:
    # Loaded by path: the module name `conftest` may be any folder's conftest.py by now.
    path = Path(__file__).resolve().parents[2] / "conftest.py"
    spec = importlib.util.spec_from_file_location("gpuvigil_tests_root_conftest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ROOT = _root_conftest()
cli_env, gpuvigil_argv = _ROOT.cli_env, _ROOT.gpuvigil_argv
GPUS, ADAPTERS = 8, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_until(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            last = pred()
        except (OSError, ValueError, KeyError):
            last = None
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


HERE = Path(__file__).resolve().parent


@dataclass
class FakeMachine:
    """The fake hardware an agent under test reads: NVML scenario, sysfs tree, kernel log."""

    root: Path
    sysfs: FakeSysfs
    scenario: Path
    kmsg: Path

    def nvml(self) -> FakeNode:
        return FakeNode.load(self.scenario)

    def save_nvml(self, node: FakeNode) -> None:
        node.save(self.scenario)

    def log(self, line: str) -> None:
        with self.kmsg.open("a") as fh:
            fh.write(line.rstrip("\n") + "\n")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = (
            deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
    return out


def fake_machine(tmp_path: Path) -> FakeMachine:
    """A healthy fake 8-GPU, 4-adapter (InfiniBand, 400 Gb/s) node."""
    root = tmp_path / "root"
    sysfs = FakeSysfs.node(root, gpus=GPUS, kind="ib", adapters=ADAPTERS, rate_gbps=400)
    scenario = tmp_path / "nvml.json"
    make_node(GPUS).save(scenario)
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("[    0.000000] Linux version 6.1.0 (gpuvigil test)\n")
    return FakeMachine(root, sysfs, scenario, kmsg)


def machine_config(m: FakeMachine) -> dict[str, Any]:
    return {
        "node": {
            "expect_gpus": GPUS,
            "gpu": {"nvml_module": "gpuvigil.fakes.nvml"},
            "fabric": {"expect_adapters": ADAPTERS, "kind": "ib", "expect_rate_gbps": 400},
        },
        "agent": {
            "sysfs_root": str(m.root),
            "state_dir": str(m.root.parent / "state"),
            "kernel_log": {"source": "file", "file": str(m.kmsg)},
        },
    }


@dataclass
class AgentProc:
    proc: subprocess.Popen[str]
    url: str
    state_file: Path
    log_path: Path
    machine: FakeMachine
    extra: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())

    def codes(self) -> set[tuple[str, str]]:
        return {(f["check"], f["code"]) for f in self.report()["findings"]}

    def metrics(self) -> str:
        return http_get(self.url + "/metrics")[1]

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@pytest.fixture
def start_agent(tmp_path: Path, fake_bin) -> Iterator[Callable[..., AgentProc]]:
    """Start an agent; every one started is stopped (by PID) at teardown."""
    started: list[AgentProc] = []

    def start(
        config: dict[str, Any] | None = None,
        *args: str,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        site_checks: bool = False,
    ) -> AgentProc:
        port = free_port()
        state = tmp_path / f"report-{len(started)}.json"
        cfg_path = tmp_path / f"agent-{len(started)}.yaml"
        machine = fake_machine(tmp_path / f"machine-{len(started)}")
        cfg = machine_config(machine)
        cfg["agent"]["publish_interval_s"] = 0.5
        if site_checks:
            cfg["agent"]["check_modules"] = ["agent_site_checks"]
        cfg = deep_merge(cfg, config or {})
        cfg_path.write_text(yaml.safe_dump(cfg))
        log_path = tmp_path / f"agent-{len(started)}.log"
        full_env = cli_env(
            {
                "PATH": f"{fake_bin.dir}:{os.environ['PATH']}",
                "PYTHONPATH": os.pathsep.join([cli_env()["PYTHONPATH"], str(HERE)]),
                "NODE_NAME": "gpu-test-1",
                SCENARIO_ENV: str(machine.scenario),
                **(env or {}),
            }
        )
        argv = gpuvigil_argv(
            "agent",
            "--config",
            str(cfg_path),
            "--state-file",
            str(state),
            "--listen",
            f"127.0.0.1:{port}",
            *args,
        )
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                argv, env=full_env, stdout=log, stderr=subprocess.STDOUT, text=True
            )
        a = AgentProc(proc, f"http://127.0.0.1:{port}", state, log_path, machine)
        started.append(a)
        if wait_ready:
            try:
                wait_until(state.exists, 20, "the first report")
            except AssertionError:
                raise AssertionError(f"agent did not publish; log:\n{a.log()}") from None
        return a

    yield start
    for a in started:
        a.stop(signal.SIGKILL if a.proc.poll() is None else signal.SIGTERM, timeout=5)


def start_kube_agent(
    start_agent: Callable[..., AgentProc],
    node: str,
    *,
    kubeconfig: Path,
    trust: Path,
    sinks: tuple[str, ...] = ("state-file", "http"),
    poll_s: float = 0.5,
    remediation: dict[str, Any] | None = None,
    agent: dict[str, Any] | None = None,
    kubernetes: dict[str, Any] | None = None,
    **kw: Any,
) -> AgentProc:
    """An agent on `node` with the Kubernetes sink (and `sinks`): a heartbeat every second,
    requests polled every `poll_s`, signed by the key whose public half is in `trust`.
    `agent` merges into its `agent:` settings, `kubernetes` into its Kubernetes sink's;
    `kw` goes to `start_agent`."""
    k8s: dict[str, Any] = {
        "heartbeat_interval_s": 1.0,
        "request_poll_interval_s": poll_s,
        "trust": {"controller_public_key_file": str(trust)},
        **(kubernetes or {}),
    }
    if remediation is not None:
        k8s["remediation"] = remediation
    config = {"agent": {**(agent or {}), "sinks": {"kubernetes": k8s}}}
    argv = ["--interval", "1", "--node-name", node, "--kubeconfig", str(kubeconfig)]
    for sink in ("kubernetes", *sinks):
        argv += ["--sink", sink]
    return start_agent(config, *argv, **kw)


def controller_key(folder: Path) -> tuple[Any, Path]:
    """A controller signing key and the public-key file an agent trusts (docs/security.md)."""
    from gpuvigil.core.signing import Signer

    signer = Signer.generate()
    pub = folder / "controller.pub"
    pub.write_bytes(signer.public_pem())
    return signer, pub


def signed_request(signer: Any, node: str, req: dict[str, Any]) -> dict[str, str]:
    """The request annotations as the controller writes them (`clusters.kubernetes`)."""
    from datetime import UTC, datetime

    from gpuvigil.core import wire
    from gpuvigil.core.signing import sig_annotation

    text = json.dumps({"at": datetime.now(UTC).isoformat(), **req})
    return {
        wire.REQUEST_ANNOTATION: text,
        sig_annotation(wire.REQUEST_ANNOTATION): signer.sign("remediation-request", node, text),
    }


def sa_kubeconfig(kube: Any, path: Path, *, sa: str, namespace: str = "gpuvigil") -> Path:
    """A kubeconfig with a TokenRequest token of the ServiceAccount `sa`."""
    spec = {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600}
    from gpuvigil.lab.control_plane import write_kubeconfig

    tok = kube.core().create_namespaced_service_account_token(sa, namespace, {"spec": spec})
    return write_kubeconfig(
        path, server=kube.url, token=tok.status.token, context="test", user="sa"
    )
