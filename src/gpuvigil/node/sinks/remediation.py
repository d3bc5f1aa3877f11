"""Executes the controller's remediation requests on this node (RESET_GPU, REBOOT).

Called by the Kubernetes sink, which reads the request from the node annotation
`core.wire.REQUEST_ANNOTATION` and writes what this module answers into
`core.wire.RESULT_ANNOTATION` (protocol in `core.wire`'s docstring). Commands are
configured argv lists run through the fail-closed runner; `{gpu}` in an element is
replaced by the GPU index. Idempotent by request id: the result is written as `started`
*before* the command runs, so an agent restarted mid-action never runs it twice; a
REBOOT counts as done only when the boot id has changed since it was started.
Runs on its own thread so a 2-minute GPU reset never holds up publishing.

A successful RESET_GPU is recorded (`on_reset`, a typed `GpuReset`: when it started, which
GPUs) before `succeeded` is answered: the agent makes it a fact of the kernel-log rule,
which then clears the reset-class Xids logged before it, re-reads the GPUs and publishes,
so the controller's validation sees the cured node, not the Xid the reset cured.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import utcnow
from gpuvigil.node.probes import exec as ex
from gpuvigil.node.readings import GpuReset

log = logging.getLogger("gpuvigil.agent.remediation")
ACTIONS = ("RESET_GPU", "REBOOT")


class RemediationConfig(StrictModel):
    enabled: bool = Field(
        True,
        description="Act on the controller's requests. False: answer `failed` with "
        "'remediation disabled on this node', so the controller escalates instead of waiting.",
    )
    reset_gpu_argv: list[str] = Field(
        ["nvidia-smi", "--gpu-reset", "-i", "{gpu}"],
        description="Run once per requested GPU; `{gpu}` becomes its index.",
    )
    reset_all_argv: list[str] = Field(
        ["nvidia-smi", "--gpu-reset"], description="For a RESET_GPU naming no GPU."
    )
    reboot_argv: list[str] = Field(
        ["systemctl", "reboot"],
        description="Under Kubernetes the DaemonSet sets "
        "nsenter into PID 1's namespaces first (it runs with hostPID).",
    )
    timeout_s: float = Field(
        180.0, gt=0, description="Deadline per command: a GPU reset takes tens of seconds."
    )
    boot_id_path: Path = Field(
        Path("/proc/sys/kernel/random/boot_id"),
        description="Changes on every boot: how a REBOOT is known to have happened.",
    )


def read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def decode(text: str | None) -> dict[str, Any] | None:
    """A request or result annotation as a dict with an `id`, or None (never raises)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("id"), str):
        return None
    return value


Answer = Callable[[dict[str, Any]], None]
OnReset = Callable[[GpuReset], None]  # blocking: returns once the node's verdict has it


class Remediator:
    def __init__(
        self,
        config: RemediationConfig,
        *,
        env: dict[str, str] | None = None,
        on_reset: OnReset | None = None,
    ) -> None:
        self.config, self.env, self.on_reset = config, env, on_reset
        self._busy: str | None = None
        self._done: dict[str, dict[str, Any]] = {}  # results to re-send if a write failed
        self._lock = threading.Lock()

    def result(self, req: dict[str, Any], result: str, detail: str, **extra: Any) -> dict[str, Any]:
        return {
            "id": req["id"],
            "action": req.get("action"),
            "result": result,
            "at": utcnow().isoformat(),
            "detail": detail[:500],
            **extra,
        }

    def handle(
        self, req: dict[str, Any] | None, last: dict[str, Any] | None, answer: Answer
    ) -> None:
        """Called on every publish with the current request and result annotations."""
        if req is None:
            return
        same = last is not None and last.get("id") == req["id"]
        if same and last.get("result") in ("succeeded", "failed"):
            return  # done already: idempotent by id
        with self._lock:
            if same and last.get("result") == "started":
                if req["id"] in self._done:
                    answer(self._done[req["id"]])  # the first write of the result failed
                    return
                self._resume(req, last, answer)
                return
            if self._busy == req["id"]:
                return  # running; its `started` answer is not visible yet
            action = req.get("action")
            if action not in ACTIONS:
                answer(self.result(req, "failed", f"unknown action {action!r}"))
                return
            if not self.config.enabled:
                answer(self.result(req, "failed", "remediation disabled on this node"))
                return
            self._busy = req["id"]
        # Record `started` before acting: a crash after this point never repeats the action.
        try:
            answer(
                self.result(
                    req,
                    "started",
                    f"{action} started",
                    boot_id=read_boot_id(self.config.boot_id_path),
                )
            )
        except BaseException:
            with self._lock:
                self._busy = None  # not recorded, so not run: the next publish retries
            raise
        threading.Thread(
            target=self._act, args=(req, answer), name="remediation", daemon=True
        ).start()

    def _resume(self, req: dict[str, Any], last: dict[str, Any], answer: Answer) -> None:
        if req.get("action") == "REBOOT":
            now_id = read_boot_id(self.config.boot_id_path)
            if now_id and last.get("boot_id") and now_id != last.get("boot_id"):
                answer(self.result(req, "succeeded", "node rebooted (boot id changed)"))
            return  # still waiting for the reboot; the controller owns the deadline
        if self._busy != req["id"]:  # an earlier agent died during the reset
            answer(self.result(req, "failed", "agent restarted while the action ran"))

    def _act(self, req: dict[str, Any], answer: Answer) -> None:
        ok, detail = False, "remediation crashed"
        started = utcnow()
        try:
            ok, detail = self._run(req)
            if ok and req["action"] == "RESET_GPU" and self.on_reset is not None:
                self.on_reset(
                    GpuReset(
                        at=started,
                        gpus=tuple(_gpus(req)),
                        boot_id=read_boot_id(self.config.boot_id_path) or None,
                    )
                )
        finally:
            if req["action"] == "REBOOT" and ok:
                # `succeeded` is written once the boot id has changed; stay busy so the
                # request is never run twice by this process.
                log.warning("reboot command accepted: waiting for the node to go down")
            else:
                done = self.result(req, "succeeded" if ok else "failed", detail)
                with self._lock:
                    self._done[req["id"]], self._busy = done, None
                try:
                    answer(done)
                except Exception as e:  # noqa: BLE001 - re-sent on the next publish
                    log.warning("writing the remediation result failed: %s", e)

    def _run(self, req: dict[str, Any]) -> tuple[bool, str]:
        c = self.config
        if req["action"] == "REBOOT":
            plans = [c.reboot_argv]
        else:
            gpus = _gpus(req)
            plans = [[a.replace("{gpu}", str(g)) for a in c.reset_gpu_argv] for g in gpus] or [
                c.reset_all_argv
            ]
        details = []
        for argv in plans:
            res = ex.run(argv, timeout_s=c.timeout_s, env=self.env)
            bad = ex.failure_finding(res, check="remediation")
            log.warning(
                "remediation %s: %s -> %s", req["id"], argv, "ok" if bad is None else bad.message
            )
            if bad is not None:
                return False, f"{' '.join(argv)}: {bad.code}: {bad.message}"
            details.append(" ".join(argv))
        return True, "ran: " + "; ".join(details)


def _gpus(req: dict[str, Any]) -> list[int]:
    """The GPU indices a request names (none: every GPU)."""
    gpus = req.get("gpus") or []
    return [g for g in gpus if isinstance(g, int) and not isinstance(g, bool) and g >= 0]
