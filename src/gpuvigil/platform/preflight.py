"""Deep validation before a node takes work (`gpuvigil preflight`). Settings: `preflight:`."""

from __future__ import annotations

from gpuvigil.core.config import StrictModel


class PreflightConfig(StrictModel):
    """Filled in by the preflight work: time budget, active checks, expected figures."""
