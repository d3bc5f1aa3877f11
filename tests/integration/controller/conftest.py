"""Fixtures for the controller's integration tests (real kube-apiserver, real Slurm)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from ctl_helpers import Agent


@pytest.fixture
def agent(kube: Any) -> Agent:
    return Agent(kube.core())


@pytest.fixture
def kube_cluster(kube: Any) -> Callable[..., Any]:
    from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings

    def make(**kw: Any) -> KubernetesCluster:
        kw.setdefault("eviction_grace_s", 0)
        return KubernetesCluster(KubernetesSettings(**kw), api_client=kube.api_client())

    return make
