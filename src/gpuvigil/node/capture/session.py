"""`gpuvigil analyze`: every input of a support bundle -> one NodeReport, and what each input
was taken for.

Two passes, so the kernel log can name GPUs by index: first every document (GPU, DCGM and
fabric outputs, sysfs trees; each read whole under the document cap), then the kernel
logs (streamed), with the GPU map the documents gave. A kernel log on a pipe or standard
input cannot be read twice: it is judged in the first pass, with the GPUs known so far.

Every input is a CheckRun of its own; a finding carries the input it came from
(`evidence.input`). The same finding from two inputs is one finding (the worse one). An
input that cannot be read, or is not recognised, is CHECK_ERROR (could not tell), never
judged and never a pass.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import TypeVar

from gpuvigil.core.findings import CheckRun, Finding, NodeReport, Status, utcnow
from gpuvigil.node.capture import error_text
from gpuvigil.node.capture import judge as judging
from gpuvigil.node.capture.bundle import Entry, Limits, expand
from gpuvigil.node.capture.inputs import Input, InputError, open_input
from gpuvigil.node.capture.kinds import detect, kinds
from gpuvigil.node.catalog import phrases as catalog_phrases
from gpuvigil.node.checks import REGISTRY, CheckContext, run_check
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuRef
from gpuvigil.node.checks.kernel_log import kernel_log_capture
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.sweep import load_checks

T = TypeVar("T")

MAX_DOCUMENT = 64 * 1024 * 1024  # a tool's output read whole; logs are streamed


@dataclass(frozen=True)
class Options:
    node: NodeConfig
    expect: judging.Expect
    limits: Limits = field(default_factory=Limits)
    timeout_s: float = 30.0  # per input
    max_bytes: int = 4 * 1024**3  # per streamed input (a kernel log)
    tz: tzinfo = UTC  # zone of kernel-log stamps printed without one


@dataclass(frozen=True)
class InputResult:
    """What one input was taken for, for people and `--json` (`inputs`)."""

    path: str
    kind: str | None
    how: str  # "detected", "--kind", "skipped: ...", "not recognised", "unreadable: ..."
    status: Status = Status.OK


@dataclass
class _Run:
    opts: Options
    results: list[tuple[list[Finding], CheckRun]] = field(default_factory=list)
    inputs: list[InputResult] = field(default_factory=list)
    gpus: dict[str, GpuRef] = field(default_factory=dict)
    later: list[tuple[Entry, str, str]] = field(default_factory=list)  # kernel logs to read


def analyze(
    paths: list[tuple[str, str | None]], *, opts: Options, node_name: str = "captured"
) -> tuple[NodeReport, list[InputResult]]:
    """`paths`: (path, forced kind or None). Never raises."""
    run = _Run(opts)
    with tempfile.TemporaryDirectory(prefix="gpuvigil-analyze-") as tmp:
        for i, (path, kind) in enumerate(paths):
            work = Path(tmp) / str(i)
            entries = _guarded(
                run, path, lambda p=path, w=work: expand([p], workdir=w, limits=opts.limits)
            )
            for entry in entries or []:
                _guarded(run, entry.path, lambda e=entry, k=kind: _first_pass(run, e, k))
        for entry, kind, how in run.later:
            _guarded(
                run,
                entry.path,
                lambda e=entry, k=kind, h=how: _judged(
                    run, e.path, kind=k, how=h, fn=lambda: _log(run, e)
                ),
            )
    findings = _deduplicated([f for fs, _ in run.results for f in fs])
    report = NodeReport(
        node=node_name, findings=tuple(findings), checks=tuple(r for _, r in run.results)
    )
    return report, run.inputs


_CHECKSUM_LINE = re.compile(
    rb"^(?:[0-9a-fA-F]{32,128}\s+\*?\S.*|\S+ \([^)]+\) = [0-9a-fA-F]{32,128})$"
)
_CHECKSUMS = "a checksum file (sha256sum/md5sum output), not an output: never judged"


def _checksums(head: bytes) -> bool:
    """`sha256sum`/`md5sum` lines (or BSD `SHA256 (f) = ...`), and nothing else."""
    lines = [ln.strip() for ln in head.splitlines() if ln.strip()]
    return bool(lines) and len(head) < HEAD_LIMIT and all(_CHECKSUM_LINE.match(ln) for ln in lines)


HEAD_LIMIT = 65536  # a whole checksum file fits in the head


def _guarded(run: _Run, path: str, fn: Callable[[], T]) -> T | None:
    """A bug of a reader on one input is that input's could-not-tell, never a traceback."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - fail closed on this input, go on with the rest
        why = f"internal error: {type(e).__name__}: {e}"
        _judged(run, path, how=why, fn=lambda: [_could_not_tell(path, why)])
        return None


