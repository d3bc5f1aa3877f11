"""The `ServingPool` settings: which serving workload the capacity gate protects, where its
demand is read, and how much headroom it keeps. `controller.serving:` in the config file;
every field and default is explained in docs/serving.md.

Read by the pure gate (`platform.capacity`), the Kubernetes adapter that reads demand and
scales the workload (`clusters.k8s_serving`), the controller and the simulator.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gpuvigil.core.config import StrictModel

# Finding codes whose suspicion lets a step skip the gate (with an audit event): a GPU that
# computes wrong answers does more harm serving than missing, so it leaves at once.
DEFAULT_BYPASS_CODES = ["GPU_SDC"]


class WorkloadRef(StrictModel):
    """The object that owns the pool's replicas; it is what make-before-break scales."""

    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    name: str = Field(min_length=1)


class DemandSource(StrictModel):
    """One demand signal, in replicas. `hpa`: the HorizontalPodAutoscaler `name`'s
    `status.desiredReplicas` (KEDA and KServe's raw mode make one); `scale`: the workload's
    Scale subresource `spec.replicas` (what its owner asked for); `promql`: `query` against
    `prometheus_url`, whose value is a number of replicas (round up)."""

    kind: Literal["hpa", "scale", "promql"]
    name: str = ""  # hpa: the HPA's name (same namespace as the pool)
    query: str = ""  # promql: an instant query giving one number of replicas
    prometheus_url: str = ""  # promql: e.g. http://prometheus.monitoring:9090
    timeout_s: float = Field(5.0, gt=0)  # promql: per request

    @model_validator(mode="after")
    def _complete(self) -> DemandSource:
        if self.kind == "hpa" and not self.name:
            raise ValueError("an hpa demand source needs `name` (the HorizontalPodAutoscaler)")
        if self.kind == "promql" and not (self.query and self.prometheus_url):
            raise ValueError("a promql demand source needs `query` and `prometheus_url`")
        return self

    @property
    def label(self) -> str:
        """How the source is named in events, conditions and metrics."""
        if self.kind == "hpa":
            return f"hpa/{self.name}"
        return "promql" if self.kind == "promql" else "scale"


class Headroom(StrictModel):
    """R = max(ceil(D * (1 + percent/100)), D + min_extra)."""

    percent: float = Field(0.0, ge=0, le=1000)
    min_extra: int = Field(0, ge=0)


class ServingPool(StrictModel):
    name: str = Field(min_length=1)  # how the pool is named in metrics, events, conditions
    namespace: str = Field(min_length=1)
    selector: dict[str, str] = Field(default_factory=dict)  # the replicas' pod labels
    workload: WorkloadRef | None = None  # the replicas' owner (needed to scale up)
    gpus_per_replica: int = Field(1, ge=0)
    demand: list[DemandSource] = Field(min_length=1)
    headroom: Headroom = Field(default_factory=Headroom)
    on_missing_signal: Literal["hold", "proceed"] = "hold"
    signal_stale_s: float = Field(300.0, gt=0)  # an older demand sample is missing
    escalate_after_s: float = Field(1800.0, gt=0)  # held without a signal this long: page
    ready_timeout_s: float = Field(600.0, gt=0)  # added replicas not Ready by then: no room
    max_replicas: int | None = Field(None, ge=1)  # a cap of our own (the HPA's also counts)

    @model_validator(mode="after")
    def _names_replicas(self) -> ServingPool:
        if not self.selector and self.workload is None:
            raise ValueError("a serving pool needs `selector` or `workload` to find its replicas")
        if any(s.kind == "scale" for s in self.demand) and self.workload is None:
            raise ValueError("a `scale` demand source reads the workload: set `workload`")
        return self


class ServingConfig(StrictModel):
    """`controller.serving:`."""

    pools: list[ServingPool] = Field(default_factory=list)
    bypass_codes: list[str] = Field(default_factory=lambda: list(DEFAULT_BYPASS_CODES))

    @model_validator(mode="after")
    def _unique(self) -> ServingConfig:
        names = [p.name for p in self.pools]
        if len(names) != len(set(names)):
            raise ValueError("serving pool names must be unique")
        return self
