"""`gpuvigil agent`: the periodic node agent with its sinks (runs on every GPU machine)."""

from __future__ import annotations

import logging
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuvigil import config as gconfig
from gpuvigil.core.cli_exit import CliExit

HELP = """Run the node agent: checks on schedules, the kernel log as a stream, and the
verdict published to the chosen sinks until stopped (SIGTERM/SIGINT).

Fast checks (NVML, fabric, PCIe, topology) run every --interval seconds (default 30),
`dcgmi health` every 5 min, a short DCGM diag every 6 h when DCGM is installed; the
kernel log is followed from /dev/kmsg (fallbacks: dmesg, journalctl). Each check runs
under its own deadline: a hung check is CHECK_TIMEOUT, a result older than twice its
interval is RESULT_STALE, both FAILED; nothing else waits for them.

Sinks: state-file (default on, /run/gpuvigil/report.json), http (default on,
0.0.0.0:9410: /metrics, /healthz, /report), kubernetes (node conditions, the
gpuvigil.io/health annotation, Events, remediation requests), slurm (the node's Extra
field; --slurm-mode standalone also drains on fatal findings). --sink picks exactly
the sinks to run, overriding the config.

Settings come from --config (YAML, `agent:` and `node:` sections), then
GPUVIGIL__AGENT__<KEY> environment variables, then these flags.

Exit status: 0 after a clean stop, 2 bad config, 3 the agent's own loop stalled (its
self-watchdog fired; the supervisor should restart it).

Try it without a GPU: gpuvigil agent --expect-gpus 0 --kmsg-file ./kern.log --state-file
./report.json --listen 127.0.0.1:9410 --interval 5 --sink state-file --sink http
"""
# One line per paragraph: the help renderer re-wraps text to the terminal's width.
HELP = "\n\n".join(" ".join(p.split()) for p in HELP.split("\n\n"))


class SinkName(StrEnum):
    state_file = "state-file"
    http = "http"
    kubernetes = "kubernetes"
    slurm = "slurm"


def overrides_from_flags(
    *,
    kmsg_file: Path | None,
    state_file: Path | None,
    interval: float | None,
    expect_gpus: int | None,
    sysfs_root: Path | None,
    listen: str | None,
    node_name: str | None,
    sinks: list[SinkName] | None,
    slurm_mode: str | None,
    kubeconfig: Path | None,
    events_file: Path | None,
    state_dir: Path | None = None,
    context: str | None = None,
) -> dict[str, Any]:
    agent: dict[str, Any] = {}
    sink_cfg: dict[str, Any] = {}
    if kmsg_file is not None:
        agent["kernel_log"] = {"source": "file", "file": str(kmsg_file)}
    if interval is not None:
        agent["fast_interval_s"] = interval
    if sysfs_root is not None:
        agent["sysfs_root"] = str(sysfs_root)
    if node_name:
        agent["node_name"] = node_name
    if events_file is not None:
        agent["events_file"] = str(events_file)
    if state_dir is not None:
        agent["state_dir"] = str(state_dir)
    if state_file is not None:
        sink_cfg["state_file"] = {"path": str(state_file)}
    if listen is not None:
        sink_cfg["http"] = {"listen": listen}
    if slurm_mode is not None:
        sink_cfg.setdefault("slurm", {})["mode"] = slurm_mode
    if kubeconfig is not None:
        sink_cfg.setdefault("kubernetes", {})["kubeconfig"] = str(kubeconfig)
    if context:
        sink_cfg.setdefault("kubernetes", {})["context"] = context
    if sinks:
        chosen = {s.value.replace("-", "_") for s in sinks}
        for name in ("state_file", "http", "kubernetes", "slurm"):
            sink_cfg.setdefault(name, {})["enabled"] = name in chosen
    if sink_cfg:
        agent["sinks"] = sink_cfg
    out: dict[str, Any] = {"agent": agent} if agent else {}
    if expect_gpus is not None:
        out["node"] = {"expect_gpus": expect_gpus}
    return out


