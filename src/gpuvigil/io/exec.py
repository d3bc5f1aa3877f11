"""The fail-closed runner: the only way gpuvigil runs an external command.

Argument lists only (never a shell string); a timeout on every call; stdout and stderr
are captured with a size bound, so a tool that prints gigabytes cannot exhaust memory.
Each failure maps once to a finding code, and only a complete, normal exit is a reading:
output cut at the bound cannot be judged (CHECK_ERROR: "could not tell"), and a tool
killed by a signal failed whatever it printed first.

The whole process tree dies at the deadline (and after a normal exit, anything the tool
left behind): the child runs in its own process group, every descendant found under it
is killed, and so is any process that left the group with `setsid`. For the last, the
agent's process is a child subreaper (`PR_SET_CHILD_SUBREAPER`, `become_subreaper()`), so
a daemonised grandchild whose parent exited is re-parented to it instead of to init, and
each run's environment is marked (`GPUVIGIL_RUN`), so such an orphan is recognised among
its children, killed and reaped. At a deadline (and after every run in a process that is
not a subreaper: `gpuvigil check`, preflight, `slurm-healthcheck`), /proc is also scanned
for the run's mark and the tool's session, so an escapee that init adopted (its parent
exited before the deadline) dies too. A cgroup would do the same, but a DaemonSet rarely
may create one.

Only the agent opts in: a subreaper also adopts the orphans of every daemon it ever
started, and they would live on as its children. A controller, a test session or a
program that imports gpuvigil as a library (any of which may have started daemons that
detach, as slurmd does with each slurmstepd) keeps init as their reaper.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from gpuvigil.core.findings import Action, Finding, Status

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_OUTPUT = 8 * 1024 * 1024  # per stream; nvidia-smi -q -x on 8 GPUs is ~1 MB
STDERR_TAIL = 2000
RUN_MARK = "GPUVIGIL_RUN"  # in each run's environment: finds its setsid escapees
PR_SET_CHILD_SUBREAPER = 36


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
    max_output: int = DEFAULT_MAX_OUTPUT  # the bound `truncated` refers to

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0

    @property
    def exited(self) -> bool:
        """It ran to its own end: exited (any status), not killed by a signal, output whole.
        Only then may a non-zero exit's output still be read (nvidia-smi with a lost GPU)."""
        return self.error is None and (self.returncode or 0) >= 0 and not self.truncated

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
    mark = uuid.uuid4().hex
    try:
        proc = subprocess.Popen(
            [exe, *argv[1:]],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**(os.environ if env is None else env), RUN_MARK: mark},
            start_new_session=True,  # own process group: the whole tree dies on timeout
        )
    except OSError as e:
        kind = "missing" if isinstance(e, FileNotFoundError | PermissionError) else "oserror"
        return ExecResult(
            argv, None, b"", b"", time.monotonic() - started, error=kind, detail=str(e)
        )

    out, err = _Capture(max_output), _Capture(max_output)
    deadline = started + timeout_s
    timed_out = _pump(proc, out, err, deadline, stdin)
    if not timed_out:
        remaining = max(0.05, deadline - time.monotonic())
        try:
            proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
    # At the deadline the whole tree dies; after a clean exit, whatever the tool left
    # behind (a daemonised helper that hangs, in the group or escaped with setsid) too.
    _kill_tree(proc, mark, scan=timed_out or not _subreaper)
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
        max_output=max_output,
    )


class Spawned:
    """A tool that runs beside us with pipes to its input and output (`spawn`), for a
    caller that talks to it while it runs (one grep for a whole log, fed chunk by chunk).
    Its deadlines are the caller's; `close()` ends it as `run` ends a tool: the whole
    tree dies and is reaped, and the pipes are closed."""

    def __init__(self, proc: subprocess.Popen[bytes], mark: str) -> None:
        self.proc, self.mark = proc, mark
        self.stopped = self.closed = False

    def stop(self) -> None:
        """Kill and reap it (a thread blocked writing to it gets EPIPE); pipes stay open."""
        if not self.stopped:
            self.stopped = True
            _kill_tree(self.proc, self.mark, scan=not _subreaper)

    def close(self) -> None:
        """`stop()`, then close the pipes: only once no thread of ours uses them (a closed
        descriptor number is reused by the next file opened)."""
        self.stop()
        if not self.closed:
            self.closed = True
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    _close_quietly(pipe)


def spawn(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Spawned | str:
    """Start `argv` with its standard input and output on pipes (standard error
    discarded), in its own process group; what went wrong ("missing", "oserror") when it
    could not start. The caller must `close()` it."""
    exe = resolve(argv[0], path=(env or os.environ).get("PATH")) if argv else None
    if exe is None:
        return "missing"
    mark = uuid.uuid4().hex
    try:
        proc = subprocess.Popen(
            [exe, *argv[1:]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**(os.environ if env is None else env), RUN_MARK: mark},
            start_new_session=True,  # own process group: the whole tree dies on close
        )
    except OSError as e:
        return "missing" if isinstance(e, FileNotFoundError | PermissionError) else "oserror"
    return Spawned(proc, mark)


def _pump(
    proc: subprocess.Popen[bytes],
    out: _Capture,
    err: _Capture,
    deadline: float,
    stdin: bytes | None = None,
) -> bool:
    """Feed `stdin` and read both pipes until EOF or the deadline; True when the deadline
    passed. The input is written as the tool reads it, in the same loop as its output is
    read: written whole first, a tool that answers as it reads (grep on 8 MiB) fills its
    output pipe, stops reading, and both sides wait for ever."""
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    feed = memoryview(stdin) if stdin is not None else None
    if proc.stdin is not None:
        if feed:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE, None)
        else:
            proc.stdin.close()
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            for key, _ in sel.select(timeout=remaining):
                if key.fileobj is proc.stdin:
                    feed = _write_some(proc.stdin, feed, sel)
                    continue
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                key.data.feed(data)
        return False
    finally:
        sel.close()
        if proc.stdin is not None and not proc.stdin.closed:
            _close_quietly(proc.stdin)
        proc.stdout.close()
        proc.stderr.close()