def _first_pass(run: _Run, entry: Entry, forced: str | None) -> None:
    if entry.skipped is not None:
        run.inputs.append(InputResult(entry.path, None, f"skipped: {entry.skipped}"))
        return
    if entry.problem is not None:
        problem = entry.problem
        _judged(
            run, entry.path, how="unreadable", fn=lambda: [_could_not_tell(entry.path, problem)]
        )
        return
    if entry.sysfs_root is not None:
        _sysfs(run, entry)
        return
    how = "--kind" if forced else "detected"
    try:
        inp = open_input(entry.file or "-", timeout_s=run.opts.timeout_s)
    except InputError as e:
        why, code = str(e), "DEPENDENCY_MISSING" if e.missing else "CHECK_ERROR"
        _judged(
            run,
            entry.path,
            how=f"unreadable: {why}",
            fn=lambda: [_could_not_tell(entry.path, why, code=code)],
        )
        return
    with inp:
        kind = forced or detect(inp.head)
        if kind is None and _checksums(inp.head):
            run.inputs.append(InputResult(entry.path, None, f"skipped: {_CHECKSUMS}"))
            return
        if kind is None:
            how = "empty" if not inp.head.strip() else "not recognised"
            _judged(run, entry.path, how=how, fn=lambda: [_unrecognised(entry.path, inp.head)])
        elif kind == "sysfs":
            why = "a sysfs capture is a folder or a tar archive of one"
            _judged(
                run, entry.path, kind=kind, how=how, fn=lambda: [_could_not_tell(entry.path, why)]
            )
        elif kind == "kernel-log" and entry.file is not None and entry.file.is_file():
            run.later.append((entry, kind, how))  # read in the second pass, with the GPUs
        elif kind == "kernel-log":
            _judged(run, entry.path, kind=kind, how=how, fn=lambda: _stream_log(run, inp))
        else:
            _judged(run, entry.path, kind=kind, how=how, fn=lambda: _document(run, inp, kind))


def _document(run: _Run, inp: Input, kind: str) -> list[Finding]:
    check = kinds()[kind].check
    try:
        data = inp.read_document(MAX_DOCUMENT)
    except InputError as e:
        return [_could_not_tell(inp.name, str(e), check=check)]
    now = utcnow()
    out: list[Finding] = []
    for reading in judging.read(kind, data):
        if isinstance(reading, GpuInventory):
            run.gpus.update(reading.gpu_map())
        out += judging.judge(
            reading, node=run.opts.node, expect=run.opts.expect, now=now, check=check
        )
    said = catalog_phrases.hits_in_text(data.decode("utf-8", errors="replace"))
    return out + error_text.unexplained(
        said, kind=kind, findings=out, check=check, input_name=inp.name
    )


def _log(run: _Run, entry: Entry) -> list[Finding]:
    try:
        inp = open_input(entry.file or "-", timeout_s=run.opts.timeout_s)
    except InputError as e:
        return [_could_not_tell(entry.path, str(e), check=kernel_log_capture.CHECK)]
    with inp:
        return _stream_log(run, inp)


