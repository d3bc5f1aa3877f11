"""`python -m gpuvigil.training.launch ...`: torchrun, with a monitor, drains and exit codes.

Takes exactly torchrun's arguments and runs torchrun's own agent in this process, plus:
- **restarts that work on many nodes**: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, so each
  rendezvous round gives the workers a fresh store (the job-long store of the first round
  holds stale keys that make restarted workers hang, and per-agent restart counts cannot
  name a round consistently across nodes);
- **a monitor outside the ranks** (`monitor`): names a frozen or dead rank with its node
  and gets the group restarting within its hang timeout plus a few seconds;
- **drains that exit 89**: torchrun waits `monitor.shutdown_timeout_s` (not its default
  30 s) for ranks finishing a step and a save after SIGTERM, and this process then exits
  with `exit_codes.DRAINED` when every local rank drained (plain torchrun exits 1);
- **no restart that cannot help**: a rank that exits with a code whose retry is FAIL (91
  every checkpoint damaged, 92 a loader that cannot resume exactly) ends the job at once,
  without spending torchrun's restarts;
- **`--allow-fresh-start`** (before the script, among torchrun's options): sets
  `checkpoint.allow_fresh_start` for the ranks, which then start again at step 0 when no
  checkpoint verifies instead of exiting 91;
- **the job's exit code**: when torchrun gives up, this process exits with the first failed
  rank's code (86-90 stay what they are: a hang, a bad node, a drain, failed saves; a
  signal becomes 128 + N) and writes `job.end` on the node of rank 0: failed, or
  `interrupted` for a code a retry spares (89, 87, 88), which is no verdict on the job.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from gpuvigil.core import exit_codes
from gpuvigil.core.events import Event, EventWriter, Kind
from gpuvigil.training import heartbeat, identity, lifecycle
from gpuvigil.training.config import TrainingConfig
from gpuvigil.training.monitor import Monitor

log = logging.getLogger("gpuvigil.training.launch")

ALLOW_FRESH_START = "--allow-fresh-start"
ALLOW_FRESH_START_ENV = "GPUVIGIL__TRAINING__CHECKPOINT__ALLOW_FRESH_START"


def own_flags(argv: list[str], *, script: str) -> tuple[list[str], bool]:
    """(torchrun's arguments, allow_fresh_start): the launcher's own flag counts only
    before the training script; after it, the flag is the script's."""
    at = argv.index(script) if script in argv else len(argv)
    ours = ALLOW_FRESH_START in argv[:at]
    return [a for a in argv[:at] if a != ALLOW_FRESH_START] + argv[at:], ours


def hopeless(failures: dict[int, Any]) -> bool:
    """Some rank exited with a code whose retry is FAIL: another attempt cannot help."""
    return any(
        exit_codes.lookup(exit_code_of(int(f.exitcode))).retry is exit_codes.Retry.FAIL
        for f in failures.values()
    )


def _agent_class(monitor: Monitor, codes: dict[int, int]) -> Any:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class MonitoredAgent(LocalElasticAgent):  # type: ignore[misc]
        """torchrun's agent, telling the monitor which ranks died and how ranks ended."""

        def _monitor_workers(self, worker_group: Any) -> Any:
            result = super()._monitor_workers(worker_group)
            if result.is_failed():
                monitor.failed(result.failures)
                if hopeless(result.failures) and self._remaining_restarts > 0:
                    log.error(
                        "gpuvigil launch: a rank exited with a code no restart can help; not "
                        "restarting (%d restarts left unused)",
                        self._remaining_restarts,
                    )
                    self._remaining_restarts = 0
            return result

        def _start_workers(self, worker_group: Any) -> Any:
            log.info(
                "gpuvigil launch: starting the workers (restarts left: %s)",
                self._remaining_restarts,
            )
            return super()._start_workers(worker_group)

        def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
            super()._shutdown(death_sig, timeout)
            pc = getattr(self, "_pcontext", None)
            for local, handler in (getattr(pc, "subprocess_handlers", None) or {}).items():
                rc = handler.proc.returncode
                if rc is not None:
                    codes[local] = rc

    return MonitoredAgent


def exit_code_of(code: int) -> int:
    """A worker's exit status as a process exit code (a signal N becomes 128 + N)."""
    return exit_codes.SIGNAL_BASE - code if code < 0 else code


def _end_event(monitor: Monitor, config: TrainingConfig, *, code: int, reason: str) -> None:
    """job.end (failed, or interrupted by a drain) from the node that ran rank 0 last. It
    names the culprit the exit records name (the drained node, not rank 0's own, which is
    as often its healthy peer); without one, the node only when every rank ran on it."""
    from gpuvigil.training.storage import open_storage

    infos = [i for _, i in monitor.ranks()]
    if not any(i.get("rank") == 0 for i in infos):
        return
    info = next(i for i in infos if i.get("rank") == 0)
    path = info.get("events_file") or config.events_file
    if not path:
        return
    data: dict[str, Any] = {
        # A code a retry spares (a drain) is no verdict: the job goes on elsewhere.
        "result": "interrupted"
        if exit_codes.lookup(code).retry is exit_codes.Retry.IGNORE
        else "failed",
        "exit_code": code,
        "reason": reason,
        # No exit record names a culprit: the code says what was seen (the one table).
        "cause": lifecycle.cause_of(lifecycle.kind_of_exit(code)).value,
        "kind": lifecycle.kind_of_exit(code),
    }
    nodes = {str(i.get("node")) for i in infos if i.get("node")}
    node = next(iter(nodes)) if len(nodes) == 1 else None
    where = info.get("checkpoint_dir") or config.checkpoint.dir
    if where:
        try:
            records, _ = lifecycle.read_exits(open_storage(str(where)))
        except Exception as e:  # noqa: BLE001 - the event must still be written
            log.warning("gpuvigil launch: cannot read the exit records: %s", e)
            records = []
        c = lifecycle.culprit(records)
        if c is not None:
            node = c.node
            data.update(node=c.node, rank=c.rank, cause=c.cause.value, kind=c.kind)
    with EventWriter(Path(path)) as w:
        w.write(
            Event(
                ts=time.time(),
                kind=Kind.JOB_END,
                source="training",
                node=node,
                job=info.get("job"),
                data=data,
            )
        )


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher import api as launcher_api
    from torch.distributed.run import parse_args, run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s launch %(message)s")
    config = TrainingConfig.load()
    raw = list(argv if argv is not None else sys.argv[1:])
    script = parse_args([a for a in raw if a != ALLOW_FRESH_START]).training_script
    raw, fresh = own_flags(raw, script=script)
    args = parse_args(raw)
    if fresh:
        os.environ[ALLOW_FRESH_START_ENV] = "true"
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if not config.job_id:  # one name for the job in every rank's events and in ours
        rdzv = None if args.standalone else getattr(args, "rdzv_id", None)
        os.environ["GPUVIGIL_JOB_ID"] = str(rdzv or uuid.uuid4())
    if getattr(args, "shutdown_timeout", None) is None:
        args.shutdown_timeout = config.monitor.shutdown_timeout_s
    run_dir = Path(tempfile.mkdtemp(prefix="gpuvigil-run-"))
    os.environ[heartbeat.RUN_DIR_ENV] = str(run_dir)
    monitor = Monitor(config, run_dir, node=identity.node_name(config, os.environ)).start()
    codes: dict[int, int] = {}
    launcher_api.LocalElasticAgent = _agent_class(monitor, codes)
    try:
        run(args)
        return exit_codes.SUCCESS
    except ChildFailedError as e:
        _rank, first = e.get_first_failure()
        code = exit_code_of(int(first.exitcode))
        what = exit_codes.lookup(code)
        log.error(
            "gpuvigil launch: torchrun gave up; exiting with %d (%s: %s)",
            code,
            what.name,
            what.meaning,
        )
        _end_event(monitor, config, code=code, reason=f"{what.name}: {what.meaning}")
        return code
    except SignalException as e:
        drained = bool(codes) and all(c == exit_codes.DRAINED for c in codes.values())
        code = exit_codes.DRAINED if drained else exit_codes.SIGNAL_BASE + int(e.sigval)
        log.warning(
            "gpuvigil launch: got %s; local ranks ended with %s; exiting with %d%s",
            e.sigval.name,
            dict(sorted(codes.items())),
            code,
            " (DRAINED: every rank saved its checkpoint)" if drained else "",
        )
        return code
    finally:
        monitor.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
