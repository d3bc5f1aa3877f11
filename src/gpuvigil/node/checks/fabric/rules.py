"""Pure rules: a FabricReading (and the one before it) -> findings.

Registered as the `fabric` rule: `node.pipeline` feeds it for the `fabric` check
(`node/checks/fabric/fabric.py`), `gpuvigil analyze --sysfs` and the simulator. No I/O, no
clock: `now` comes from the reading; what the node should have comes from the config and
the instance type (`NodeInstance`).
"""

from __future__ import annotations

import fnmatch
from typing import Any

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.catalog.instances import InstanceType
from gpuvigil.node.checks.fabric.readings import (
    FabricAdapter,
    FabricExpectation,
    FabricPort,
    FabricReading,
    NodeInstance,
)
from gpuvigil.node.config import FabricConfig
from gpuvigil.node.pipeline.registry import Inputs, rule

CHECK = "fabric"
# Widths of the IB PortCounters (IBTA): a counter at its maximum has saturated and can no
# longer show new errors, so its rate is unknowable until someone clears it.
COUNTER_MAX = {
    "link_downed": 0xFF,
    "link_error_recovery": 0xFF,
    "port_rcv_constraint_errors": 0xFF,
    "port_xmit_constraint_errors": 0xFF,
    "local_link_integrity_errors": 0xF,
    "excessive_buffer_overrun_errors": 0xF,
    "symbol_error": 0xFFFF,
    "port_rcv_errors": 0xFFFF,
    "port_rcv_remote_physical_errors": 0xFFFF,
    "port_rcv_switch_relay_errors": 0xFFFF,
    "port_xmit_discards": 0xFFFF,
    "VL15_dropped": 0xFFFF,
}
MIN_INTERVAL_S = 1.0  # two readings closer than this give no meaningful rate


def expectation(
    config: FabricConfig, entry: tuple[str, InstanceType] | None = None
) -> FabricExpectation:
    """Config overrides win over the catalog entry of the node's instance type."""
    spec = entry[1].fabric if entry else None
    name = entry[0] if entry else None
    kind = config.kind or (spec.kind if spec else None)
    count = (
        config.expect_adapters
        if config.expect_adapters is not None
        else (spec.count if spec else None)
    )
    rate = config.expect_rate_gbps or (spec.rate_gbps if spec else None)
    if entry and spec is None and config.expect_adapters is None:
        count = 0  # the catalog says this type has no RDMA fabric
    overridden = any(
        v is not None for v in (config.kind, config.expect_adapters, config.expect_rate_gbps)
    )
    source = "config" if overridden else (f"catalog:{name}" if name else "none")
    return FabricExpectation(
        kind=kind, count=count, rate_gbps=rate, instance_type=name, source=source
    )


def compute_adapters(
    reading: FabricReading, expected: FabricExpectation, patterns: list[str]
) -> list[FabricAdapter]:
    """The adapters that carry GPU traffic: named by `patterns`, else all of the kind."""
    out = []
    for a in reading.adapters:
        if patterns:
            if any(fnmatch.fnmatchcase(a.name, p) for p in patterns):
                out.append(a)
        elif expected.kind is None or a.kind == expected.kind:
            out.append(a)
    return out


@rule(
    "fabric",
    reads=FabricReading,
    uses=(NodeInstance, FabricExpectation),
    codes=("FABRIC_COUNT_LOW", "FABRIC_ERRORS", "FABRIC_PORT_DOWN", "FABRIC_RATE_LOW"),
)
def fabric_rule(reading: FabricReading, on: Inputs) -> list[Finding]:
    """RDMA adapters (EFA/InfiniBand/RoCE): count, port state, rate, error-counter rates."""
    cfg: FabricConfig = on.config.fabric
    node = on.get(NodeInstance) or NodeInstance()
    out: list[Finding] = []
    if node.configured and node.entry is None and cfg.expect_adapters is None:
        # Asked to judge against a type we do not know (a typo, a new type): failing
        # closed beats silently not counting. A DMI name we do not know is not an error:
        # it is any generic server's model name.
        out.append(
            Finding(
                check=CHECK,
                status=Status.FAILED,
                code="CHECK_ERROR",
                message=f"instance type {node.name!r} is not in the catalog: add it under "
                "node.fabric.instances or set node.fabric.expect_adapters",
                evidence={"instance_type": node.name},
                observed_at=reading.taken_at,
            )
        )
    expected = on.get(FabricExpectation) or expectation(cfg, node.entry)
    return out + judge(reading, expected=expected, config=cfg, previous=on.previous())


