"""The controller's metric families (canonical names from docs/metrics.md).

`build(registry)` is called once by `gpuvigil controller` (and by tests with a fresh
registry); nothing is registered at import.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from gpuvigil.core.verdicts import Action

# Every counter starts at 0 for the label sets it can take, so the first event is an
# increase from 0 that increase()/rate() see (a series born at 1 shows 0 on a graph).
REMEDIATION_ACTIONS = (Action.RESET_GPU.value, Action.REBOOT.value, Action.REPLACE.value)
REMEDIATION_RESULTS = ("started", "succeeded", "failed")
API_ERROR_KINDS = ("error", "conflict", "unavailable", "forbidden", "fenced")
DECISION_KINDS = ("decided", "reused")
GPU_STEPS = ("evicting", "resetting", "isolated")  # platform.isolation.Step
# The per-GPU path's remediation results: the record's new step, or its end
GPU_RESULTS = (*GPU_STEPS, "released", "whole-node")


@dataclass(frozen=True)
class ControllerMetrics:
    nodes: Gauge
    nodes_total: Gauge
    nodes_in_service: Gauge
    node_unavailable_seconds: Counter
    node_state: Gauge
    out_of_service_since: Gauge
    state_deadline: Gauge
    remediations: Counter
    breaker_open: Gauge
    breaker_trips: Counter
    breaker_signature: Gauge
    hardware_event: Gauge
    budget_in_use: Gauge
    budget_limit: Gauge
    spares: Gauge
    spares_wanted: Gauge
    reconcile_duration: Histogram
    is_leader: Gauge
    api_errors: Counter
    last_reconcile: Gauge
    held: Gauge
    decisions: Counter
    watch_age: Gauge
    clock_skew: Gauge
    machine_episodes: Gauge
    clock_skewed: Gauge
    gpus_isolated: Gauge
    capacity_gate: Counter
    capacity_held: Gauge
    capacity_escalated: Gauge
    evictions_refused: Counter
    pdb_overridden: Counter


def build(registry: CollectorRegistry) -> ControllerMetrics:
    disable_created_metrics()  # no `<name>_created` series (docs/metrics.md)
    m = _declare(registry)
    for action in ("DRAIN", *REMEDIATION_ACTIONS):
        for result in REMEDIATION_RESULTS:
            m.remediations.labels(action, result)
    for result in GPU_RESULTS:
        m.remediations.labels("ISOLATE_GPU", result)
    m.remediations.labels("EVICT", "forced")
    for kind in API_ERROR_KINDS:
        m.api_errors.labels(kind)
    for kind in DECISION_KINDS:
        m.decisions.labels(kind)
    for step in GPU_STEPS:
        m.gpus_isolated.labels(step).set(0)
    return m


def _declare(registry: CollectorRegistry) -> ControllerMetrics:
    return ControllerMetrics(
        nodes=Gauge("gpuvigil_nodes", "Nodes per policy state.", ["state"], registry=registry),
        nodes_total=Gauge("gpuvigil_nodes_total", "Nodes the controller sees.", registry=registry),
        nodes_in_service=Gauge(
            "gpuvigil_nodes_in_service",
            "Nodes HEALTHY and not blocked by anyone.",
            registry=registry,
        ),
        node_unavailable_seconds=Counter(
            "gpuvigil_node_unavailable_seconds",
            "Node-seconds out of service (nodes seen minus nodes in service, over the time "
            "between the leader's passes): the availability SLI's errors, whole between "
            "scrapes, which a sampled gauge is not.",
            registry=registry,
        ),
        node_state=Gauge(
            "gpuvigil_node_state",
            "1 for each node's current policy state (one series per node).",
            ["node", "state"],
            registry=registry,
        ),
        out_of_service_since=Gauge(
            "gpuvigil_node_out_of_service_since_seconds",
            "When the node left HEALTHY, Unix time (one series per node out of service): "
            "state changes within the episode do not restart it.",
            ["node"],
            registry=registry,
        ),
        state_deadline=Gauge(
            "gpuvigil_node_state_deadline_timestamp_seconds",
            "When the policy's own timeout ends the node's DRAINING, REMEDIATING or "
            "VALIDATING state at the latest, Unix time (one series per node in one).",
            ["node", "state"],
            registry=registry,
        ),
        remediations=Counter(
            "gpuvigil_remediations_total",
            "Remediation steps by action (DRAIN, RESET_GPU, REBOOT, REPLACE) and result "
            "(started, succeeded, failed); the per-GPU path's as ISOLATE_GPU by its step, "
            "and EVICT forced.",
            ["action", "result"],
            registry=registry,
        ),
        breaker_open=Gauge(
            "gpuvigil_circuit_breaker_open",
            "1 while the circuit breaker holds back new disruptions.",
            registry=registry,
        ),
        breaker_trips=Counter(
            "gpuvigil_circuit_breaker_trips_total",
            "Times the circuit breaker opened.",
            registry=registry,
        ),
        breaker_signature=Gauge(
            "gpuvigil_circuit_breaker_signature_nodes",
            "Nodes showing each cause the circuit breaker holds: a finding code concentrated "
            "on one node attribute value (attribute empty: fleet-wide; code * : many codes; "
            "code STALE: the pool's reports are stale), i.e. the suspected change.",
            ["code", "attribute", "value"],
            registry=registry,
        ),
        hardware_event=Gauge(
            "gpuvigil_hardware_event_nodes",
            "Nodes showing each open hardware event: one finding code concentrated on a "
            "topology attribute value (a rack, a leaf switch, a zone). Never held: its "
            "nodes stay blocked and are repaired within the budget.",
            ["code", "attribute", "value"],
            registry=registry,
        ),
        budget_in_use=Gauge(
            "gpuvigil_disruption_budget_in_use",
            "Nodes DRAINING or REMEDIATING per pool.",
            ["pool"],
            registry=registry,
        ),
        budget_limit=Gauge(
            "gpuvigil_disruption_budget_limit",
            "Most nodes allowed DRAINING or REMEDIATING at once per pool.",
            ["pool"],
            registry=registry,
        ),
        spares=Gauge(
            "gpuvigil_spares",
            "Hot spares per pool: validated, idle nodes kept for gang jobs' lost ranks.",
            ["pool"],
            registry=registry,
        ),
        spares_wanted=Gauge(
            "gpuvigil_spares_wanted",
            "Hot spares configured per pool (controller.spares).",
            ["pool"],
            registry=registry,
        ),
        reconcile_duration=Histogram(
            "gpuvigil_controller_reconcile_duration_seconds",
            "Time of one reconcile pass over every node.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=registry,
        ),
        is_leader=Gauge(
            "gpuvigil_controller_is_leader",
            "1 while this replica holds the leader Lease.",
            registry=registry,
        ),
        api_errors=Counter(
            "gpuvigil_controller_api_errors_total",
            "Cluster API errors by kind (conflict, unavailable, forbidden, fenced).",
            ["kind"],
            registry=registry,
        ),
        last_reconcile=Gauge(
            "gpuvigil_controller_last_reconcile_timestamp_seconds",
            "When the last reconcile pass finished (seconds since the epoch).",
            registry=registry,
        ),
        held=Gauge(
            "gpuvigil_disruptions_held",
            "Nodes needing a disruption that safety (budget, rate, breaker, cooldown) holds back.",
            registry=registry,
        ),
        decisions=Counter(
            "gpuvigil_controller_decisions_total",
            "Node decisions per pass: decided (the policy ran) or reused (inputs unchanged).",
            ["kind"],
            registry=registry,
        ),
        watch_age=Gauge(
            "gpuvigil_controller_watch_last_event_age_seconds",
            "Seconds since the node watch last delivered anything (an event, a bookmark, a "
            "fresh list); Kubernetes only.",
            registry=registry,
        ),
        clock_skew=Gauge(
            "gpuvigil_agent_clock_skew_max_seconds",
            "The largest clock skew seen between a node's reports and this controller's "
            "clock (a lower bound; positive: the node is ahead). Reports are judged by when "
            "the controller saw them change, so skew never blinds it.",
            registry=registry,
        ),
        machine_episodes=Gauge(
            "gpuvigil_machine_episodes",
            "Episodes (times out of service) the machine behind each node has had, as its "
            "history keeps them (kept across release, reboot and rename; one series per "
            "node with any). The lemon rule replaces a machine at policy.lemon_episodes "
            "within policy.lemon_window_s.",
            ["node"],
            registry=registry,
        ),
        gpus_isolated=Gauge(
            "gpuvigil_gpus_isolated",
            "GPUs taken out of service alone, their node staying in service (per-GPU "
            "isolation), by the GPU's ladder step: evicting (its holders), resetting, "
            "isolated (until replaced).",
            ["step"],
            registry=registry,
        ),
        clock_skewed=Gauge(
            "gpuvigil_agent_clock_skewed_nodes",
            "Nodes whose latest report was dated more than the tolerance (5 s) off this "
            "controller's clock.",
            registry=registry,
        ),
        capacity_gate=Counter(
            "gpuvigil_capacity_gate_total",
            "Answers of the serving capacity gate before a disruptive step, per serving pool "
            "and verdict (proceed, bypass, scale-up, wait, hold).",
            ["pool", "verdict"],
            registry=registry,
        ),
        capacity_held=Gauge(
            "gpuvigil_capacity_held_nodes",
            "Nodes whose disruptive step the capacity gate holds, per serving pool and reason "
            "(NoRoom, DemandSignalMissing, WaitingForReplicas, PoolUnreadable).",
            ["pool", "reason"],
            registry=registry,
        ),
        capacity_escalated=Gauge(
            "gpuvigil_capacity_escalated_nodes",
            "Nodes held without a demand signal for longer than the pool's escalate_after_s.",
            ["pool"],
            registry=registry,
        ),
        evictions_refused=Counter(
            "gpuvigil_drain_evictions_refused_total",
            "Evictions a PodDisruptionBudget refused (429) during drains, per node pool.",
            ["pool"],
            registry=registry,
        ),
        pdb_overridden=Counter(
            "gpuvigil_drain_pdb_overridden_total",
            "Pods deleted at the drain deadline although a PodDisruptionBudget refused their "
            "eviction, per node pool.",
            ["pool"],
            registry=registry,
        ),
    )
