"""One way to name a node: the explicit name, then the environment, then the short host name."""

from __future__ import annotations

import socket

from gpuvigil.core.naming import node_name


def test_explicit_then_env_then_short_hostname(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu017.cluster.example.com")
    assert node_name(env={}) == "gpu017"  # Slurm's NodeName is the host name up to the dot
    assert node_name(env={"SLURMD_NODENAME": "gpu17"}) == "gpu17"
    env = {"NODE_NAME": "ip-10-0-0-7.ec2.internal", "SLURMD_NODENAME": "gpu17"}
    assert node_name(env=env) == "ip-10-0-0-7.ec2.internal"  # k8s names are kept whole
    assert node_name(env={**env, "GPUVIGIL_NODE_NAME": "n1"}) == "n1"
    assert node_name("given", env=env) == "given"


def test_every_layer_names_the_node_the_same_way(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The agent, `gpuvigil check`, preflight and training agree (they disagreed: short,
    fully qualified, or either)."""
    from gpuvigil.node import compose, sweep
    from gpuvigil.node.agent import AgentConfig
    from gpuvigil.node.checks import CheckContext
    from gpuvigil.node.config import NodeConfig

    monkeypatch.setattr(socket, "gethostname", lambda: "gpu017.cluster.example.com")
    for var in ("GPUVIGIL_NODE_NAME", "NODE_NAME", "SLURMD_NODENAME"):
        monkeypatch.delenv(var, raising=False)
    agent = compose.node_name(AgentConfig(), {})
    check = sweep.run_sweep(CheckContext(config=NodeConfig()), specs=[]).node
    assert agent == check == "gpu017"
