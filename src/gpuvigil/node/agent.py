"""The node agent's periodic loop (`gpuvigil agent`). Settings: the `agent:` section."""

from __future__ import annotations

from gpuvigil.core.config import StrictModel


class AgentConfig(StrictModel):
    """Filled in by the agent work: schedules, sinks, listen address, state file."""
