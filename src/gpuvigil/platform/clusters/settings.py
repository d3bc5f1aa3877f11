"""Settings of the cluster adapters (`controller.kubernetes:` and `controller.slurm:`).

Kept apart from the adapters so that loading a config file never imports the Kubernetes
client. Every default is explained in docs/controller.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt

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
    # Per pool (the value of the node's `safety.pool_label` label, the same pools the
    # budgets count): pools whose jobs save bigger checkpoints need longer. A pool not
    # listed gets `eviction_grace_s`.
    pool_eviction_grace_s: dict[str, int] = Field(default_factory=dict)

    def eviction_grace_for(self, pool: str) -> int | None:
        grace = self.pool_eviction_grace_s.get(pool)
        return grace if grace is not None else self.eviction_grace_s

    replace: Literal["delete-node", "hook", "none"] = "delete-node"
    replace_hook: list[str] = Field(default_factory=list)  # argv; "{node}" is substituted
    hook_timeout_s: float = Field(120.0, gt=0)
    # Preflight runs as a pod per validation, made from this PodTemplate in
    # preflight_namespace (deploy/kubernetes/preflight); "" switches preflight off (a node
    # then waits for validation_timeout_s). Its result is the pod's exit (k8s_preflight).
    preflight_namespace: str = "gpuvigil"
    preflight_template: str = "gpuvigil-preflight"
    gpu_resource: str = "nvidia.com/gpu"  # the preflight pod asks for this many GPUs
    # How many GPUs a validation expects, never read from what a node can write (its
    # allocatable, its capacity): the count of the node's pool (`safety.pool_label`) here,
    # else the instance-type catalog's count for the node's `instance_type_label`, else
    # the controller refuses to validate the node (docs/security.md, "GPU count").
    pool_gpus: dict[str, NonNegativeInt] = Field(default_factory=dict)
    instance_type_label: str = "node.kubernetes.io/instance-type"
    # The key that signs remediation requests and releases for the agents (k8s_keys,
    # docs/security.md): a PEM file, else a Secret the controller creates in key_namespace;
    # its public half goes to the ConfigMap trust_configmap, mounted by the agents.
    signing_key_file: str | None = None
    key_namespace: str = "gpuvigil"
    signing_key_secret: str = "gpuvigil-controller-key"
    trust_configmap: str = "gpuvigil-trust"
    event_namespace: str = "default"  # Node events live in "default" by convention
    event_queue: int = Field(1000, ge=0)  # Events waiting to be sent; more are dropped
    lease_namespace: str = "gpuvigil"  # the leader Lease (timings: controller.lease)
    lease_name: str = "gpuvigil-controller"
    watch: bool = True  # keep the nodes from one LIST and a WATCH instead of listing each pass
    watch_timeout_s: float = Field(60.0, gt=0)  # the server ends each watch after this
    watch_stale_s: float = Field(180.0, gt=0)  # nothing heard this long: act on nothing


class SlurmDegradeSettings(StrictModel):
    """`controller.slurm.degrade:` one bad GPU takes one GPU out instead of the whole node
    (`clusters.slurm_degrade`; docs/slurm.md has the procedure and the measured restarts)."""

    enabled: bool = False  # off: every fault takes today's whole-node ladder
    # The gres.conf to rewrite; None: gres.conf beside `conf` (or /etc/slurm/gres.conf).
    gres_conf: str | None = None
    # The slurm.conf fragment, `Include`d by slurm.conf, that holds the GPU nodes' NodeName
    # lines (their `Gres=gpu:N`): gpuvigil edits this file only, never slurm.conf itself.
    node_conf: str | None = None
    # How a job is kept off the bad GPU's device (verified in `scontrol show config`
    # before each degrade; unverifiable -> the whole-node ladder): "cgroup"
    # (TaskPlugin=task/cgroup + ConstrainDevices=yes) or "taskprolog" (TaskProlog runs
    # deploy/slurm/gpuvigil-taskprolog, which maps CUDA_VISIBLE_DEVICES to device numbers).
    enforcement: Literal["cgroup", "taskprolog"] = "cgroup"
    # Measured on 22.05: `scontrol reconfigure` makes slurmd re-read gres.conf but
    # slurmctld refuses a File-bound count change until it restarts. argv, run on the
    # controller host; [] -> fail closed (the node stays drained, the reason says so).
    restart_slurmctld: list[str] = Field(
        default_factory=lambda: ["systemctl", "restart", "slurmctld"]
    )
    restart_timeout_s: float = Field(60.0, gt=0)
    register_timeout_s: float = Field(60.0, gt=0)  # slurmctld back and the node re-registered


class SlurmSettings(StrictModel):
    bin_dir: str | None = None  # where scontrol/sinfo/squeue live; None: PATH
    timeout_s: float = Field(15.0, gt=0)  # per command
    drain_mode: Literal["requeue", "wait"] = "requeue"  # at the deadline: requeue jobs or wait
    requeue_at_once: bool = False  # requeue at drain start instead of at the deadline
    replace_hook: list[str] = Field(default_factory=list)  # argv; "{node}" is substituted
    hook_timeout_s: float = Field(120.0, gt=0)
    conf: str | None = None  # SLURM_CONF for the commands; None: Slurm's default
    # The leader election's lease files: a folder every controller host shares (None:
    # `gpuvigil-lease` in slurmctld's StateSaveLocation, which HA setups share already).
    lease_dir: str | None = None
    degrade: SlurmDegradeSettings = Field(default_factory=SlurmDegradeSettings)
    # Hot spares (`controller.spares`, clusters.slurm_spares): the reservation (Flags=FLEX)
    # that holds them, and the users whose gang jobs may use it (`--reservation=<it>`);
    # Slurm refuses a reservation for nobody, so spares need at least one.
    spare_reservation: str = "gpuvigil-spares"
    spare_users: list[str] = Field(default_factory=list)