def _stream_log(run: _Run, inp: Input) -> list[Finding]:
    try:
        capture = kernel_log_capture.read_capture(
            inp,
            tz=run.opts.tz,
            now=utcnow(),
            max_bytes=run.opts.max_bytes,  # type: ignore[arg-type]
            stop_on=(InputError,),  # the deadline: what was read is judged, a failure wins
        )
    except InputError as e:
        return [_could_not_tell(inp.name, str(e), check=kernel_log_capture.CHECK)]
    out = judging.judge(
        capture,
        node=run.opts.node,
        expect=run.opts.expect,
        now=utcnow(),
        check="kernel_log",
        gpus=run.gpus,
    )
    return out + error_text.unexplained(
        capture.phrases, kind="kernel-log", findings=out, check="kernel_log", input_name=inp.name
    )


def _sysfs(run: _Run, entry: Entry) -> None:
    """The fabric check over the captured tree, and the PCIe check when the capture holds
    the PCI devices (a copy of /sys/class/infiniband alone is a fabric capture)."""
    load_checks()
    root = entry.sysfs_root or Path("/nonexistent")
    ctx = CheckContext(config=run.opts.node, root=root, env={"PATH": ""})
    names = ["fabric"] + (["pcie"] if (root / "sys" / "bus" / "pci" / "devices").is_dir() else [])
    for name in names:
        findings, ran = run_check(REGISTRY[name], ctx)
        run.results.append(([_tagged(f, entry.path) for f in findings], ran))
    worst = Status.worst(r.status for _, r in run.results[-len(names) :])
    run.inputs.append(InputResult(entry.path, "sysfs", "detected", worst))


def _judged(
    run: _Run,
    path: str,
    *,
    how: str,
    fn: Callable[[], list[Finding]],
    kind: str | None = None,
) -> None:
    """Run one input's reader and rules as a CheckRun of its own (the kind's check, or
    `analyze` for an input that was not read)."""
    started, t0 = datetime.now(UTC), time.monotonic()
    findings = [_tagged(f, path) for f in fn()]
    status = Status.worst(f.status for f in findings)
    check = kinds()[kind].check if kind else "analyze"
    ran = CheckRun(check=check, status=status, started_at=started, duration_s=time.monotonic() - t0)
    run.results.append((findings, ran))
    run.inputs.append(InputResult(path, kind, how, status))


def _tagged(f: Finding, path: str) -> Finding:
    return f.model_copy(update={"evidence": {**f.evidence, "input": path}})


def _deduplicated(findings: list[Finding]) -> list[Finding]:
    """One finding per (check, code, component): the worst, naming every input that said it."""
    kept: dict[tuple[str, str, str], Finding] = {}
    for f in findings:
        old = kept.get(f.key)
        if old is None:
            kept[f.key] = f
            continue
        inputs = [*old.evidence.get("inputs", [old.evidence.get("input")]), f.evidence.get("input")]
        best = f if f.status.rank > old.status.rank else old
        kept[f.key] = best.model_copy(update={"evidence": {**best.evidence, "inputs": inputs}})
    return list(kept.values())


def _could_not_tell(
    path: str, why: str, *, check: str = "analyze", code: str = "CHECK_ERROR"
) -> Finding:
    return Finding(
        check=check,
        status=Status.FAILED,
        code=code,
        component=f"input:{path}",  # one per input: never merged with another's
        message=f"could not read {path}: {why}",
        evidence={"input": path},
    )


def _unrecognised(path: str, head: bytes) -> Finding:
    first = next((ln for ln in head.decode("utf-8", "replace").splitlines() if ln.strip()), "")
    names = ", ".join(kinds())
    message = (
        f"{path} is empty: nothing to judge"
        if not head.strip()
        else f"{path} is not an output gpuvigil reads (first line {first[:80]!r}); if it is "
        f"one, name it with --kind ({names})"
    )
    return Finding(
        check="analyze",
        status=Status.FAILED,
        code="CHECK_ERROR",
        component=f"input:{path}",
        message=message,
        evidence={"input": path, "first_line": first[:200]},
    )
