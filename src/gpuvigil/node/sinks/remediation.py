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

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import utcnow
from gpuvigil.core.wire import Outcome, RemediationRequest, RemediationResult
from gpuvigil.io import exec as ex
from gpuvigil.node.checks.gpu.readings import GpuReset

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


Answer = Callable[[RemediationResult], None]
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
        self._done: dict[str, RemediationResult] = {}  # results to re-send if a write failed
        self._lock = threading.Lock()

    def result(
        self, req: RemediationRequest, result: Outcome, detail: str, *, boot_id: str = ""
    ) -> RemediationResult:
        """The answer; `detail` says what the fields do not (never "REBOOT started")."""
        return RemediationResult(
            id=req.id,
            action=req.action,
            result=result,
            at=utcnow(),
            detail=detail[:500],
            boot_id=boot_id[:64],
        )

    def handle(
        self, req: RemediationRequest | None, last: RemediationResult | None, answer: Answer
    ) -> None:
        """Called on every publish with the current request and this agent's last answer
        to it (from its ledger)."""
        if req is None:
            return
        same = last is not None and last.id == req.id
        if same and last.final:
            return  # done already: idempotent by id
        with self._lock:
            if same and last.result == "started":
                if req.id in self._done:
                    answer(self._done[req.id])  # the first write of the result failed
                    return
                self._resume(req, last, answer)
                return
            if self._busy == req.id:
                return  # running; its `started` answer is not visible yet
            action = req.action
            if action not in ACTIONS:
                answer(self.result(req, "failed", f"unknown action {action!r}"))
                return
            if not self.config.enabled:
                answer(self.result(req, "failed", "remediation disabled on this node"))
                return
            self._busy = req.id
        # Record `started` before acting: a crash after this point never repeats the action.
        try:
            boot = read_boot_id(self.config.boot_id_path)
            answer(self.result(req, "started", _doing(req, boot), boot_id=boot))
        except BaseException:
            with self._lock:
                self._busy = None  # not recorded, so not run: the next publish retries
            raise
        threading.Thread(
            target=self._act, args=(req, answer), name="remediation", daemon=True
        ).start()

    def _resume(self, req: RemediationRequest, last: RemediationResult, answer: Answer) -> None:
        if req.action == "REBOOT":
            now_id = read_boot_id(self.config.boot_id_path)
            if now_id and last.boot_id and now_id != last.boot_id:
                answer(self.result(req, "succeeded", "node rebooted (boot id changed)"))
            return  # still waiting for the reboot; the controller owns the deadline
        if self._busy != req.id:  # an earlier agent died during the reset
            answer(self.result(req, "failed", "agent restarted while the action ran"))

    def _act(self, req: RemediationRequest, answer: Answer) -> None:
        ok, detail = False, "remediation crashed"
        started = utcnow()
        try:
            ok, detail = self._run(req)
            if ok and req.action == "RESET_GPU" and self.on_reset is not None:
                self.on_reset(
                    GpuReset(
                        at=started,
                        gpus=req.gpus,
                        boot_id=read_boot_id(self.config.boot_id_path) or None,
                    )
                )
        finally:
            if req.action == "REBOOT" and ok:
                # `succeeded` is written once the boot id has changed; stay busy so the
                # request is never run twice by this process.
                log.warning("reboot command accepted: waiting for the node to go down")
            else:
                done = self.result(req, "succeeded" if ok else "failed", detail)
                with self._lock:
                    self._done[req.id], self._busy = done, None
                try:
                    answer(done)
                except Exception as e:  # noqa: BLE001 - re-sent on the next publish
                    log.warning("writing the remediation result failed: %s", e)

    def _run(self, req: RemediationRequest) -> tuple[bool, str]:
        c = self.config
        if req.action == "REBOOT":
            plans = [c.reboot_argv]
        else:
            gpus = req.gpus  # validated by `wire.decode_request`: indices >= 0
            plans = [[a.replace("{gpu}", str(g)) for a in c.reset_gpu_argv] for g in gpus] or [
                c.reset_all_argv
            ]
        details = []
        for argv in plans:
            res = ex.run(argv, timeout_s=c.timeout_s, env=self.env)
            bad = ex.failure_finding(res, check="remediation")
            log.warning(
                "remediation %s: %s -> %s", req.id, argv, "ok" if bad is None else bad.message
            )
            if bad is not None:
                return False, f"{' '.join(argv)}: {bad.code}: {bad.message}"
            details.append(" ".join(argv))
        return True, "ran: " + "; ".join(details)


def _doing(req: RemediationRequest, boot: str) -> str:
    """What a `started` answer adds to its action and result: on what, from where."""
    if req.action == "RESET_GPU":
        gpus = ", ".join(map(str, req.gpus))
        return f"resetting GPU {gpus}" if gpus else "resetting every GPU"
    if req.action == "REBOOT":
        return f"rebooting from boot {boot[:8]}" if boot else "rebooting"
    return ""
