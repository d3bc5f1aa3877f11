"""Layer 1 inside the simulator: what the node checks report for each simulated fault.

Called by the engine. `Layer1.verdict(fault)` returns the FAILED findings the node agent
would publish for a node carrying that fault, and how soon after onset its check runs.
Verdicts are cached per fault name and GPU: the readings of one fault kind on one GPU are
the same on every node, so the rules run once per kind and GPU, not once per event.
`Layer1.cures(kind)` is the remediation ladder that cures a fault: the steps start where
the verdict asks for an Xid fault (the shipped catalog), the odds are the fault model's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.config import NodeConfig
from gpuvigil.platform.state import LADDER
from gpuvigil.sim import hardware

if TYPE_CHECKING:
    from gpuvigil.sim.faults import FaultKind

# A cure ladder: each step, weakest first, with its chance of curing the fault given that
# the steps before it did not (a failed step escalates to the next).
Cures = tuple[tuple[Action, float], ...]

# The steps a verdict can ask that something runs for: restarting the application (the
# job's own restart) and the controller's ladder. NONE and INVESTIGATE (a person) run no
# step, so for them the fault model's ladder stands.
_RUNNABLE = frozenset({Action.RESTART_APP, *LADDER})
_XID = ("XID_", "SXID_")  # the codes of kernel_log.rules.xid's findings, the catalog's verdicts


@dataclass(frozen=True)
class Verdict:
    findings: tuple[Finding, ...]
    interval_s: float  # the check that sees it runs this often: found U(0, interval) later

    @property
    def seen(self) -> bool:
        """A FAILED finding: what blocks a node (WARNINGs are published, not acted on)."""
        return any(f.status is Status.FAILED for f in self.findings)

    @property
    def action(self) -> Action:
        return Action.worst(f.action for f in self.findings)

    @property
    def fatal(self) -> bool:
        return any(f.fatal for f in self.findings)

    @property
    def could_not_run(self) -> bool:
        failed = [f for f in self.findings if f.status is Status.FAILED]
        return bool(failed) and all(f.could_not_run for f in failed)


# Verdicts for the default node config, shared by every run in this process.
_SHARED: dict[tuple[str, int, bool], Verdict] = {}


class Layer1:
    """Verdicts of the real node checks (`sim.hardware`), cached per fault name."""

    def __init__(self, config: NodeConfig | None = None) -> None:
        self.config = config
        self._cache: dict[tuple[str, int, bool], Verdict] = _SHARED if config is None else {}
        self._cures: dict[tuple[FaultKind, int], Cures] = {}
        self.rule_calls = 0

    def verdict(self, fault: str, *, gpu: int = 0, active: bool = False) -> Verdict:
        """The findings for `fault` on GPU `gpu` (the one the fault model drew)."""
        key = (fault, gpu, active)
        v = self._cache.get(key)
        if v is None:
            self.rule_calls += 1
            if active:
                found = hardware.active_findings(fault, gpu=gpu)
                interval = 0.0  # the active-check schedule decides (SimConfig)
            else:
                found = hardware.findings_for(fault, gpu=gpu, config=self.config)
                interval = min((hardware.check_interval_s(f.check) for f in found), default=0.0)
            v = self._cache[key] = Verdict(tuple(found), interval)
        return v

    def cures(self, kind: FaultKind, *, gpu: int = 0) -> Cures:
        """The ladder that cures `kind` on GPU `gpu` (empty: nothing does).

        For a fault the agent reports with an Xid, the ladder starts at the step the verdict
        asks (the shipped catalog, through the real rules and this config's overrides): the
        controller runs that step first and the agent clears the Xid once it has run
        (`kernel_log.rules.xid`: a GPU reset clears what calls for RESET_GPU). A first step taken
        from the fault model's own table instead credited a cure no code gives, or withheld
        one it does: Xid 119 is RESET_GPU in the catalog, the table's first step a reboot.

        The odds stay the fault model's (its model of the hardware): the catalog's step
        cures with the table's chance for its strongest step no stronger than it (a reboot
        also resets the GPUs), or with the table's first chance when every table step is
        stronger; the table's stronger steps follow with their own chances.
        """
        key = (kind, gpu)
        found = self._cures.get(key)
        if found is None:
            found = self._cures[key] = self._derive_cures(kind, gpu)
        return found

    def _derive_cures(self, kind: FaultKind, gpu: int) -> Cures:
        table: Cures = tuple((Action(a), p) for a, p in kind.fix)
        if not table:
            return ()  # nothing on the machine cures it (a missing tool, a bad driver)
        v = self.verdict(kind.fault, gpu=gpu)
        asks = v.action
        if asks not in _RUNNABLE or not any(f.code.startswith(_XID) for f in v.findings):
            return table  # not an Xid the catalog judges, or no step runs for it
        first = max((p for a, p in table if a.rank <= asks.rank), default=table[0][1])
        return ((asks, first), *((a, p) for a, p in table if a.rank > asks.rank))


def cure_probability(cures: Cures, step: Action) -> float:
    """The chance that `step` cures a fault with this ladder: the best among the steps it
    includes (a reboot also resets the GPUs, a replacement is a new machine)."""
    return max((p for a, p in cures if a.rank <= step.rank), default=0.0)


def sample_fixed_by(cures: Cures, rng: random.Random) -> Action | None:
    """The least ladder step that cures this instance of a fault (None: nothing does): the
    step the controller's cluster clears its findings at (`MemoryCluster`'s `fixed_by`)."""
    for action, p in cures:
        if rng.random() < p:
            return action
    return None
