"""`gpuvigil controller`: the remediation controller for Kubernetes or Slurm."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import typer

from gpuvigil.core.cli_exit import CliExit

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
        raise typer.Exit(CliExit.CANNOT_TELL) from e


def open_or_exit(cfg: Any, kubernetes: Any = None) -> Any:
    """The configured cluster adapter, or exit 2 saying why (no kubeconfig, no Slurm)."""
    from gpuvigil.io.kube_client import KubeConfigError
    from gpuvigil.platform.clusters import open_cluster

    try:
        return open_cluster(
            cfg.cluster,
            kubernetes=kubernetes or cfg.kubernetes,
            slurm=cfg.slurm,
            pool_label=cfg.safety.pool_label,
        )
    except KubeConfigError as e:
        typer.echo(f"cannot open the {cfg.cluster} cluster: {e}", err=True)
        raise typer.Exit(CliExit.CANNOT_TELL) from e
    except Exception as e:  # an unreadable token, no Slurm: say it, exit 2
        typer.echo(f"cannot open the {cfg.cluster} cluster: {type(e).__name__}: {e}", err=True)
        raise typer.Exit(CliExit.CANNOT_TELL) from e


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
        metrics_address: str = typer.Option(
            None,
            "--metrics-address",
            help="Address /metrics and /healthz listen on (default: controller.metrics_address "
            "in the config, else 0.0.0.0, every interface); 127.0.0.1 keeps them local.",
        ),
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
        if metrics_address is not None:
            overrides["metrics_address"] = metrics_address
        cfg = load_controller_config(config, overrides).controller
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        adapter = open_or_exit(cfg)
        registry = CollectorRegistry()
        metrics = pmetrics.build(registry)
        events = EventWriter(cfg.events_path) if cfg.events_path else None
        me = identity or f"{socket.gethostname()}-{os.getpid()}"
        # A dry run writes nothing, not even the lease: every dry-run replica observes and
        # logs. Anything that writes holds the lease first (--once too).
        elector = None if cfg.dry_run else _elector(cfg, adapter, me, metrics)
        ctl = Controller(
            adapter, config=cfg, metrics=metrics, events=events, identity=me, elector=elector
        )
        if cfg.metrics_port and not once:  # before anything starts: a taken port exits 2 here
            app = serve.health_app(
                registry, last_pass=lambda: ctl.last_pass_at, is_leader=ctl.is_leader,
                stale_after_s=max(120.0, 6 * cfg.interval_s),
                watch_age=getattr(adapter, "watch_age_s", None),
                watch_stale_s=getattr(cfg.kubernetes, "watch_stale_s", 0.0),
                watch_blind=_blind(adapter, 2 * cfg.interval_s),
            )  # fmt: skip
            where = f"{cfg.metrics_address}:{cfg.metrics_port}"
            try:
                serve.serve(app, port=cfg.metrics_port, host=cfg.metrics_address)
            except OSError as e:
                typer.echo(f"gpuvigil controller: cannot listen on {where} "
                           f"(controller.metrics_address, metrics_port): {e.strerror or e}",
                           err=True)  # fmt: skip
                raise typer.Exit(CliExit.CANNOT_TELL) from None
        if not cfg.dry_run and hasattr(adapter, "signer"):  # in the background: start at once
            threading.Thread(target=_publish_key, args=(adapter,), daemon=True).start()
        if once:
            _once(ctl, elector)
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        thread = None
        if elector is not None and elector.elect:
            thread = threading.Thread(target=elector.run, args=(stop,), name="leader", daemon=True)
            thread.start()
        ctl.run(stop)
        if thread is not None:
            thread.join(timeout=10)  # it gives the Lease up, so a standby starts at once
        if events:
            events.close()


def _blind(adapter: Any, after_s: float) -> Any:
    """/healthz's question to the adapter's node watch (Kubernetes only): fail once the
    watch is refused, or has failed to open for two passes."""
    blind = getattr(adapter, "watch_blind", None)
    return None if blind is None else lambda: blind(after_s)


def _publish_key(adapter: Any) -> None:
    """Have the signing key (and the agents' copy of its public half) before the first
    request; a failure here is retried at the first request, and said now."""
    from gpuvigil.platform.clusters.base import ClusterError, Fenced

    try:
        adapter.signer()
    except Fenced:
        return  # a standby, or not yet leader: the key is loaded at the first request
    except ClusterError as e:
        logging.getLogger("gpuvigil.controller").warning(
            "signing key not available yet (%s): remediation requests wait for it", e
        )


def _elector(cfg: Any, adapter: Any, identity: str, metrics: Any) -> Any:
    """The leader elector over the cluster's lease (a Kubernetes Lease; lease files on
    Slurm); with `leader_election: false`, a lone controller that is always the leader."""
    from gpuvigil.platform.leader import LeaderElector

    try:
        store = adapter.lease_store()
    except Exception as e:
        typer.echo(f"cannot open the leader lease: {e}", err=True)
        raise typer.Exit(CliExit.CANNOT_TELL) from e
    return LeaderElector(
        store, identity=identity, settings=cfg.lease, elect=cfg.leader_election,
        on_change=lambda lead: metrics.is_leader.set(int(lead)),
    )  # fmt: skip


def _once(ctl: Any, elector: Any) -> None:
    """One pass, printed. A pass that writes takes the lease first (waiting at most one
    lease duration for a holder that stopped renewing), so it never acts beside a running
    controller; it gives the lease back after."""
    if elector is not None and elector.elect:
        deadline = time.monotonic() + elector.settings.duration_s + elector.settings.retry_s
        while not elector.try_acquire_or_renew():
            if time.monotonic() > deadline:
                lease = elector.store.get()
                holder = lease.spec.get("holderIdentity") if lease else "?"
                typer.echo(
                    f"another controller holds the lease ({holder}): stop it, or use --dry-run",
                    err=True,
                )
                raise typer.Exit(CliExit.CANNOT_TELL)
            time.sleep(elector.settings.retry_s)
    try:
        result = ctl.reconcile()
    finally:
        if elector is not None:
            elector.release()
    if not result.listed:
        typer.echo("could not list the nodes", err=True)
        raise typer.Exit(CliExit.CANNOT_TELL)
    for name, d in sorted(result.decisions.items()):
        ops = ",".join(op.kind.value for op in d.ops) or "-"
        typer.echo(f"{name}\t{d.state.value}\t{ops}\t{d.held or d.reason}")
