"""NVLink: per-link state, and error counters judged as rates between two readings. Pure.

The counters (CRC flit/data, replay, recovery) only grow until the driver reloads, so a
total says little; a rate says the link is degrading now. The previous inventory comes
from the node's facts (`node.pipeline`: the reading before the latest) or the caller. A
counter that went down means the driver reloaded: no rate from that pair.
"""

from __future__ import annotations

from datetime import datetime

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.catalog.gpus import GpuProduct
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuReading, NvLinkReading
from gpuvigil.node.config import GpuConfig

COUNTERS = ("crc_flit", "crc_data", "replay", "recovery")


def links_down(
    gpu: GpuReading, *, product: GpuProduct | None, now: datetime, check: str
) -> list[Finding]:
    """Links reported inactive. With a catalog entry, links beyond its count are ignored
    and a GPU that reports none of its expected links counts as all down; without one, an
    inactive link only counts when some other link of the GPU is active (PCIe cards report
    every link inactive)."""
    expected = product.nvlinks if product is not None else None
    if expected == 0 or not gpu.nvlinks:
        return []  # no NVLink on this product, or the source said nothing about links
    links = [link for link in gpu.nvlinks if expected is None or link.link < expected]
    if expected is None and not any(link.active for link in links):
        return []
    down = [link.link for link in links if link.active is False]
    missing = expected - len(links) if expected is not None and len(links) < expected else 0
    if not down and not missing:
        return []
    return [
        Finding(
            check=check,
            status=Status.FAILED,
            code="NVLINK_DOWN",
            component=gpu.component,
            message=f"NVLink link(s) {down or ''} inactive"
            + (f"; {missing} expected link(s) not reported" if missing else ""),
            action=Action.RESET_GPU,
            evidence={
                "gpu_uuid": gpu.uuid,
                "links_down": down,
                "links_reported": len(links),
                "links_expected": expected,
            },
            observed_at=now,
        )
    ]


def error_rates(
    current: GpuInventory,
    previous: GpuInventory | None,
    *,
    cfg: GpuConfig,
    check: str,
) -> list[Finding]:
    """NVLINK_ERRORS for every GPU whose per-minute error rate on any link passes a limit."""
    if previous is None:
        return []
    elapsed_s = (current.observed_at - previous.observed_at).total_seconds()
    if elapsed_s <= 0:
        return []
    limits = {
        "crc_flit": cfg.nvlink_crc_per_min_max,
        "crc_data": cfg.nvlink_crc_per_min_max,
        "replay": cfg.nvlink_replay_per_min_max,
        "recovery": cfg.nvlink_recovery_per_min_max,
    }
    before = {(g.uuid or str(g.index)): g for g in previous.gpus}
    out: list[Finding] = []
    for gpu in current.gpus:
        old = before.get(gpu.uuid or str(gpu.index))
        if old is None:
            continue
        old_links = {link.link: link for link in old.nvlinks}
        over: list[dict[str, object]] = []
        for link in gpu.nvlinks:
            prev = old_links.get(link.link)
            if prev is None:
                continue
            over.extend(_over(link, prev, elapsed_s, limits))
        if over:
            out.append(
                Finding(
                    check=check,
                    status=Status.WARNING,
                    code="NVLINK_ERRORS",
                    component=gpu.component,
                    message=f"NVLink errors rising on {len({o['link'] for o in over})} link(s)",
                    action=Action.NONE,
                    evidence={
                        "gpu_uuid": gpu.uuid,
                        "interval_s": round(elapsed_s, 3),
                        "rates": over,
                    },
                    observed_at=current.observed_at,
                )
            )
    return out


def _over(
    link: NvLinkReading, prev: NvLinkReading, elapsed_s: float, limits: dict[str, float]
) -> list[dict[str, object]]:
    out = []
    for name in COUNTERS:
        now_v, then_v = getattr(link, name), getattr(prev, name)
        if now_v is None or then_v is None or now_v < then_v:
            continue  # unknown, or the counters were reset (driver reload)
        per_min = (now_v - then_v) * 60.0 / elapsed_s
        if per_min > limits[name]:
            out.append(
                {
                    "link": link.link,
                    "counter": name,
                    "delta": now_v - then_v,
                    "per_min": round(per_min, 3),
                    "limit_per_min": limits[name],
                }
            )
    return out
