"""Settings of the cluster adapters (`controller.kubernetes:` and `controller.slurm:`).

Kept apart from the adapters so that loading a config file never imports the Kubernetes
client. Every default is explained in docs/controller.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpuvigil.core.config import StrictModel


class KubernetesSettings(StrictModel):
    kubeconfig: str | None = None  # None: in-cluster config, else ~/.kube/config
    context: str | None = None
    node_selector: str = (
        ""  # label selector of the nodes to manage, e.g. "nvidia.com/gpu.present=true"
    )
    request_timeout_s: float = Field(10.0, gt=0)  # every API call has a deadline
    count_pods: Literal["draining", "all"] = "draining"  # whose running pods each pass lists
    list_page_size: int = Field(500, ge=1)  # nodes per LIST page (keeps responses small)
    # The grace period evicted pods get (SIGTERM, then SIGKILL when it runs out): long enough
    # for training to finish its step and save a checkpoint. None: each pod's own.
    eviction_grace_s: int | None = Field(None, ge=0)
    # Per pool (the node's `gpuvigil.io/pool` label): pools whose jobs save bigger
    # checkpoints need longer. A pool not listed gets `eviction_grace_s`.
    pool_eviction_grace_s: dict[str, int] = Field(default_factory=dict)

    def eviction_grace_for(self, pool: str) -> int | None:
        grace = self.pool_eviction_grace_s.get(pool)
        return grace if grace is not None else self.eviction_grace_s

    replace: Literal["delete-node", "hook", "none"] = "delete-node"
    replace_hook: list[str] = Field(default_factory=list)  # argv; "{node}" is substituted
    hook_timeout_s: float = Field(120.0, gt=0)
    # The preflight DaemonSet's pods (deploy/kubernetes/preflight): deleted to validate a
    # node again after a repair or a release; an empty selector switches that off.
    preflight_namespace: str = "gpuvigil"
    preflight_selector: str = "app.kubernetes.io/name=gpuvigil-preflight"
    event_namespace: str = "default"  # Node events live in "default" by convention
    lease_namespace: str = "gpuvigil"
    lease_name: str = "gpuvigil-controller"
    lease_duration_s: float = Field(15.0, gt=0)  # a standby takes over this long after death
    lease_renew_s: float = Field(5.0, gt=0)  # the leader renews this often


class SlurmSettings(StrictModel):
    bin_dir: str | None = None  # where scontrol/sinfo/squeue live; None: PATH
    timeout_s: float = Field(15.0, gt=0)  # per command
    drain_mode: Literal["requeue", "wait"] = "requeue"  # at the deadline: requeue jobs or wait
    requeue_at_once: bool = False  # requeue at drain start instead of at the deadline
    replace_hook: list[str] = Field(default_factory=list)  # argv; "{node}" is substituted
    hook_timeout_s: float = Field(120.0, gt=0)
    conf: str | None = None  # SLURM_CONF for the commands; None: Slurm's default
