"""The worker process of the active checks: `python -m gpuvigil.node.active.worker`.

Reads a JSON spec on stdin, runs the checks it names one after another and prints one
JSON line per event (`start`, `result`, `error`, `fatal`, `timeout`) as it goes, so the
parent keeps every result finished before a hang. Each check has a watchdog: past its
deadline the worker prints `timeout` and exits at once (the parent also kills the whole
process group at its own deadline, for hangs that hold the interpreter). Started only by
`runner.run_active`.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import threading
import time
import traceback
from typing import Any

from gpuvigil.node.active.config import ActiveConfig, Sizes
from gpuvigil.node.catalog.gpu_performance import GpuModel, identify, load_models

EXIT_TIMEOUT = 124
EXIT_FATAL = 3
_MEMORY_ERROR = re.compile(r"ECC|uncorrectable", re.IGNORECASE)
_lock = threading.Lock()


def emit(event: dict[str, Any]) -> None:
    with _lock:
        sys.stdout.write(json.dumps(event, default=str) + "\n")
        sys.stdout.flush()


def build_ops(device: str, *, cpu_devices: int, wrapper: str | None) -> Any:
    """TorchOps for `device`, wrapped by `module:function` when given (fault injection for
    tests and the simulator: the function takes the ops and returns wrapped ops)."""
    from gpuvigil.node.active.ops import TorchOps

    ops: Any = TorchOps(device, cpu_devices=cpu_devices)
    if wrapper:
        module, _, attr = wrapper.partition(":")
        ops = getattr(importlib.import_module(module), attr)(ops)
    return ops


class _Progress:
    """Outermost wrapper: says which device an op is about to touch (only when that
    changes), so a check that hangs or dies is blamed on its GPU, not on the node.
    Off for `load` and `allreduce`, which drive every device at once."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.check: str | None = None
        self.last: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def start(self, check: str) -> None:
        self.check = check if check not in ("load", "allreduce") else None
        self.last = None

    def _at(self, i: int) -> None:
        if self.check is not None and i != self.last:
            self.last = i
            emit({"event": "progress", "check": self.check, "component": self.inner.component(i)})

    def matmul(self, i: int, a: Any, b: Any) -> Any:
        self._at(i)
        return self.inner.matmul(i, a, b)

    def fill(self, i: int, t: Any, value: int) -> None:
        self._at(i)
        self.inner.fill(i, t, value)

    def fill_index(self, i: int, t: Any, start: int) -> None:
        self._at(i)
        self.inner.fill_index(i, t, start)

    def copy(self, i: int, dst: Any, src: Any) -> None:
        self._at(i)
        self.inner.copy(i, dst, src)

    def empty(self, i: int, numel: int, dtype: Any) -> Any:
        self._at(i)
        return self.inner.empty(i, numel, dtype)

    def timer(self, i: int) -> Any:
        from gpuvigil.node.active.ops import Timer

        return Timer(self, i)  # type: ignore[arg-type]


def _expected(cfg: ActiveConfig, ops: Any, sizes: Sizes, spec: dict[str, Any]) -> dict[str, Any]:
    models = load_models(cfg.gpu_models or None)
    per: dict[str, dict[int, Any]] = {"tflops": {}, "h2d": {}, "p2p": {}, "model": {}}
    for i in range(ops.count()):
        found: tuple[str, GpuModel] | None = (
            identify(ops.name(i), models) if (ops.kind == "cuda") else None
        )
        model = found[1] if found else None
        per["model"][i] = found[0] if found else None
        dense = model.dense_tflops.model_dump() if model else {}
        per["tflops"][i] = cfg.expected.tflops.get(sizes.load_dtype) or dense.get(sizes.load_dtype)
        per["h2d"][i] = cfg.expected.h2d_gbs or (model.h2d_gbs if model else None)
        per["p2p"][i] = cfg.expected.p2p_gbs or (model.p2p_gbs if model else None)
    intra = cfg.expected.allreduce_busbw_gbs or per["p2p"].get(0)
    inter = cfg.expected.internode_busbw_gbs or spec.get("internode_busbw_gbs")
    return {**per, "intra": intra, "inter": inter}


