"""`gpuvigil controller`: the remediation controller for Kubernetes or Slurm."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import typer

CLUSTER_HELP = "kubernetes or slurm (default: controller.cluster in the config, else kubernetes)"
CONFIG_OPTION = typer.Option(None, "--config", help="YAML config file (its controller: section).")
KUBECONFIG_OPTION = typer.Option(
    None,
    "--kubeconfig",
    help="Kubeconfig file (default: controller.kubernetes.kubeconfig, else the pod's "
    "service account, else $KUBECONFIG, else ~/.kube/config).",
)
CONTEXT_OPTION = typer.Option(None, "--context", help="Kubeconfig context to use.")


def cluster_overrides(
    cluster: str | None, kubeconfig: Path | None, context: str | None
) -> dict[str, Any]:
    """The `controller:` overrides of the options every cluster command shares."""
    out: dict[str, Any] = {"cluster": cluster} if cluster else {}
    kube: dict[str, Any] = {}
    if kubeconfig is not None:
        kube["kubeconfig"] = str(kubeconfig)
    if context:
        kube["context"] = context
    if kube:
        out["kubernetes"] = kube
    return out


def load_controller_config(config: Path | None, overrides: dict[str, Any]) -> Any:
    from gpuvigil import config as gconfig

    try:
        over = {"controller": overrides} if overrides else None
        return gconfig.load(config, overrides=over, sections=("controller",))
    except gconfig.ConfigError as e:
        typer.echo(f"config error: {e}", err=True)
        raise typer.Exit(2) from e


def open_or_exit(cfg: Any, kubernetes: Any = None) -> Any:
    """The configured cluster adapter, or exit 2 saying why (no kubeconfig, no Slurm)."""
    from gpuvigil.node.sinks.kube_client import KubeConfigError
    from gpuvigil.platform.clusters import open_cluster

    try:
        return open_cluster(cfg.cluster, kubernetes=kubernetes or cfg.kubernetes, slurm=cfg.slurm)
    except KubeConfigError as e:
        typer.echo(f"cannot open the {cfg.cluster} cluster: {e}", err=True)
        raise typer.Exit(2) from e
    except Exception as e:  # an unreadable token, no Slurm: say it, exit 2
        typer.echo(f"cannot open the {cfg.cluster} cluster: {type(e).__name__}: {e}", err=True)
        raise typer.Exit(2) from e


def register(app: typer.Typer) -> None:
    @app.command("controller")
    def controller(  # noqa: PLR0917 - one parameter per flag is how typer declares them
        cluster: str = typer.Option(None, "--cluster", help=CLUSTER_HELP),
        dry_run: bool = typer.Option(
            False, "--dry-run", help="Decide and record (log, events, metrics); never act."
        ),
        config: Path = CONFIG_OPTION,
        once: bool = typer.Option(
            False, "--once", help="One reconcile pass, print each node's decision, exit."
        ),
        identity: str = typer.Option(
            None, "--identity", help="Leader-election identity (default: host name + pid)."
        ),
        kubeconfig: Path = KUBECONFIG_OPTION,
        context: str = CONTEXT_OPTION,
    ) -> None:
        """Watch every node's health and remediate progressively and safely.

        HEALTHY -> SUSPECT (new work blocked) -> DRAINING -> REMEDIATING (reset, reboot,
        replace) -> VALIDATING -> HEALTHY; QUARANTINED waits for `gpuvigil release NODE`.
        Disruption budget, cooldown, rate limit and a circuit breaker bound what it does;
        nodes someone else blocked are left alone. See docs/controller.md.
        """
        from prometheus_client import CollectorRegistry

        from gpuvigil.core.events import EventWriter
        from gpuvigil.platform import metrics as pmetrics
        from gpuvigil.platform import serve
        from gpuvigil.platform.controller import Controller

        overrides = cluster_overrides(cluster, kubeconfig, context)
        if dry_run:
            overrides["dry_run"] = True
        cfg = load_controller_config(config, overrides).controller
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        adapter = open_or_exit(cfg)
        if not cfg.dry_run and hasattr(adapter, "signer"):  # in the background: start at once
            threading.Thread(target=_publish_key, args=(adapter,), daemon=True).start()
        registry = CollectorRegistry()
        metrics = pmetrics.build(registry)
        events = EventWriter(cfg.events_path) if cfg.events_path else None
        ctl = Controller(
            adapter, config=cfg, metrics=metrics, events=events,
            identity=identity or f"{socket.gethostname()}-{os.getpid()}",
        )  # fmt: skip
        if once:
            result = ctl.reconcile()
            if not result.listed:
                typer.echo("could not list the nodes", err=True)
                raise typer.Exit(2)
            for name, d in sorted(result.decisions.items()):
                ops = ",".join(op.kind.value for op in d.ops) or "-"
                typer.echo(f"{name}\t{d.state.value}\t{ops}\t{d.held or d.reason}")
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        is_leader, thread = _leader(cfg, adapter, ctl.identity, metrics, stop)
        if cfg.metrics_port:
            app = serve.health_app(
                registry, last_pass=lambda: ctl.last_pass_at, is_leader=is_leader,
                stale_after_s=max(120.0, 6 * cfg.interval_s),
            )  # fmt: skip
            serve.serve(app, port=cfg.metrics_port)
        ctl.run(stop, is_leader=is_leader)
        if thread is not None:
            thread.join(timeout=10)  # it gives the Lease up, so a standby starts at once
        if events:
            events.close()


def _publish_key(adapter: Any) -> None:
    """Have the signing key (and the agents' copy of its public half) before the first
    request; a failure here is retried at the first request, and said now."""
    from gpuvigil.platform.clusters.base import ClusterError

    try:
        adapter.signer()
    except ClusterError as e:
        logging.getLogger("gpuvigil.controller").warning(
            "signing key not available yet (%s): remediation requests wait for it", e
        )


def _leader(
    cfg: Any, adapter: Any, identity: str, metrics: Any, stop: threading.Event
) -> tuple[Any, threading.Thread | None]:
    """Kubernetes with leader election: a Lease thread; otherwise always the leader. A dry
    run writes nothing, not even the Lease: every dry-run replica observes and logs."""
    if cfg.cluster != "kubernetes" or not cfg.leader_election or cfg.dry_run:
        return (lambda: True), None
    from gpuvigil.platform.leader import LeaderElector

    k = cfg.kubernetes
    elector = LeaderElector(
        adapter.lease_store(), identity=identity, lease_duration_s=k.lease_duration_s,
        renew_s=k.lease_renew_s, on_change=lambda lead: metrics.is_leader.set(int(lead)),
    )  # fmt: skip
    thread = threading.Thread(target=elector.run, args=(stop,), name="leader", daemon=True)
    thread.start()
    return elector.is_leader, thread
