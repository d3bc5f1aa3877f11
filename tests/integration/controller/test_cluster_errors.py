"""`gpuvigil nodes`/`release` against the real kube-apiserver: an unknown node is one clear
line and exit 1 (it was the API server's raw 404 JSON); `--kubeconfig`/`--context` pick the
cluster."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.realparts


def test_unknown_node_and_context(kube, run_cli) -> None:  # type: ignore[no-untyped-def]
    cfg = ("--kubeconfig", str(kube.kubeconfig), "--context", "test")
    for cmd in ("nodes", "release"):
        p = run_cli(cmd, "no-such-node", *cfg, env={"KUBECONFIG": "/nonexistent"}, timeout=60)
        assert p.returncode == 1, p.stderr
        assert p.stderr.strip() == "no node named 'no-such-node' in the kubernetes cluster"
    node = kube.create_node()
    p = run_cli("nodes", node, "--json", *cfg, timeout=60)
    assert p.returncode == 0 and f'"node": "{node}"' in p.stdout, p.stderr
    p = run_cli("nodes", "--kubeconfig", str(kube.kubeconfig), "--context", "prod", timeout=60)
    assert p.returncode == 2 and "no context 'prod' (contexts: test)" in p.stderr