def _write_some(pipe: IO[bytes], feed: memoryview | None, sel: selectors.BaseSelector
                ) -> memoryview | None:  # fmt: skip
    """Write what the pipe takes now; unregister and close it when all is written or the
    tool stopped reading (it exited, or does not want the rest: not our error)."""
    try:
        n = os.write(pipe.fileno(), feed[:65536]) if feed else 0
    except BlockingIOError:
        return feed
    except OSError:  # EPIPE: the tool is gone or closed its input
        n, feed = 0, None
    rest = feed[n:] if feed is not None else None
    if not rest:
        sel.unregister(pipe)
        _close_quietly(pipe)
        return None
    return rest


def _close_quietly(pipe: IO[bytes]) -> None:
    try:
        pipe.close()
    except OSError:
        pass


_subreaper_lock = threading.Lock()
_subreaper: bool | None = None


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux 3.4+), once: a
    tool's grandchild that escapes with `setsid` is then re-parented to us, where
    `_kill_tree` finds it. False where the kernel or libc does not offer it. Called by
    the agent's process only (see the module's note)."""
    global _subreaper
    with _subreaper_lock:
        if _subreaper is None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                _subreaper = False
        return _subreaper


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (/proc/<pid>/task/<tid>/children; cheap: no /proc scan)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


def _tree(root: int) -> set[int]:
    """`root` and every descendant it has now."""
    seen, todo = {root}, [root]
    while todo and len(seen) < 10_000:
        for c in _children(todo.pop()):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def _marked(pid: int, mark: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{RUN_MARK}={mark}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _scan(mark: str, session: int | None) -> set[int]:
    """Every process in /proc that carries this run's mark, or (while the tool is unreaped,
    so its pid is surely its own) is in the tool's session: the escapees whose parent
    exited and that init adopted, where no subreaper caught them. ~10 ms per 100
    processes, so only at a deadline, or after any run where we are not a subreaper."""
    me, found = os.getpid(), set()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if pid == me:
            continue
        if (session is not None and _session(pid) == session) or _marked(pid, mark):
            found.add(pid)
    return found


def _session(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[3])  # field 6: session id
    except (OSError, ValueError, IndexError):
        return None


def _kill_tree(proc: subprocess.Popen[bytes], mark: str, *, scan: bool = False) -> None:
    """SIGKILL the tool's process group, every descendant under it, every orphan of this
    run that was re-parented to us (setsid escapees whose parent died) and, with `scan`,
    every process of this run anywhere (`_scan`); then reap them. Processes of other runs
    and our other children are never touched."""
    # Only while it is unreaped is its pid surely still the tool's (never kill a reused pid).
    alive = proc.poll() is None
    doomed = _tree(proc.pid) if alive else set()
    if scan:
        doomed |= _scan(mark, proc.pid if alive else None)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _kill_all(doomed)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # a process in uninterruptible sleep (D state)
        pass
    if scan:  # anything it forked between the scan and its death
        _kill_all(_scan(mark, None) - doomed)
    me = os.getpid()
    for _ in range(5):  # killed parents re-parent their children to us: sweep until none
        mine = [c for c in _children(me) if c != proc.pid]
        ours = {c for c in mine if c in doomed or _marked(c, mark)}
        escaped = set().union(*(_tree(c) for c in ours)) - doomed if ours else set()
        if not ours and not escaped:
            break
        doomed |= ours | escaped
        _kill_all(ours | escaped)
        _reap(ours)


def _reap(pids: set[int], *, within_s: float = 1.0) -> None:
    """Collect the exit of killed children of ours (never blocking on one stuck in D)."""
    left, end = set(pids), time.monotonic() + within_s
    while left and time.monotonic() < end:
        for c in list(left):
            try:
                done, _ = os.waitpid(c, os.WNOHANG)
            except ChildProcessError:
                done = c
            if done:
                left.discard(c)
        if left:
            time.sleep(0.01)


def failure_finding(
    result: ExecResult,
    *,
    check: str,
    component: str = "node",
    what: str | None = None,
) -> Finding | None:
    """The fail-closed finding for a command that did not succeed, or None when it did."""
    tool = what or os.path.basename(result.argv[0]) if result.argv else "command"
    rc = result.returncode
    if result.error == "missing":
        code, msg = "DEPENDENCY_MISSING", f"{tool} is not installed or not executable"
    elif result.error == "timeout":
        code, msg = "CHECK_TIMEOUT", f"{tool} did not finish within {result.duration_s:.1f} s"
    elif result.error is not None:
        code, msg = "CHECK_ERROR", f"{tool} could not be started: {result.detail}"
    elif rc is not None and rc < 0:
        # Whatever it printed before, a tool that died is not a verdict.
        code, msg = "CHECK_ERROR", f"{tool} was killed by {_signal_name(-rc)}"
    elif rc != 0:
        tail = result.stderr_tail(300)
        code, msg = "CHECK_ERROR", f"{tool} exited with status {rc}: {tail}"
    elif result.truncated:
        cut = f"{tool} printed more than {result.max_output} bytes"
        code, msg = "CHECK_ERROR", f"{cut}: the output was cut, so it cannot be judged"
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


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"
