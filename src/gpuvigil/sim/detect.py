"""Layer 1 inside the simulator: what the node checks report for each simulated fault.

Called by the engine. `Layer1.verdict(fault)` returns the FAILED findings the node agent
would publish for a node carrying that fault, and how soon after onset its check runs.
Verdicts are cached per fault name and GPU: the readings of one fault kind on one GPU are
the same on every node, so the rules run once per kind and GPU, not once per event.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.config import NodeConfig
from gpuvigil.sim import hardware


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
