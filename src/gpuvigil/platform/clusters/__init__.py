"""Cluster adapters behind one interface (`base.Cluster`): kubernetes, slurm, memory.

`open_cluster(config)` builds the configured one; the Kubernetes client is imported only
when the Kubernetes adapter is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuvigil.platform.clusters.base import Cluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings, SlurmSettings


def open_cluster(
    kind: str, *, kubernetes: KubernetesSettings | None = None, slurm: SlurmSettings | None = None
) -> Cluster:
    if kind == "kubernetes":
        from gpuvigil.platform.clusters.kubernetes import KubernetesCluster

        return KubernetesCluster(kubernetes)
    if kind == "slurm":
        from gpuvigil.platform.clusters.slurm import SlurmCluster

        return SlurmCluster(slurm)
    raise ValueError(f"unknown cluster {kind!r} (kubernetes or slurm)")
