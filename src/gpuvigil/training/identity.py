"""Which job, which node, which events file: decided here once, from config and environment.

Called by `process_group.init` (the ranks) and `launch` (the per-node monitor), so a rank
and the monitor beside it always name the node and the job alike. The node name is
`core.naming`'s (`training.node_name`, else the environment the agent also reads, else the
short host name), so training events, the agent's findings and the controller's decisions
name the same node.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuvigil.core import naming
from gpuvigil.training.config import TrainingConfig


def node_name(config: TrainingConfig, env: Mapping[str, str]) -> str:
    return naming.node_name(config.node_name, env=env)


def job_id(config: TrainingConfig, env: Mapping[str, str]) -> str:
    return config.job_id or env.get("TORCHELASTIC_RUN_ID") or "local"
