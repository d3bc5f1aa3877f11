"""Matrix-multiply checks: correctness against a float64 reference in every dtype
(silent data corruption), and sustained load with achieved vs expected TFLOP/s.

Run inside the worker (imports torch through `ops`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from gpuvigil.node.active import telemetry
from gpuvigil.node.active.config import ActiveConfig, Sizes
from gpuvigil.node.active.results import Measurement
from gpuvigil.node.checks.active import rules

SEED = 20261130


def _dtype(ops: Any, name: str) -> Any:
    t = ops.torch
    return {"bf16": t.bfloat16, "fp16": t.float16, "tf32": t.float32, "fp32": t.float32}[name]


@contextmanager
def _tf32(ops: Any, enabled: bool):  # type: ignore[no-untyped-def]
    """TF32 only for the `tf32` case, so `fp32` checks the exact path."""
    if ops.kind != "cuda":
        yield
        return
    backend = ops.torch.backends.cuda.matmul
    before = backend.allow_tf32
    backend.allow_tf32 = enabled
    try:
        yield
    finally:
        backend.allow_tf32 = before


def _normalised_error(ops: Any, out: Any, ref: Any, scale: float) -> float:
    diff = (out.detach().to("cpu", ops.torch.float64) - ref).abs().max().item()
    return float(diff) / scale if scale > 0 else math.inf


def correctness(ops: Any, cfg: ActiveConfig, sizes: Sizes) -> list[Measurement]:
    torch = ops.torch
    n = sizes.matmul_size
    gen = torch.Generator().manual_seed(SEED)
    a64 = torch.randn(n, n, generator=gen, dtype=torch.float64)
    b64 = torch.randn(n, n, generator=gen, dtype=torch.float64)
    out: list[Measurement] = []
    for name in cfg.dtypes:
        dt = _dtype(ops, name)
        a, b = a64.to(dt), b64.to(dt)
        # The reference uses the rounded inputs, so only accumulation can differ.
        ref = a.to(torch.float64) @ b.to(torch.float64)
        scale = (
            math.sqrt(n)
            * a.double().pow(2).mean().sqrt().item()
            * b.double().pow(2).mean().sqrt().item()
        )
        tol = rules.TOLERANCE[name]
        batch: list[Measurement] = []
        digests: dict[int, str] = {}
        classes: list[Any] = []  # one CPU copy per bitwise-distinct product
        for i in range(ops.count()):
            da, db = a.to(ops.devices[i]), b.to(ops.devices[i])
            with _tf32(ops, name == "tf32"):
                results = [ops.matmul(i, da, db) for _ in range(cfg.matmul_repeats)]
            ops.synchronize(i)
            error = _normalised_error(ops, results[0], ref, scale)
            drift = max(
                _normalised_error(ops, r, results[0].to("cpu", torch.float64), scale)
                for r in results[1:]
            )
            bitwise = all(torch.equal(results[0], r) for r in results[1:])
            digests[i] = _class_of(ops, results[0], classes)
            ev = {
                "dtype": name,
                "size": n,
                "repeats": cfg.matmul_repeats,
                "max_repeat_difference": drift,
                "bitwise_repeatable": bitwise,
                "device_name": ops.name(i),
                "result_class": digests[i],
            }
            status, code, msg = "OK", None, ""
            if rules.wrong(error, name):
                status, code = "FAILED", "GPU_SDC"
                msg = (
                    f"{name} matmul differs from the float64 reference by {error:.3g} "
                    f"(tolerance {tol:g})"
                )
            elif not bitwise:
                # cuBLAS and CPU BLAS are bitwise reproducible for the same shapes on the
                # same device: any change between repeats is the hardware.
                status, code = "FAILED", "GPU_SDC"
                msg = f"{name} matmul gave different results on repeats (by {drift:.3g})"
            batch.append(
                Measurement(
                    check="matmul",
                    component=ops.component(i),
                    metric=f"{name}_max_error",
                    achieved=error,
                    expected=tol,
                    unit="norm_err",
                    status=status,
                    code=code,
                    message=msg,
                    evidence=ev,
                )
            )
        out += _agreement(ops, batch, digests, name)
    return out


def _class_of(ops: Any, t: Any, classes: list[Any]) -> str:
    """A label shared by bitwise-equal products ("r0", "r1", ...): n GPUs, <= n^2/2 compares."""
    host = t.detach().to("cpu")
    for k, rep in enumerate(classes):
        if rep.dtype == host.dtype and ops.torch.equal(rep, host):
            return f"r{k}"
    classes.append(host)
    return f"r{len(classes) - 1}"


def _agreement(
    ops: Any, batch: list[Measurement], digests: dict[int, str], dtype: str
) -> list[Measurement]:
    """Same inputs, same GPU model, same library: the products must be bitwise identical.
    A GPU that disagrees with the majority of its peers is corrupting bits too small for
    any tolerance to see (the way fleet SDC screens find them)."""
    groups: dict[str, list[int]] = {}
    for i in digests:
        groups.setdefault(ops.name(i), []).append(i)
    out = list(batch)
    for members in groups.values():
        if len(members) < 2:
            continue
        counts: dict[str, int] = {}
        for i in members:
            counts[digests[i]] = counts.get(digests[i], 0) + 1
        if len(counts) == 1:
            continue
        top, top_n = max(counts.items(), key=lambda kv: kv[1])
        majority = top_n * 2 > len(members)
        if not majority and any(out[i].status != "OK" for i in members):
            continue  # a peer already failed on its own: that explains the disagreement
        for i in members:
            m = out[i]
            if m.status != "OK" or (majority and digests[i] == top):
                continue
            if majority:
                msg = (
                    f"{dtype} product differs bitwise from {top_n} of {len(members)} "
                    "identical GPUs given the same inputs"
                )
                out[i] = replace(
                    m,
                    status="FAILED",
                    code="GPU_SDC",
                    message=msg,
                    evidence={**m.evidence, "majority_class": top},
                )
            else:  # no majority (two GPUs, or all different): cannot tell which is wrong
                msg = f"{dtype} products of identical GPUs disagree bitwise; no majority"
                out[i] = replace(m, status="WARNING", code="GPU_SDC", message=msg)
    return out


def load(
    ops: Any, cfg: ActiveConfig, sizes: Sizes, expected: Mapping[int, float | None]
) -> list[Measurement]:
    """Every device multiplies at once for `load_s` seconds (power and heat as in training);
    each result is compared with the first, so a GPU that drifts under load is caught."""
    torch = ops.torch
    n, dt_name = sizes.load_size, sizes.load_dtype
    dt = _dtype(ops, dt_name)
    count = ops.count()
    gen = torch.Generator().manual_seed(SEED + 1)
    a_host = torch.randn(n, n, generator=gen).to(dt)
    b_host = torch.randn(n, n, generator=gen).to(dt)
    a = [a_host.to(ops.devices[i]) for i in range(count)]
    b = [b_host.to(ops.devices[i]) for i in range(count)]
    first = [ops.matmul(i, a[i], b[i]) for i in range(count)]
    ops.synchronize()
    iters, busy = [0] * count, [0.0] * count
    drift: list[float] = [0.0] * count
    timers = [ops.timer(i).start() for i in range(count)] if ops.asynchronous else []
    started = time.monotonic()
    deadline = started + sizes.load_s
    rounds = 0
    last: list[Any] = list(first)
    nvml: dict[int, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        if ops.kind == "cuda" and not nvml and time.monotonic() > started + sizes.load_s / 2:
            nvml = telemetry.sample(list(getattr(ops, "pci", [])))  # mid-load, hot
        for i in range(count):
            t0 = time.perf_counter()
            last[i] = ops.matmul(i, a[i], b[i])
            if not ops.asynchronous:
                busy[i] += time.perf_counter() - t0
            iters[i] += 1
        rounds += 1
        if ops.asynchronous and rounds % 16 == 0:
            ops.synchronize()  # keeps the launch queue (and the overrun) short
        if rounds % 64 == 0:
            for i in range(count):
                drift[i] = max(drift[i], _diff(ops, last[i], first[i]))
    if ops.asynchronous:
        busy = [t.stop() for t in timers]
    ops.synchronize()
    for i in range(count):
        drift[i] = max(drift[i], _diff(ops, last[i], first[i]))
    flops = 2.0 * n**3
    tflops = {i: (flops * iters[i] / busy[i] / 1e12) if busy[i] > 0 else 0.0 for i in range(count)}
    slow_vs_peers = rules.laggards(
        {str(i): v for i, v in tflops.items()}, cfg.min_fraction_of_median
    )
    out = []
    for i in range(count):
        exp = expected.get(i)
        ev = {
            "dtype": dt_name,
            "size": n,
            "iterations": iters[i],
            "busy_s": round(busy[i], 3),
            "ratio_to_peak": rules.ratio(tflops[i], exp),
            "max_drift": drift[i],
            "device_name": ops.name(i),
        }
        if i in nvml:
            ev["under_load"] = nvml[i]
        slowing = sorted(set(nvml.get(i, {}).get("clock_event_reasons", ())) & telemetry.SLOWING)
        why = f" (clock events under load: {', '.join(slowing)})" if slowing else ""
        status, code, msg = "OK", None, ""
        if drift[i] > 0:
            status, code = "FAILED", "GPU_SDC"
            msg = f"the same matmul gave a different result under load (by {drift[i]:.3g})"
        elif rules.below(tflops[i], exp, cfg.min_fraction_of_peak):
            status, code = "FAILED", "GPU_SLOW"
            msg = (
                f"{tflops[i]:.3g} TFLOP/s {dt_name}, below {cfg.min_fraction_of_peak:g} of "
                f"the expected {exp:g}{why}"
            )
        elif str(i) in slow_vs_peers:
            med = slow_vs_peers[str(i)]
            status, code = "FAILED", "GPU_SLOW"
            msg = (
                f"{tflops[i]:.3g} TFLOP/s {dt_name}, below {cfg.min_fraction_of_median:g} "
                f"of the node's median {med:.3g}{why}"
            )
            ev["median_tflops"] = med
        out.append(
            Measurement(
                check="load",
                component=ops.component(i),
                metric=f"tflops_{dt_name}",
                achieved=tflops[i],
                expected=exp,
                unit="TFLOP/s",
                status=status,
                code=code,
                message=msg,
                evidence=ev,
            )
        )
    return out


def _diff(ops: Any, x: Any, y: Any) -> float:
    """0.0 when bitwise equal, else the largest absolute difference (inf for NaN)."""
    if ops.torch.equal(x, y):
        return 0.0
    d = (x.float() - y.float()).abs().max().item()
    return float(d) if math.isfinite(d) and d > 0 else math.inf
