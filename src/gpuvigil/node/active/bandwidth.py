"""Host<->device (PCIE_SLOW) and GPU->GPU peer (NVLINK_SLOW) copy bandwidth vs expected.

Run inside the worker. Each direction copies `transfer_bytes` a few times after a warm-up;
peers are measured around a ring (0->1, 1->2, ..., n-1->0), which touches every GPU's
link in both roles with n copies instead of n^2.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gpuvigil.node.active.config import ActiveConfig, Sizes
from gpuvigil.node.active.results import Measurement
from gpuvigil.node.checks.active import rules

REPEATS = 5


def _measure(ops: Any, i: int, dst: Any, src: Any, nbytes: int) -> float:
    """GB/s of REPEATS copies, timed on the wall clock between full synchronisations
    (a peer copy may run on either device's stream, so one device's events could miss
    it; at 1 GiB per copy the synchronisation costs microseconds of many milliseconds)."""
    ops.copy(i, dst, src)  # warm-up (and page-in)
    ops.synchronize()
    t0 = time.perf_counter()
    for _ in range(REPEATS):
        ops.copy(i, dst, src)
    ops.synchronize()
    seconds = time.perf_counter() - t0
    return nbytes * REPEATS / seconds / 1e9 if seconds > 0 else 0.0


def transfers(
    ops: Any,
    cfg: ActiveConfig,
    sizes: Sizes,
    *,
    h2d_expected: Mapping[int, float | None],
    p2p_expected: Mapping[int, float | None],
) -> list[Measurement]:
    torch = ops.torch
    nbytes = sizes.transfer_bytes
    host = ops.host(nbytes, torch.uint8)
    host.fill_(1)
    out: list[Measurement] = []
    frac = cfg.min_bandwidth_fraction
    for i in range(ops.count()):
        dev = ops.empty(i, nbytes, torch.uint8)
        for metric, dst, src in (("h2d_gbs", dev, host), ("d2h_gbs", host, dev)):
            gbs = _measure(ops, i, dst, src, nbytes)
            exp = h2d_expected.get(i)
            slow = rules.below(gbs, exp, frac)
            out.append(
                Measurement(
                    check="bandwidth",
                    component=ops.component(i),
                    metric=metric,
                    achieved=gbs,
                    expected=exp,
                    unit="GB/s",
                    status="FAILED" if slow else "OK",
                    code="PCIE_SLOW" if slow else None,
                    message=f"{metric[:3]} copy at {gbs:.3g} GB/s, below {frac:g} of {exp}"
                    if slow
                    else "",
                    evidence={"bytes": nbytes, "repeats": REPEATS, "ratio": rules.ratio(gbs, exp)},
                )
            )
        del dev
    count = ops.count()
    if count < 2:
        return out
    for i in range(count):
        j = (i + 1) % count
        exp = p2p_expected.get(i)
        ev: dict[str, Any] = {"bytes": nbytes, "repeats": REPEATS, "to": ops.component(j)}
        if ops.kind == "cuda" and not torch.cuda.can_device_access_peer(i, j):
            ev["peer_access"] = False
        src, dst = ops.empty(i, nbytes, torch.uint8), ops.empty(j, nbytes, torch.uint8)
        gbs = _measure(ops, i, dst, src, nbytes)
        del src, dst
        slow = rules.below(gbs, exp, frac) or (exp is not None and ev.get("peer_access") is False)
        ev["ratio"] = rules.ratio(gbs, exp)
        out.append(
            Measurement(
                check="bandwidth",
                component=ops.component(i),
                metric="p2p_gbs",
                achieved=gbs,
                expected=exp,
                unit="GB/s",
                status="FAILED" if slow else "OK",
                code="NVLINK_SLOW" if slow else None,
                message=f"copy to {ops.component(j)} at {gbs:.3g} GB/s, below {frac:g} of {exp}"
                if slow
                else "",
                evidence=ev,
            )
        )
    ops.release()
    return out
