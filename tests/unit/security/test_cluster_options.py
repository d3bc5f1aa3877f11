"""One Kubernetes client factory (`io.kube_client`) and the cluster commands'
`--kubeconfig`/`--context`: clear errors for a missing config, an unknown context, a dead
API server and an unknown node; /report answers loopback clients only by default."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuvigil.io.kube_client import KubeConfigError, connect
from gpuvigil.lab.control_plane import write_kubeconfig
from gpuvigil.node.sinks.http import _loopback
from testkit import cli_env


def dead_kubeconfig(path: Path, port: int) -> Path:
    """A kubeconfig whose one context, `dead`, points at 127.0.0.1:`port`."""
    return write_kubeconfig(path, server=f"https://127.0.0.1:{port}", token="t", context="dead")


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuvigil", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(env or {}),
    )


def test_missing_kubeconfig_says_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match=r"does not exist; pass --kubeconfig"):
        connect(kubeconfig=tmp_path / "nope")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(KubeConfigError, match="absent does not exist"):
        connect()


def test_unknown_context_names_the_known_ones(tmp_path):
    cfg = dead_kubeconfig(tmp_path / "kubeconfig", 1)
    with pytest.raises(KubeConfigError, match=r"no context 'prod' \(contexts: dead\)"):
        connect(kubeconfig=cfg, context="prod")
    (tmp_path / "junk").write_text("just: [text")
    with pytest.raises(KubeConfigError, match="junk"):
        connect(kubeconfig=tmp_path / "junk")


def test_every_cluster_command_takes_kubeconfig_and_context(tmp_path):
    for cmd in ("controller", "nodes", "release", "agent"):
        out = run(cmd, "--help", env={"COLUMNS": "200"}).stdout
        assert "--kubeconfig" in out and "--context" in out, cmd
    missing = run("nodes", "--kubeconfig", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert "cannot open the kubernetes cluster: no Kubernetes credentials" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_a_dead_api_server_is_one_clear_line(tmp_path):
    cfg = dead_kubeconfig(tmp_path / "kubeconfig", dead_port())
    t0 = time.monotonic()
    p = run("nodes", "--kubeconfig", str(cfg), "--context", "dead")
    assert p.returncode == 2
    assert p.stderr.strip() == "cannot read the nodes: API server unreachable: connection refused"
    assert "Retrying" not in p.stderr and time.monotonic() - t0 < 30


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("127.8.9.10", True),
        ("10.0.0.5", False),
        ("::ffff:10.0.0.5", False),
        ("fe80::1%eth0", False),
        ("junk", False),
    ],
)
def test_report_is_for_loopback_clients(host, local):
    assert _loopback(host) is local


def test_the_help_and_docs_name_the_flags():
    docs = (Path(__file__).resolve().parents[3] / "docs").glob("*.md")
    text = "\n".join(p.read_text() for p in docs)
    assert "--context" in text and "report_clients" in text
