"""All-reduce bus bandwidth within the node (NVLINK_SLOW) and across nodes (FABRIC_SLOW).

Runs one torch.distributed rank per device (NCCL on GPUs, gloo on the CPU) in spawned
processes, measures the time of an all-reduce of `allreduce_bytes`, and reports
nccl-tests' bus bandwidth (algbw * 2(n-1)/n), comparable with `all_reduce_perf` output.
It also checks the reduced values: a collective that returns wrong data is corruption.
Run inside the worker; ranks that do not report by the deadline are killed.
"""

from __future__ import annotations

import contextlib
import queue as queue_mod
import time
import traceback
from datetime import timedelta
from typing import Any

from gpuvigil.io.ports import free_port
from gpuvigil.node.active.config import ActiveConfig, Sizes
from gpuvigil.node.active.results import Measurement
from gpuvigil.node.checks.active import rules

WARMUP, ITERS = 3, 10


def _rank(local_rank: int, spec: dict[str, Any], results: Any) -> None:
    rank = spec["node_rank"] * spec["local_world"] + local_rank
    try:
        from gpuvigil.node.active.worker import build_ops

        ops = build_ops(spec["device"], cpu_devices=spec["local_world"], wrapper=spec["wrapper"])
        torch = ops.torch
        import torch.distributed as dist

        if ops.kind == "cuda":
            torch.cuda.set_device(local_rank)
        else:
            torch.set_num_threads(1)
        dist.init_process_group(
            "nccl" if ops.kind == "cuda" else "gloo",
            init_method=spec["init_method"],
            rank=rank,
            world_size=spec["world"],
            timeout=timedelta(seconds=spec["timeout_s"]),
        )
        numel = spec["bytes"] // 4
        t = ops.empty(local_rank, numel, torch.float32)
        t.fill_(1.0)
        ops.all_reduce(t)
        ops.synchronize(local_rank)
        correct = bool((t == float(spec["world"])).all().item())
        t.zero_()  # zeros stay finite however often they are summed
        for _ in range(WARMUP):
            ops.all_reduce(t)
        ops.synchronize(local_rank)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            ops.all_reduce(t)
        ops.synchronize(local_rank)
        seconds = (time.perf_counter() - t0) / ITERS
        slowest = torch.tensor([seconds], dtype=torch.float64)
        if ops.kind == "cuda":
            slowest = slowest.cuda(local_rank)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        results.put({"rank": rank, "seconds": float(slowest.item()), "correct": correct})
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - reported to the parent as this rank's error
        results.put(
            {
                "rank": rank,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=4),
            }
        )


def _group(spec: dict[str, Any], *, timeout_s: float) -> tuple[list[dict[str, Any]], list[int]]:
    import torch.multiprocessing as mp

    # CUDA cannot survive a fork, so GPU ranks are spawned (a few seconds, inside the
    # budget). CPU ranks are forked (0.1 s instead of 7 s here) and use one thread each,
    # which keeps them clear of a forked OpenMP pool.
    ctx = mp.get_context("spawn" if spec["device"] == "cuda" else "fork")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, spec, results), daemon=True)
        for r in range(spec["local_world"])
    ]
    for p in procs:
        p.start()
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < len(procs) and time.monotonic() < deadline:
        try:
            got.append(results.get(timeout=max(0.1, min(1.0, deadline - time.monotonic()))))
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                break
    missing = sorted(
        set(range(len(procs))) - {g["rank"] - spec["node_rank"] * len(procs) for g in got}
    )
    for p in procs:
        p.join(timeout=2)
        if p.is_alive():
            p.kill()
            p.join(timeout=2)
    with contextlib.suppress(Exception):
        results.close()
    return got, missing


def allreduce(
    ops: Any,
    cfg: ActiveConfig,
    sizes: Sizes,
    *,
    wrapper: str | None,
    expected_intra: float | None,
    expected_inter: float | None,
) -> list[Measurement]:
    local = ops.count()
    budget = sizes.timeouts_s["allreduce"] * 0.9
    out: list[Measurement] = []
    scopes: list[tuple[str, dict[str, Any], float | None, str]] = []
    if local >= 2:
        scopes.append(
            (
                "node",
                {"node_rank": 0, "world": local, "init_method": f"tcp://127.0.0.1:{free_port()}"},
                expected_intra,
                "NVLINK_SLOW",
            )
        )
    else:
        out.append(
            Measurement(
                check="allreduce",
                component="node",
                metric="busbw_gbs",
                achieved=None,
                expected=expected_intra,
                unit="GB/s",
                message="one device: no all-reduce within the node",
            )
        )
    if cfg.peers is not None:
        p = cfg.peers
        scopes.append(
            (
                "cluster",
                {
                    "node_rank": p.node_rank,
                    "world": p.nnodes * local,
                    "init_method": f"tcp://{p.master_addr}:{p.master_port}",
                },
                expected_inter,
                "FABRIC_SLOW",
            )
        )
    for scope, extra, expected, slow_code in scopes:
        spec = {
            "device": ops.kind,
            "local_world": local,
            "bytes": sizes.allreduce_bytes,
            "wrapper": wrapper,
            "timeout_s": budget / len(scopes),
            **extra,
        }
        got, missing = _group(spec, timeout_s=budget / len(scopes))
        errors = [g for g in got if "error" in g]
        ev: dict[str, Any] = {
            "scope": scope,
            "world": spec["world"],
            "bytes": spec["bytes"],
            "iterations": ITERS,
        }
        component = "node" if scope == "node" else "fabric"
        if missing or errors:
            code = "CHECK_TIMEOUT" if missing and not errors else "CHECK_ERROR"
            ev.update({"missing_local_ranks": missing, "errors": [g["error"] for g in errors][:4]})
            msg = (
                f"all-reduce ({scope}) ranks {missing} did not finish within "
                f"{budget / len(scopes):.0f} s"
                if code == "CHECK_TIMEOUT"
                else f"all-reduce ({scope}) failed: {errors[0]['error']}"
            )
            out.append(
                Measurement(
                    check="allreduce",
                    component=component,
                    metric="busbw_gbs",
                    achieved=None,
                    expected=expected,
                    unit="GB/s",
                    status="FAILED",
                    code=code,
                    message=msg,
                    evidence=ev,
                )
            )
            continue
        seconds = max(g["seconds"] for g in got)
        bw = rules.busbw(spec["bytes"], seconds, spec["world"])
        ev.update(
            {
                "seconds_per_iter": seconds,
                "algbw_gbs": spec["bytes"] / seconds / 1e9 if seconds > 0 else None,
                "ratio": rules.ratio(bw, expected),
            }
        )
        status, code, msg = "OK", None, ""
        if not all(g.get("correct") for g in got):
            status, code, msg = "FAILED", "GPU_SDC", f"all-reduce ({scope}) returned wrong sums"
        elif rules.below(bw, expected, cfg.min_allreduce_fraction):
            status, code = "FAILED", slow_code
            msg = (
                f"all-reduce ({scope}) bus bandwidth {bw:.3g} GB/s, below "
                f"{cfg.min_allreduce_fraction:g} of the expected {expected:g}"
            )
        out.append(
            Measurement(
                check="allreduce",
                component=component,
                metric="busbw_gbs",
                achieved=bw,
                expected=expected,
                unit="GB/s",
                status=status,
                code=code,
                message=msg,
                evidence=ev,
            )
        )
    return out
