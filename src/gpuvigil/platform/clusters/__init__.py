"""Cluster adapters behind one interface (`base.Cluster`): kubernetes, slurm, memory.

`open_cluster(kind, ...)` builds the configured one, reading each node's pool from
`pool_label` (the controller's `safety.pool_label`); the Kubernetes client is imported only
when the Kubernetes adapter is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvigil.platform.state import POOL_LABEL

if TYPE_CHECKING:
    from gpuvigil.platform.clusters.base import Cluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings, SlurmSettings


def open_cluster(
    kind: str,
    *,
    kubernetes: KubernetesSettings | None = None,
    slurm: SlurmSettings | None = None,
    pool_label: str = POOL_LABEL,
) -> Cluster:
    if kind == "kubernetes":
        from gpuvigil.platform.clusters.kubernetes import KubernetesCluster

        return KubernetesCluster(kubernetes, pool_label=pool_label)
    if kind == "slurm":
        from gpuvigil.platform.clusters.slurm import SlurmCluster

        return SlurmCluster(slurm, pool_label=pool_label)
    raise ValueError(f"unknown cluster {kind!r} (kubernetes or slurm)")
