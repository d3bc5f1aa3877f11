"""Builds a runnable Agent from the config: which checks on which schedule, which sinks.

Called by `gpuvigil agent` (and the benchmark). Kept apart from the loop so that the loop
reads top to bottom and tests can build an Agent from hand-made parts.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
import threading
import time

from prometheus_client import CollectorRegistry

from gpuvigil import __version__
from gpuvigil.core import naming
from gpuvigil.core.events import EventWriter
from gpuvigil.node import sweep
from gpuvigil.node.agent import Agent, AgentConfig
from gpuvigil.node.checks import REGISTRY, CheckContext, CheckSpec
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.kernel_watch import KernelWatch
from gpuvigil.node.metrics import AgentMetrics, build, observe_run, zero_known
from gpuvigil.node.scheduler import Scheduler, with_schedule
from gpuvigil.node.sinks import SinkWorker
from gpuvigil.node.sinks.remediation import ACTIONS as REMEDIATION_ACTIONS
from gpuvigil.node.watchdog import Watchdog

log = logging.getLogger("gpuvigil.agent")
SCHEDULED_GROUPS = ("fast", "slow", "diag")  # `stream` is the kernel watch; `active` is preflight
# Checks the kernel-log stream stands in for while it runs (same name, same findings).
REPLACED_BY_STREAM = ("kernel_log",)


def node_name(config: AgentConfig, env: dict[str, str]) -> str:
    return naming.node_name(config.node_name, env=env)


def schedule(config: AgentConfig) -> tuple[list[CheckSpec], list[str]]:
    """Every registered check of the scheduled groups with its effective interval and
    deadline, plus the names switched off in the config."""
    group_interval = {
        "fast": config.fast_interval_s,
        "slow": config.slow_interval_s,
        "diag": config.diag_interval_s,
    }
    unknown = set(config.checks) - set(REGISTRY)
    if unknown:
        raise ValueError(f"agent.checks names unknown checks: {', '.join(sorted(unknown))}")
    specs, disabled = [], []
    for spec in REGISTRY.values():
        if spec.group not in SCHEDULED_GROUPS:
            continue
        if config.kernel_log.enabled and spec.name in REPLACED_BY_STREAM:
            continue
        over = config.checks.get(spec.name)
        if over is not None and not over.enabled:
            disabled.append(spec.name)
            continue
        interval = over.interval_s if over and over.interval_s else group_interval[spec.group]
        timeout = over.timeout_s if over and over.timeout_s else spec.timeout_s
        specs.append(with_schedule(spec, interval_s=interval, timeout_s=timeout))
    return specs, disabled


def build_agent(
    a: AgentConfig,
    *,
    node_config: NodeConfig,
    env: dict[str, str] | None = None,
    watchdog: bool = True,
) -> tuple[Agent, dict[str, str]]:
    """The agent and a description of what it publishes to (for the start-up log line)."""
    env = dict(os.environ if env is None else env)
    sweep.load_checks()
    for mod in a.check_modules:
        importlib.import_module(mod)
    node = node_name(a, env)
    registry = CollectorRegistry()
    metrics = build(registry)
    metrics.info.labels(node, __version__).set(1)
    specs, disabled = schedule(a)
    ctx = CheckContext(config=node_config, root=a.sysfs_root, env=env)

    def on_result(findings: list, run: object) -> None:
        observe_run(metrics, findings, run, now_s=time.time())  # type: ignore[arg-type]

    splay = {
        s.name: random.uniform(0, min(a.diag_splay_s, s.interval_s))
        for s in specs
        if s.group == "diag"
    }
    scheduler = Scheduler(
        specs,
        ctx,
        stale_factor=a.stale_factor,
        on_result=on_result,
        disabled=disabled,
        first_delay_s=splay,
    )
    kernel = (
        KernelWatch(
            a.kernel_log,
            ctx=ctx,
            changed=scheduler.changed,
            metrics=metrics,
            stale_factor=a.stale_factor,
            state_dir=a.state_dir,
        )
        if a.kernel_log.enabled
        else None
    )
    dog = Watchdog(a.watchdog_timeout_s) if watchdog else None
    events = EventWriter(a.events_file) if a.events_file is not None else None
    workers: list[SinkWorker] = []
    agent = Agent(
        node=node,
        config=a,
        scheduler=scheduler,
        kernel=kernel,
        workers=workers,
        metrics=metrics,
        watchdog=dog,
        events=events,
        # The first report waits for the fast and slow groups (a DCGM diag may take
        # minutes and is published when it finishes).
        first_publish_timeout_s=max(
            (s.timeout_s for s in specs if s.group in ("fast", "slow")), default=5.0
        )
        + 5,
    )
    where = _build_sinks(
        a, node=node, env=env, registry=registry, metrics=metrics, agent=agent, workers=workers
    )
    zero_known(
        metrics,
        checks=[spec.name for spec in specs],
        sinks=list(where),  # keyed by each sink's name
        actions=REMEDIATION_ACTIONS if a.sinks.kubernetes.enabled else (),
    )
    return agent, where


def _build_sinks(
    a: AgentConfig,
    *,
    node: str,
    env: dict[str, str],
    registry: CollectorRegistry,
    metrics: AgentMetrics,
    agent: Agent,
    workers: list[SinkWorker],
) -> dict[str, str]:
    where: dict[str, str] = {}

    def ok(name: str) -> None:
        metrics.last_publish.labels(name).set(time.time())

    def bad(name: str, _e: BaseException) -> None:
        metrics.publish_errors.labels(name).inc()

    sinks: list[object] = []
    s = a.sinks
    if s.state_file.enabled:
        from gpuvigil.node.sinks.state_file import StateFileSink

        sinks.append(StateFileSink(s.state_file))
        where["state_file"] = str(s.state_file.path)
    if s.http.enabled:
        from gpuvigil.node.sinks.http import HttpSink

        http = HttpSink(s.http, registry=registry, health=agent.health)
        sinks.append(http)
        where["http"] = http.address
    if s.kubernetes.enabled:
        from gpuvigil.node.sinks.kubernetes import KubernetesSink

        def remediated(action: str, result: str) -> None:
            metrics.remediations.labels(action, result).inc()

        def rejected(kind: str, reason: str) -> None:
            metrics.rejected_messages.labels(kind, reason).inc()

        kernel = agent.kernel
        sinks.append(
            KubernetesSink(
                s.kubernetes,
                node=node,
                env=env,
                on_remediation=remediated,
                on_release=kernel.release if kernel else None,
                on_reject=rejected,
                state_dir=a.state_dir,
                on_reset=agent.after_reset,
            )
        )
        where["kubernetes"] = f"node/{node}"
    if s.slurm.enabled:
        from gpuvigil.node.sinks.slurm import SlurmSink

        sinks.append(SlurmSink(s.slurm, node=node, env=env))
        where["slurm"] = f"{s.slurm.mode} NodeName={node}"
    for sink in sinks:
        workers.append(SinkWorker(sink, on_success=ok, on_error=bad))  # type: ignore[arg-type]
    return where


def install_stop_signals(agent: Agent) -> None:
    import signal

    def handler(_sig: int, _frame: object) -> None:
        agent.stop()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
