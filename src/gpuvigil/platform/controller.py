"""The remediation controller's reconcile loop (`gpuvigil controller`). Settings: `controller:`."""

from __future__ import annotations

from gpuvigil.core.config import StrictModel


class ControllerConfig(StrictModel):
    """Filled in by the controller work: policy timings, safety budgets, breaker, cluster."""
