"""The one way to name this node: what every layer writes in its reports and events, and
what Kubernetes and Slurm call the node.

In order: a name given explicitly (a flag, `agent.node_name`), `GPUVIGIL_NODE_NAME`,
`NODE_NAME` (the Kubernetes downward API's `spec.nodeName`), `SLURMD_NODENAME` (set by Slurm
for prologs and health checks), else the short host name (Slurm's NodeName is the host
name up to the first dot, `hostname -s`; a Kubernetes pod always has `NODE_NAME`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

ENV_VARS = ("GPUVIGIL_NODE_NAME", "NODE_NAME", "SLURMD_NODENAME")


def node_name(explicit: str | None = None, *, env: Mapping[str, str] | None = None) -> str:
    if explicit:
        return explicit
    environ = os.environ if env is None else env
    for var in ENV_VARS:
        if environ.get(var):
            return environ[var]
    return socket.gethostname().split(".")[0]
