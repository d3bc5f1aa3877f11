"""The fail-closed runner: the only way gpuvigil runs an external command.

Argument lists only (never a shell string); a timeout on every call; the child runs in its
own process group and the whole group is killed on timeout, so a tool whose child hangs
leaves nothing behind; stdout and stderr are captured with a size bound, so a tool that
prints gigabytes cannot exhaust memory. Each failure maps once to a finding code.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuvigil.core.findings import Action, Finding, Status

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_OUTPUT = 8 * 1024 * 1024  # per stream; nvidia-smi -q -x on 8 GPUs is ~1 MB
STDERR_TAIL = 2000


@dataclass(frozen=True)
class ExecResult:
    """What a command did. `error` is None only when it ran to completion (any exit code)."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: bytes
    stderr: bytes
    duration_s: float
    error: str | None = None  # "missing" | "timeout" | "oserror"
    truncated: bool = False
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    def stderr_tail(self, limit: int = STDERR_TAIL) -> str:
        return self.stderr[-limit:].decode("utf-8", errors="replace").strip()

    def evidence(self) -> dict[str, object]:
        ev: dict[str, object] = {
            "argv": list(self.argv),
            "exit_status": self.returncode,
            "duration_s": round(self.duration_s, 3),
        }
        if self.error:
            ev["error"] = self.error
        if self.stderr:
            ev["stderr_tail"] = self.stderr_tail()
        if self.truncated:
            ev["output_truncated"] = True
        return ev


@dataclass
class _Capture:
    limit: int
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    truncated: bool = False

    def feed(self, data: bytes) -> None:
        room = self.limit - self.size
        if room <= 0:
            self.truncated = True
            return
        if len(data) > room:
            data, self.truncated = data[:room], True
        self.chunks.append(data)
        self.size += len(data)

    def value(self) -> bytes:
        return b"".join(self.chunks)


def resolve(binary: str, path: str | None = None) -> str | None:
    """The absolute path of `binary` on PATH (or `path`), or None."""
    if os.sep in binary:
        return binary if os.access(binary, os.X_OK) else None
    return shutil.which(binary, path=path)


def run(
    argv: Sequence[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_output: int = DEFAULT_MAX_OUTPUT,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
) -> ExecResult:
    """Run `argv` with a deadline; never raises for the command's own failures."""
    argv = tuple(argv)
    started = time.monotonic()
    exe = resolve(argv[0], path=(env or os.environ).get("PATH")) if argv else None
    if exe is None:
        return ExecResult(
            argv, None, b"", b"", 0.0, error="missing", detail=f"{argv[:1]} not found"
        )
    try:
        proc = subprocess.Popen(
            [exe, *argv[1:]],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            start_new_session=True,  # own process group: the whole tree dies on timeout
        )
    except OSError as e:
        kind = "missing" if isinstance(e, FileNotFoundError | PermissionError) else "oserror"
        return ExecResult(
            argv, None, b"", b"", time.monotonic() - started, error=kind, detail=str(e)
        )

    if stdin is not None and proc.stdin is not None:
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except OSError:
            pass
    out, err = _Capture(max_output), _Capture(max_output)
    deadline = started + timeout_s
    timed_out = _pump(proc, out, err, deadline)
    if timed_out:
        _kill_group(proc)
    else:
        remaining = max(0.05, deadline - time.monotonic())
        try:
            proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    # Even after a clean exit, children may linger in the group (a daemonised helper that
    # hangs); they are ours to clean up.
    _kill_group(proc, quiet=True)
    duration = time.monotonic() - started
    return ExecResult(
        argv,
        None if timed_out else proc.returncode,
        out.value(),
        err.value(),
        duration,
        error="timeout" if timed_out else None,
        truncated=out.truncated or err.truncated,
        detail=f"no exit after {timeout_s:g} s" if timed_out else "",
    )


def _pump(proc: subprocess.Popen[bytes], out: _Capture, err: _Capture, deadline: float) -> bool:
    """Read both pipes until EOF or the deadline; True when the deadline passed."""
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            for key, _ in sel.select(timeout=remaining):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                key.data.feed(data)
        return False
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()


def _kill_group(proc: subprocess.Popen[bytes], *, quiet: bool = False) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if not quiet:
            proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # a process in uninterruptible sleep (D state)
        pass


def failure_finding(
    result: ExecResult,
    *,
    check: str,
    component: str = "node",
    what: str | None = None,
) -> Finding | None:
    """The fail-closed finding for a command that did not succeed, or None when it did."""
    tool = what or os.path.basename(result.argv[0]) if result.argv else "command"
    if result.error == "missing":
        code, msg = "DEPENDENCY_MISSING", f"{tool} is not installed or not executable"
    elif result.error == "timeout":
        code, msg = "CHECK_TIMEOUT", f"{tool} did not finish within {result.duration_s:.1f} s"
    elif result.error is not None:
        code, msg = "CHECK_ERROR", f"{tool} could not be started: {result.detail}"
    elif result.returncode != 0:
        tail = result.stderr_tail(300)
        code, msg = "CHECK_ERROR", f"{tool} exited with status {result.returncode}: {tail}"
    else:
        return None
    return Finding(
        check=check,
        status=Status.FAILED,
        code=code,
        component=component,
        message=msg,
        action=Action.NONE,
        evidence=result.evidence(),
    )


def unparsable_finding(
    result: ExecResult, *, check: str, problem: str, component: str = "node"
) -> Finding:
    """Output that does not parse is a failure of the check, never a pass."""
    ev = result.evidence()
    ev["stdout_head"] = result.stdout[:500].decode("utf-8", errors="replace")
    return Finding(
        check=check,
        status=Status.FAILED,
        code="CHECK_ERROR",
        component=component,
        message=f"{os.path.basename(result.argv[0])} printed output that does not parse: {problem}",
        evidence=ev,
    )