def judge(
    reading: FabricReading,
    *,
    expected: FabricExpectation,
    config: FabricConfig,
    previous: FabricReading | None = None,
) -> list[Finding]:
    now = reading.taken_at
    out: list[Finding] = []

    def add(
        status: Status, code: str, component: str, message: str, action: Action, **evidence: Any
    ) -> None:
        out.append(
            Finding(
                check=CHECK,
                status=status,
                code=code,
                component=component,
                message=message,
                action=action,
                evidence=evidence,
                observed_at=now,
            )
        )

    for problem in reading.problems:
        add(Status.FAILED, "CHECK_ERROR", "node", problem, Action.NONE)
    if not reading.sysfs_present:
        if expected.count:
            add(
                Status.FAILED,
                "DEPENDENCY_MISSING",
                "node",
                f"/sys/class/infiniband is absent but {expected.count} {expected.kind} adapters "
                "are expected: the RDMA driver is not loaded",
                Action.NONE,
                expected=_ev(expected),
            )
        return out

    adapters = compute_adapters(reading, expected, config.adapters)
    units = _count_units(adapters, expected.kind)
    lists_adapters = not reading.source.startswith("fi_info")  # fi_info counts EFA only
    if lists_adapters and expected.count is not None and units < expected.count:
        add(
            Status.FAILED,
            "FABRIC_COUNT_LOW",
            "node",
            f"{units} of {expected.count} {expected.kind or 'fabric'} adapters present",
            Action.REBOOT,
            found=units,
            found_adapters=[a.name for a in adapters],
            source=reading.source,
            expected=_ev(expected),
        )
    fi = reading.fi_info
    fi_short = (
        fi is not None
        and fi.ran
        and expected.kind == "efa"
        and expected.count is not None
        and len(fi.domains) < expected.count
    )
    if fi_short:
        assert fi is not None
        add(
            Status.FAILED,
            "FABRIC_COUNT_LOW",
            "node",
            f"fi_info -p efa lists {len(fi.domains)} of {expected.count} EFA devices",
            Action.REBOOT,
            source="fi_info",
            domains=list(fi.domains),
            expected=_ev(expected),
        )

    before = {a.name: a for a in previous.adapters} if previous else {}
    dt_s = (now - previous.taken_at).total_seconds() if previous else 0.0
    for a in adapters:
        comp = f"nic:{a.name}"
        for problem in a.problems:
            add(Status.FAILED, "CHECK_ERROR", comp, problem, Action.NONE)
        if not a.ports and not a.problems:
            add(
                Status.FAILED,
                "FABRIC_PORT_DOWN",
                comp,
                f"{a.name} has no ports in sysfs",
                Action.REBOOT,
            )
        old_ports = {p.number: p for p in before[a.name].ports} if a.name in before else {}
        for p in a.ports:
            _judge_port(a, p, expected, add)
            _judge_counters(a, p, old=old_ports.get(p.number), dt_s=dt_s, config=config, add=add)
        if a.kind == "efa":
            _judge_efa_netdev(a, add)
        elif a.ports and all(p.state is None for p in a.ports):
            _judge_efa_netdev(a, add)  # a tool that knows only the interface (ibdev2netdev)
    return out


def _count_units(adapters: list[FabricAdapter], kind: str | None) -> int:
    # EFA is counted per device; IB/RoCE per port (a dual-port HCA is two compute links).
    if kind == "efa":
        return len(adapters)
    return sum(max(1, len(a.ports)) for a in adapters)


