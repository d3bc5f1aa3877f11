"""Layer 1 inside the simulator: what the node checks report for each simulated fault.

Called by the engine. `Layer1.verdict(fault)` returns the FAILED findings the node agent
would publish for a node carrying that fault, and how soon after onset its check runs.
Verdicts are cached per fault name: the readings of one fault kind are the same on every
node, so the rules run once per kind, not once per event.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from gpuvigil.core.findings import Action, Finding, Status

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Verdict:
    findings: tuple[Finding, ...]
    interval_s: float  # the check that sees it runs this often: found U(0, interval) later

    @property
    def seen(self) -> bool:
        return bool(self.findings)

    @property
    def action(self) -> Action:
        return Action.worst(f.action for f in self.findings)

    @property
    def fatal(self) -> bool:
        return any(f.fatal for f in self.findings)

    @property
    def could_not_run(self) -> bool:
        return bool(self.findings) and all(f.could_not_run for f in self.findings)


# (check, code, component, action, fatal, interval_s) per Fault name. Source of truth until
# the layer-1 rules are wired in (`_from_rules`); the rules' verdicts replace these rows.
_TABLE: dict[str, tuple[str, str, str, Action, bool, float]] = {
    "GPU_FALLEN_OFF_BUS": ("xid", "XID_79", "gpu:3", Action.REBOOT, True, 5.0),
    "NVLINK_DOWN": ("nvlink", "NVLINK_DOWN", "gpu:3", Action.RESET_GPU, True, 60.0),
    "ECC_UNCORRECTABLE": ("memory", "ROW_REMAP_PENDING", "gpu:3", Action.RESET_GPU, True, 5.0),
    "SRAM_ECC": ("xid", "XID_95", "gpu:3", Action.RESET_GPU, True, 5.0),
    "GSP_ERROR": ("xid", "XID_119", "gpu:3", Action.REBOOT, True, 5.0),
    "THERMAL_FAULT": ("thermal", "TEMPERATURE_HIGH", "gpu:3", Action.REPLACE, True, 60.0),
    "FABRIC_LINK_DOWN": ("fabric", "FABRIC_PORT_DOWN", "nic:0", Action.REBOOT, True, 300.0),
    "THERMAL_SLOWDOWN": ("thermal", "THERMAL_SLOWDOWN", "gpu:3", Action.REBOOT, False, 60.0),
    "PCIE_DEGRADED": ("pcie", "PCIE_DEGRADED", "gpu:3", Action.REBOOT, False, 300.0),
    "EFA_DOWN": ("fabric", "FABRIC_COUNT_LOW", "node", Action.REBOOT, False, 300.0),
    "TOOL_HANG": ("nvidia_smi", "CHECK_TIMEOUT", "node", Action.NONE, False, 60.0),
    "TOOL_MISSING": ("dcgm", "DEPENDENCY_MISSING", "node", Action.NONE, False, 60.0),
    "APP_XID": ("xid", "XID_13", "gpu:3", Action.RESTART_APP, False, 5.0),
    "BOOT_NOISE": ("xid", "XID_154", "gpu:0", Action.NONE, False, 5.0),
    # Not visible to passive checks: silent corruption (active checks only), a host that
    # is down (its agent is silent: the instance checks see it), a hang (the job sees it).
    "SILENT_CORRUPTION": ("", "", "", Action.NONE, False, 0.0),
    "HOST_DOWN": ("", "", "", Action.NONE, False, 0.0),
    "NCCL_HANG": ("", "", "", Action.NONE, False, 0.0),
}

# What the active checks (matmul correctness, memory pattern) report for a silent fault.
_ACTIVE = {"SILENT_CORRUPTION": ("matmul", "GPU_SDC", "gpu:3", Action.REPLACE, True)}


class Layer1:
    """Verdicts of the node checks, cached per fault name."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, bool], Verdict] = {}
        self.rule_calls = 0

    def verdict(self, fault: str, *, active: bool = False) -> Verdict:
        key = (fault, active)
        v = self._cache.get(key)
        if v is None:
            self.rule_calls += 1
            v = self._cache[key] = _from_table(fault, active=active)
        return v


def _from_table(fault: str, *, active: bool) -> Verdict:
    row = _ACTIVE.get(fault) if active else None
    if row is not None:
        check, code, comp, action, fatal = row
        return Verdict((_finding(check, code, comp, action, fatal),), 0.0)
    check, code, comp, action, fatal, interval = _TABLE.get(
        fault, ("", "", "", Action.NONE, False, 0)
    )
    if not code:
        return Verdict((), 0.0)
    f = _finding(check, code, comp, action, fatal)
    if action is Action.NONE and not f.could_not_run:
        return Verdict((), interval)  # reported OK: boot noise is ignored by the catalog
    return Verdict((f,), interval)


def _finding(check: str, code: str, comp: str, action: Action, fatal: bool) -> Finding:
    return Finding(
        check=check, status=Status.FAILED, code=code, component=comp, action=action,
        fatal=fatal, observed_at=EPOCH,
    )  # fmt: skip