def register(app: typer.Typer) -> None:
    @app.command("agent", help=HELP)
    def agent(  # noqa: PLR0917 - one parameter per flag is how typer declares them
        config: Annotated[
            Path | None,
            typer.Option("--config", help="YAML config file (default: $GPUVIGIL_CONFIG)."),
        ] = None,
        kmsg_file: Annotated[
            Path | None,
            typer.Option(
                "--kmsg-file",
                help="Follow this file as the kernel log instead of /dev/kmsg "
                "(lines appended later are read as they come).",
            ),
        ] = None,
        state_file: Annotated[
            Path | None,
            typer.Option(
                "--state-file", help="Where the latest NodeReport JSON is written atomically."
            ),
        ] = None,
        interval: Annotated[
            float | None,
            typer.Option(
                "--interval", min=0.1, help="Seconds between fast-check runs (default 30)."
            ),
        ] = None,
        expect_gpus: Annotated[
            int | None,
            typer.Option(
                "--expect-gpus", min=0, help="GPUs this node must have (GPU_COUNT_LOW below)."
            ),
        ] = None,
        sysfs_root: Annotated[
            Path | None,
            typer.Option(
                "--sysfs-root",
                help="Read /sys and /dev below this folder (a fake or captured tree).",
            ),
        ] = None,
        listen: Annotated[
            str | None,
            typer.Option(
                "--listen",
                help="HOST:PORT for /metrics, /healthz, /report (default "
                "0.0.0.0:9410; port 0 picks a free one).",
            ),
        ] = None,
        node_name: Annotated[
            str | None,
            typer.Option(
                "--node-name",
                help="This node's name in Kubernetes/Slurm (default $NODE_NAME, "
                "else the short host name).",
            ),
        ] = None,
        sink: Annotated[
            list[SinkName] | None,
            typer.Option("--sink", help="Publish to exactly these sinks (repeat the flag)."),
        ] = None,
        slurm_mode: Annotated[
            str | None,
            typer.Option(
                "--slurm-mode",
                help="publish (write the Extra field only) or standalone "
                "(also drain on fatal findings and resume after they clear).",
            ),
        ] = None,
        kubeconfig: Annotated[
            Path | None,
            typer.Option(
                "--kubeconfig",
                help="Kubeconfig for the kubernetes sink (default: in-cluster "
                "service account, else $KUBECONFIG).",
            ),
        ] = None,
        context: Annotated[
            str | None,
            typer.Option("--context", help="Kubeconfig context for the kubernetes sink."),
        ] = None,
        events_file: Annotated[
            Path | None, typer.Option("--events-file", help="Append finding events (JSONL) here.")
        ] = None,
        state_dir: Annotated[
            Path | None,
            typer.Option(
                "--state-dir",
                help="Where the agent keeps the Xid events that must outlive a reboot "
                "(REPLACE/INVESTIGATE) and the `released-at` marker (default "
                "/var/lib/gpuvigil).",
            ),
        ] = None,
        log_level: Annotated[
            str, typer.Option("--log-level", help="debug, info, warning, error.")
        ] = "info",
    ) -> None:
        logging.basicConfig(
            level=getattr(logging, log_level.upper(), logging.INFO),
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        if slurm_mode not in (None, "publish", "standalone"):
            typer.echo(f"--slurm-mode must be publish or standalone, not {slurm_mode!r}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL)
        path = config or (
            Path(os.environ["GPUVIGIL_CONFIG"]) if os.environ.get("GPUVIGIL_CONFIG") else None
        )
        over = overrides_from_flags(
            kmsg_file=kmsg_file,
            state_file=state_file,
            interval=interval,
            expect_gpus=expect_gpus,
            sysfs_root=sysfs_root,
            listen=listen,
            node_name=node_name,
            sinks=sink,
            slurm_mode=slurm_mode,
            kubeconfig=kubeconfig,
            events_file=events_file,
            state_dir=state_dir,
            context=context,
        )
        try:
            cfg = gconfig.load(path, overrides=over)
        except gconfig.ConfigError as e:
            typer.echo(f"gpuvigil agent: {e}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        from gpuvigil.io.exec import become_subreaper
        from gpuvigil.node.compose import build_agent, install_stop_signals

        become_subreaper()  # the tools' setsid escapees come back to us (io.exec)

        try:
            agent_obj, where = build_agent(cfg.agent, node_config=cfg.node)
        except (ValueError, OSError, ImportError) as e:
            typer.echo(f"gpuvigil agent: cannot start: {e}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        install_stop_signals(agent_obj)
        logging.getLogger("gpuvigil.agent").info(
            "agent for node %s: %d checks, publishing to %s",
            agent_obj.node,
            len(agent_obj.scheduler.slots),
            ", ".join(f"{k} ({v})" for k, v in where.items()) or "nothing",
        )
        agent_obj.run()
