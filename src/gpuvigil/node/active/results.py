"""What an active check measured, and how a measurement becomes a Finding.

Measurements travel from the worker subprocess to the parent as JSON lines; every one,
passing or not, is shown by `gpuvigil preflight` (achieved vs expected), and the ones that
are not OK become findings. No torch here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from gpuvigil.core.findings import Action, Finding, Status

# What each active finding calls for. Wrong arithmetic or bad memory: take the GPU out now.
ACTIONS: dict[str, tuple[Action, bool]] = {
    "GPU_SDC": (Action.REPLACE, True),
    "GPU_MEMORY_FAULT": (Action.RESET_GPU, True),
    "GPU_SLOW": (Action.INVESTIGATE, False),
    "PCIE_SLOW": (Action.REBOOT, False),
    "NVLINK_SLOW": (Action.RESET_GPU, False),
    "FABRIC_SLOW": (Action.INVESTIGATE, False),
}


@dataclass(frozen=True)
class Measurement:
    check: str  # "matmul" | "load" | "memory" | "bandwidth" | "allreduce"
    component: str  # "gpu:3", "cpu:0", "node"
    metric: str  # "bf16_max_error", "tflops_bf16", "h2d_gbs", "busbw_gbs", "bad_bytes"
    achieved: float | None
    expected: float | None  # None: no figure to compare with (reported, not judged)
    unit: str
    status: str = "OK"  # Status value
    code: str | None = None
    message: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Measurement:
        """Read one from the worker's JSON; ValueError when it is not a measurement."""
        if not isinstance(data, dict):
            raise ValueError(f"not an object: {type(data).__name__}")
        m = cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        texts = (m.check, m.component, m.metric, m.unit, m.message)
        numbers = (m.achieved, m.expected)
        if (
            not all(isinstance(t, str) for t in texts)
            or m.status not in {s.value for s in Status}
            or not (m.code is None or isinstance(m.code, str))
            or not all(n is None or isinstance(n, int | float) for n in numbers)
            or not isinstance(m.evidence, dict)
        ):
            raise ValueError(f"malformed measurement: {str(data)[:200]}")
        return m


def to_finding(m: Measurement, *, observed_at: datetime) -> Finding | None:
    """The finding for a measurement that is not OK (None when it is)."""
    if m.status == Status.OK.value or m.code is None:
        return None
    action, fatal = ACTIONS.get(m.code, (Action.NONE, False))
    evidence = {
        "metric": m.metric,
        "achieved": m.achieved,
        "expected": m.expected,
        "unit": m.unit,
        **m.evidence,
    }
    return Finding(
        check=f"active.{m.check}",
        status=Status(m.status),
        code=m.code,
        component=m.component,
        message=m.message,
        action=action,
        fatal=fatal,
        evidence=evidence,
        observed_at=observed_at,
    )
