"""A metrics port someone else holds: `gpuvigil controller` and `gpuvigil agent` each say so
in one line naming the address and the setting, and exit 2 (no traceback); and the
controller listens where `--metrics-address` / `controller.metrics_address` says."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def kubeconfig(tmp_path: Path) -> Path:
    """A cluster nobody answers for: the port check comes before any API call."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", '
        "insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: t, context: {cluster: c, user: u}}]\ncurrent-context: t\n"
    )
    return path


def one_line_exit_2(r: subprocess.CompletedProcess[str], port: int) -> None:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"127.0.0.1:{port}" in r.stderr and "Address already in use" in r.stderr


def test_controller_port_in_use(run_cli, taken, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"controller: {{metrics_port: {taken}, leader_election: false}}\n")
    r = run_cli("controller", "--config", str(cfg), "--kubeconfig", str(kubeconfig(tmp_path)),
                "--metrics-address", "127.0.0.1", timeout=60)  # fmt: skip
    one_line_exit_2(r, taken)
    assert "controller.metrics_address" in r.stderr


def test_agent_port_in_use(run_cli, taken) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("agent", "--listen", f"127.0.0.1:{taken}", "--sink", "http",
                "--node-name", "n1", timeout=60)  # fmt: skip
    one_line_exit_2(r, taken)
    assert "agent.sinks.http.listen" in r.stderr


def test_controller_listens_on_the_address_it_is_given(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """127.0.0.1 only: 127.0.0.2 (loopback too, but another address) is refused; by
    default (0.0.0.0, as before the setting) both answer."""
    from testkit import cli_env, gpuvigil_argv

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"controller: {{metrics_port: {port}, leader_election: false}}\n")

    def answers(host: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    for address, local_only in (("127.0.0.1", True), (None, False)):
        flag = ["--metrics-address", address] if address else []
        argv = ["controller", "--config", str(cfg), "--kubeconfig", str(kubeconfig(tmp_path))]
        proc = subprocess.Popen(gpuvigil_argv(*argv, *flag), env=cli_env(None),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            end = time.monotonic() + 60
            while not answers("127.0.0.1"):
                assert proc.poll() is None and time.monotonic() < end, "no /metrics"
                time.sleep(0.2)
            assert answers("127.0.0.2") is not local_only, address
        finally:
            proc.terminate()
            proc.wait(timeout=30)