def _judge_port(a: FabricAdapter, p: FabricPort, expected: FabricExpectation, add: Any) -> None:
    comp = f"nic:{a.name}" if len(a.ports) == 1 else f"nic:{a.name}/{p.number}"
    for problem in p.problems:
        add(Status.FAILED, "CHECK_ERROR", comp, problem, Action.NONE)
    ev = {
        "state": p.state,
        "phys_state": p.phys_state,
        "rate_gbps": p.rate_gbps,
        "link_layer": p.link_layer,
    }
    if p.state is None and p.phys_state is None:
        return  # unreadable (a CHECK_ERROR above), or a tool that does not print it
    # Either one known and wrong is enough (`ibv_devinfo` prints no physical state).
    if p.state not in ("ACTIVE", None) or p.phys_state not in ("LinkUp", None):
        add(
            Status.FAILED,
            "FABRIC_PORT_DOWN",
            comp,
            f"{a.name} port {p.number} is {p.state}/{p.phys_state}, not ACTIVE/LinkUp",
            Action.REBOOT,
            **ev,
        )
        return
    if expected.rate_gbps and p.rate_gbps is not None and p.rate_gbps < expected.rate_gbps:
        add(
            Status.FAILED,
            "FABRIC_RATE_LOW",
            comp,
            f"{a.name} port {p.number} runs at {p.rate_gbps:g} Gb/s, expected "
            f"{expected.rate_gbps:g}",
            Action.INVESTIGATE,
            expected_rate_gbps=expected.rate_gbps,
            **ev,
        )


def _judge_efa_netdev(a: FabricAdapter, add: Any) -> None:
    # The EFA driver reports ACTIVE/LinkUp unconditionally: the interface tells the truth
    # (and it is all `ibdev2netdev` knows of a RoCE port).
    for nd in a.netdevs:
        if nd.operstate is None:
            continue  # unreadable: the probe recorded a problem
        if nd.operstate != "up" or nd.carrier != 1:
            add(
                Status.FAILED,
                "FABRIC_PORT_DOWN",
                f"nic:{a.name}",
                f"{a.name}'s interface {nd.name} is {nd.operstate} (carrier {nd.carrier})"
                + (
                    "; the EFA driver's own ACTIVE/LinkUp is not trusted" if a.kind == "efa" else ""
                ),
                Action.REBOOT,
                netdev=nd.name,
                operstate=nd.operstate,
                carrier=nd.carrier,
            )


def _judge_counters(
    a: FabricAdapter,
    p: FabricPort,
    *,
    old: FabricPort | None,
    dt_s: float,
    config: FabricConfig,
    add: Any,
) -> None:
    comp = f"nic:{a.name}" if len(a.ports) == 1 else f"nic:{a.name}/{p.number}"
    watched = set(config.error_fail_per_h) | set(config.error_warn_per_h)
    for name, value in p.counters:
        if name not in watched:
            continue
        limit = COUNTER_MAX.get(name)
        # Only a saturated fail-level counter (link_downed) is flagged: the 4-bit
        # excessive_buffer_overrun_errors sits at 15 on every port of real healthy nodes.
        if limit is not None and value >= limit and name in config.error_fail_per_h:
            add(
                Status.WARNING,
                "FABRIC_ERRORS",
                comp,
                f"{a.name} counter {name} is saturated at {value}: new errors cannot be seen "
                "until it is cleared (perfquery -x -R)",
                Action.INVESTIGATE,
                counter=name,
                value=value,
                saturated=True,
            )
            continue
        if old is None or dt_s < MIN_INTERVAL_S:
            continue
        prev = old.counter(name)
        if prev is None or value < prev:
            continue  # new counter or cleared/reset since the last reading: no rate yet
        delta = value - prev
        per_h = delta * 3600.0 / dt_s
        fail = config.error_fail_per_h.get(name)
        warn = config.error_warn_per_h.get(name)
        ev = {
            "counter": name,
            "value": value,
            "previous": prev,
            "delta": delta,
            "interval_s": round(dt_s, 3),
            "per_hour": round(per_h, 3),
        }
        if fail is not None and delta > 0 and per_h > fail:
            add(
                Status.FAILED,
                "FABRIC_ERRORS",
                comp,
                f"{a.name} {name} rose by {delta} in {dt_s:.0f} s ({per_h:.1f}/h > {fail:g}/h)",
                Action.NONE,
                limit_per_hour=fail,
                **ev,
            )
        elif warn is not None and delta > 0 and per_h > warn:
            add(
                Status.WARNING,
                "FABRIC_ERRORS",
                comp,
                f"{a.name} {name} rose by {delta} in {dt_s:.0f} s ({per_h:.1f}/h > {warn:g}/h)",
                Action.NONE,
                limit_per_hour=warn,
                **ev,
            )


def _ev(expected: FabricExpectation) -> dict[str, Any]:
    return {
        "kind": expected.kind,
        "count": expected.count,
        "rate_gbps": expected.rate_gbps,
        "instance_type": expected.instance_type,
        "source": expected.source,
    }
