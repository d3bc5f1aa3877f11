"""Pure rules over counters and link states read from one pasted output: `NvLinkReport`
(`nvidia-smi nvlink -e`, `dcgmi nvlink -e/-s`) and `NicCounters` (`perfquery`, `ethtool -S`).

One capture gives totals, not rates: a count above its threshold in
`catalog/error_counters.yaml` is a WARNING (FAILED above `fail_above`), naming the link or
port and the counter. A link dcgmi shows Down (`D`) is NVLINK_DOWN. An output from which
nothing could be read is CHECK_ERROR (could not tell), never healthy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.catalog.error_counters import Limit, load
from gpuvigil.node.checks.counters.readings import NicCounters, NvLinkReport
from gpuvigil.node.pipeline.registry import Inputs, rule


@rule("nvlink_counts", reads=NvLinkReport, codes=("NVLINK_ERROR_COUNTS", "NVLINK_DOWN"))
def nvlink_counts(report: NvLinkReport, on: Inputs) -> list[Finding]:
    """NVLink states and error counts from one nvidia-smi/dcgmi capture."""
    limits = load().nvlink.get
    out = _unreadable(report.problems, bool(report.owners), report.source, on)
    for owner in report.owners:
        down = [link.link for link in owner.links if link.state == "down"]
        disabled = [link.link for link in owner.links if link.state == "disabled"]
        # NVSwitch rows are read, not judged for state: a switch's unused ports (trunks on
        # a single baseboard) print Down too, and every GPU link has its GPU end judged.
        if (down or disabled) and owner.component.startswith("gpu:"):
            # Down: FAILED. Disabled (`X`: switched off by an admin, or by the driver after
            # errors): WARNING, never healthy.
            out.append(
                Finding(
                    check=on.check,
                    status=Status.FAILED if down else Status.WARNING,
                    code="NVLINK_DOWN",
                    component=owner.component,
                    message=f"NVLink link(s) {down or disabled} "
                    f"{'down' if down else 'disabled'} ({report.source})",
                    action=Action.RESET_GPU,
                    evidence={
                        "links_down": down,
                        "links_disabled": disabled,
                        "links_reported": len(owner.links),
                        "source": report.source,
                    },
                    observed_at=on.now,
                )
            )
        over = [
            {"link": link.link, **hit}
            for link in owner.links
            for hit in _over(dict(link.counters), limits)
        ]
        if over:
            out.append(_counts("NVLINK_ERROR_COUNTS", owner.component, over, report.source, on))
    return out


@rule("nic_counts", reads=NicCounters, codes=("NIC_ERROR_COUNTS",))
def nic_counts(reading: NicCounters, on: Inputs) -> list[Finding]:
    """NIC port error counters (perfquery, ethtool -S) from one capture."""
    table = load().ib.get if reading.source == "perfquery" else load().ethtool_limit
    out = _unreadable(reading.problems, bool(reading.ports), reading.source, on)
    for port in reading.ports:
        over = _over(dict(port.counters), table)
        if over:
            out.append(_counts("NIC_ERROR_COUNTS", f"nic:{port.name}", over, reading.source, on))
    return out


def _over(
    counters: Mapping[str, int], limit_of: Callable[[str], Limit | None]
) -> list[dict[str, object]]:
    hits = []
    for name, value in counters.items():
        limit = limit_of(name)
        if limit is None or value <= limit.warn_above:
            continue
        failed = limit.fail_above is not None and value > limit.fail_above
        hits.append(
            {
                "counter": name,
                "value": value,
                "warn_above": limit.warn_above,
                "fail_above": limit.fail_above,
                "status": "FAILED" if failed else "WARNING",
            }
        )
    return hits


def _counts(code: str, component: str, over: list[dict[str, object]], source: str, on: Inputs):
    failed = any(o["status"] == "FAILED" for o in over)
    names = sorted({str(o["counter"]) for o in over})
    return Finding(
        check=on.check,
        status=Status.FAILED if failed else Status.WARNING,
        code=code,
        component=component,
        message=f"{', '.join(names)} above threshold ({source}: counts since driver load "
        "or last clear, one capture)",
        action=Action.INVESTIGATE if failed else Action.NONE,
        evidence={"over": over[:64], "source": source, "thresholds": "error_counters.yaml"},
        observed_at=on.now,
    )


def _unreadable(problems: tuple[str, ...], read_any: bool, source: str, on: Inputs):
    if not problems:
        return []
    return [
        Finding(
            check=on.check,
            status=Status.FAILED,
            code="CHECK_ERROR",
            component=f"{source}",
            message=f"{source}: {len(problems)} line(s) could not be read"
            + ("" if read_any else "; nothing was judged"),
            action=Action.NONE,
            evidence={"problems": list(problems[:20])},
            observed_at=on.now,
        )
    ]
