"""What a restart costs, from the phases the lab measured (`restart_phases.yaml`) scaled to
the job's size (called by `sim.restart`).

The lab restarts a 2-rank gang on one machine; a 2,048-node job differs in three ways, each
a term with its own measurement: the control plane stops and schedules pods one by one
(`pods`), every rank does a round on the rendezvous store (`world`), and each rank reads a
larger shard of the checkpoint (`bytes`). What is neither (starting the processes, the
first step) runs on every node at once and keeps the lab's seconds. A phase grows from its
anchor: `seconds + rate x (size - the anchor's size)`, never below the lab's own figure.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import Field, model_validator

from gpuvigil.core.config import StrictModel

PHASES = ("stop", "reschedule", "process_start", "rendezvous", "restore", "first_step")
# cold: every phase for the gang; in_place: torchrun's restart on the same pods;
# survivors_kept: the lost pods' phases, the survivors waiting in their processes
Mode = Literal["cold", "in_place", "survivors_kept"]


class Anchor(StrictModel):
    """The lab run whose phases the file holds: the sizes every phase grows from."""

    pods: int = Field(ge=1)
    ranks: int = Field(ge=1)
    checkpoint_bytes_per_rank: float = Field(ge=0)
    source: str = Field(min_length=1)


class Phase(StrictModel):
    seconds: float = Field(ge=0, description="measured in the anchor's lab run")
    scales_with: Literal["fixed", "pods", "world", "bytes"]
    per_pod_s: float = Field(0.0, ge=0)
    per_member_s: float = Field(0.0, ge=0)
    read_bytes_per_s: float = Field(0.0, ge=0)
    source: str = Field(min_length=1, description="the lab run or bench, and its date")

    @model_validator(mode="after")
    def _rate_for_its_law(self) -> Phase:
        # a phase said to grow with size but given no rate would quietly stay at 2 ranks' cost
        need = {"pods": self.per_pod_s, "world": self.per_member_s,
                "bytes": self.read_bytes_per_s}.get(self.scales_with)  # fmt: skip
        if need is not None and need <= 0:
            raise ValueError(f"scales_with {self.scales_with} needs its rate")
        return self


class Measured(StrictModel):
    """A phase's seconds measured on another lab run than the anchor's (its laws kept)."""

    seconds: float = Field(ge=0)
    source: str = Field(min_length=1)


class RestartPhases(StrictModel):
    anchor: Anchor
    phases: dict[str, Phase]
    in_place: tuple[str, ...]
    survivors_kept: tuple[str, ...]
    pods_of_lost: tuple[str, ...]  # survivors_kept phases sized by the lost pods alone
    # The lab's in-process job measures the survivors_kept phases itself (one interpreter
    # starts, not torchrun's agent and then its worker): their seconds in that mode
    survivors_kept_seconds: dict[str, Measured] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _every_phase(self) -> RestartPhases:
        if tuple(self.phases) != PHASES:
            raise ValueError(f"phases must be {PHASES}, in order")
        for name in ("in_place", "survivors_kept", "pods_of_lost"):
            if not set(getattr(self, name)) <= set(PHASES):
                raise ValueError(f"{name} names unknown phases: {getattr(self, name)}")
        if not set(self.survivors_kept_seconds) <= set(self.survivors_kept):
            raise ValueError(f"survivors_kept_seconds names phases survivors_kept has not: "
                             f"{sorted(self.survivors_kept_seconds)}")  # fmt: skip
        return self

    def phase_s(
        self, name: str, *, pods: int, ranks: int, ckpt_bytes: float,
        read_bytes_per_s: float | None = None, mode: Mode = "cold",
    ) -> float:  # fmt: skip
        """One phase's seconds for a gang of `pods` pods and `ranks` ranks, each reading
        `ckpt_bytes` of checkpoint (at `read_bytes_per_s` when the copy is not DCP's), from
        the seconds measured for `mode` where there are some."""
        p, a = self.phases[name], self.anchor
        kept = self.survivors_kept_seconds.get(name) if mode == "survivors_kept" else None
        base = kept.seconds if kept is not None else p.seconds
        rate = read_bytes_per_s or p.read_bytes_per_s or 1.0
        grow = {
            "fixed": 0.0,
            "pods": p.per_pod_s * (pods - a.pods),
            "world": p.per_member_s * (ranks - a.ranks),
            "bytes": (ckpt_bytes - a.checkpoint_bytes_per_rank) / rate,
        }[p.scales_with]
        return base + max(0.0, grow)

    def cost_s(
        self, *, pods: int, ranks: int, ckpt_bytes: float, mode: Mode = "cold",
        lost_pods: int = 0, read_bytes_per_s: float | None = None,
    ) -> float:  # fmt: skip
        """A restart's seconds: `mode` picks the phases; where the survivors kept their
        processes, the phases in `pods_of_lost` are sized by the `lost_pods` alone."""
        names = {"cold": PHASES, "in_place": self.in_place,
                 "survivors_kept": self.survivors_kept}[mode]  # fmt: skip
        total = 0.0
        for n in names:
            sized = lost_pods if mode == "survivors_kept" and n in self.pods_of_lost else pods
            total += self.phase_s(n, pods=sized, ranks=ranks, ckpt_bytes=ckpt_bytes,
                                  read_bytes_per_s=read_bytes_per_s, mode=mode)  # fmt: skip
        return total


@cache
def load() -> RestartPhases:
    text = resources.files(__package__).joinpath("restart_phases.yaml").read_text("utf-8")
    return RestartPhases.model_validate(yaml.safe_load(text))