def _run(
    check: str,
    ops: Any,
    cfg: ActiveConfig,
    sizes: Sizes,
    *,
    exp: dict[str, Any],
    wrapper: str | None,
) -> list[Any]:
    from gpuvigil.node.active import allreduce, bandwidth, matmul, memory

    if check == "matmul":
        return matmul.correctness(ops, cfg, sizes)
    if check == "load":
        return matmul.load(ops, cfg, sizes, exp["tflops"])
    if check == "memory":
        return memory.pattern_test(ops, cfg)
    if check == "bandwidth":
        return bandwidth.transfers(
            ops, cfg, sizes, h2d_expected=exp["h2d"], p2p_expected=exp["p2p"]
        )
    if check == "allreduce":
        return allreduce.allreduce(
            ops,
            cfg,
            sizes,
            wrapper=wrapper,
            expected_intra=exp["intra"],
            expected_inter=exp["inter"],
        )
    raise ValueError(f"unknown active check {check!r}")


def _on_timeout(check: str, seconds: float) -> None:
    emit({"event": "timeout", "check": check, "timeout_s": seconds})
    os._exit(EXIT_TIMEOUT)


def main() -> int:
    spec = json.loads(sys.stdin.read() or "{}")
    cfg = ActiveConfig.model_validate(spec.get("config", {}))
    device = spec.get("device", "cuda")
    try:
        import torch
    except ImportError as e:
        emit(
            {
                "event": "fatal",
                "code": "DEPENDENCY_MISSING",
                "message": f"PyTorch is not installed ({e}); install gpuvigil[training]",
            }
        )
        return EXIT_FATAL
    if device != "cpu" and (not torch.cuda.is_available() or torch.cuda.device_count() == 0):
        emit(
            {
                "event": "fatal",
                "code": "DRIVER_UNAVAILABLE",
                "message": "CUDA is not available to PyTorch (no driver, no GPU, or a CPU "
                f"build of torch {torch.__version__})",
            }
        )
        return EXIT_FATAL
    ops = _Progress(build_ops(device, cpu_devices=cfg.cpu_devices, wrapper=spec.get("wrapper")))
    sizes = cfg.sizes(device)
    exp = _expected(cfg, ops, sizes, spec)
    emit(
        {
            "event": "devices",
            "names": [ops.name(i) for i in range(ops.count())],
            "components": [ops.component(i) for i in range(ops.count())],
            "pci": list(getattr(ops.inner, "pci", [])),
            "models": [exp["model"][i] for i in range(ops.count())],
            "torch": torch.__version__,
        }
    )
    for check in spec.get("checks", []):
        timeout_s = float(sizes.timeouts_s.get(check, 60.0))
        emit({"event": "start", "check": check, "timeout_s": timeout_s})
        ops.start(check)
        watchdog = threading.Timer(timeout_s, _on_timeout, args=(check, timeout_s))
        watchdog.daemon = True
        watchdog.start()
        t0 = time.monotonic()
        try:
            measurements = _run(check, ops, cfg, sizes, exp=exp, wrapper=spec.get("wrapper"))
        except Exception as e:  # noqa: BLE001 - every failure of a check is reported
            text = f"{type(e).__name__}: {e}"
            code = "GPU_MEMORY_FAULT" if _MEMORY_ERROR.search(text) else "CHECK_ERROR"
            where = ops.inner.component(ops.last) if ops.last is not None else "node"
            emit(
                {
                    "event": "error",
                    "check": check,
                    "code": code,
                    "message": text[:2000],
                    "component": where,
                    "traceback": traceback.format_exc(limit=6),
                }
            )
            if "CUDA" in text or "cuda" in text:
                return EXIT_FATAL  # the context may be poisoned: the parent starts afresh
            continue
        finally:
            watchdog.cancel()
        emit(
            {
                "event": "result",
                "check": check,
                "duration_s": time.monotonic() - t0,
                "measurements": [m.to_json() for m in measurements],
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
