"""The one Slurm client: `scontrol`, `sinfo` and `squeue` through the fail-closed runner.

Used by the agent's Slurm sink and `gpuvigil slurm-healthcheck` (this node's record) and by
the controller's Slurm adapter (`platform.clusters.slurm`: every node). Every call is an
argv list with a deadline; a tool that is missing, refuses, times out or fails raises
`SlurmError` with a `kind` the caller maps to what it does next (the sink retries, the
adapter acts on nothing it could not read).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

from gpuvigil.io import exec as ex

Kind = Literal["missing", "refused", "failed"]


class SlurmError(RuntimeError):
    """`missing`: the tool is not installed; `refused`: Slurm said no (an unknown node, no
    permission): retrying cannot help; `failed`: a timeout, a crash, a slurmctld that did not
    answer: retry later."""

    def __init__(self, message: str, *, kind: Kind) -> None:
        super().__init__(message)
        self.kind = kind


class SlurmClient:
    def __init__(
        self,
        *,
        bin_dir: str | None = None,
        conf: str | None = None,
        timeout_s: float = 15.0,
        env: Mapping[str, str] | None = None,
        scontrol: str = "scontrol",
    ) -> None:
        self.bin_dir, self.timeout_s = bin_dir, timeout_s
        self.scontrol = scontrol
        self.env: dict[str, str] | None = dict(env) if env is not None else None
        if conf:
            self.env = {**(self.env if self.env is not None else os.environ), "SLURM_CONF": conf}
        self.calls: Counter[str] = Counter()

    def run(self, tool: str, *args: str, timeout_s: float | None = None) -> str:
        """One call; its stdout. `tool`: scontrol, sinfo, squeue or scancel. `timeout_s`
        shortens this call's limit (a fenced write gets what is left of its lease)."""
        exe = self.scontrol if tool == "scontrol" else tool
        if self.bin_dir and "/" not in exe:
            exe = f"{self.bin_dir}/{exe}"
        self.calls[f"{tool} {args[0]}" if tool == "scontrol" and args else tool] += 1
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        res = ex.run([exe, *args], timeout_s=limit, env=self.env)
        what = " ".join([tool, *args[:2]])
        if res.error == "missing":
            raise SlurmError(f"{tool} is not installed", kind="missing")
        if not res.ok:
            err = res.stderr_tail(300)
            if res.error is None and ("Invalid node name" in err or "Access" in err):
                raise SlurmError(f"{what}: {err}", kind="refused")
            bad = ex.failure_finding(res, check="slurm")
            detail = bad.message if bad is not None else f"{res.error or res.returncode} {err}"
            raise SlurmError(f"{what}: {detail}", kind="failed")
        return res.text

    def json(self, tool: str, *args: str) -> dict[str, Any]:
        try:
            data = json.loads(self.run(tool, *args))
        except ValueError as e:
            raise SlurmError(
                f"{tool} printed output that does not parse: {e}", kind="failed"
            ) from e
        return data if isinstance(data, dict) else {}

    def show_node(self, name: str) -> dict[str, str]:
        return parse_show_node(self.run("scontrol", "show", "node", name, "-o"))

    def update(self, name: str, *fields: str) -> None:
        self.run("scontrol", "update", f"NodeName={name}", *fields)

    def drain(self, name: str, *, reason: str) -> None:
        self.update(name, "State=DRAIN", f"Reason={reason}")

    def resume(self, name: str) -> None:
        self.update(name, "State=RESUME")


_FIELD = re.compile(r"(?:^|\s)(\w+)=")


def parse_show_node(text: str) -> dict[str, str]:
    """`scontrol show node X -o` -> {key: value}. Never raises.

    Values may contain spaces (`OS=Linux 6.1 #1 SMP`, `Reason=gpuvigil: XID_79 gpu:3
    [root@2026-11-30T08:00:00]`), so a value runs to the next ` Key=`; on 22.05 `Reason`
    comes before `Extra`. The `[user@time]` suffix Slurm adds to a reason is dropped.
    """
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    out: dict[str, str] = {}
    keys = list(_FIELD.finditer(line))
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    if "Reason" in out:
        out["Reason"] = re.sub(r"\s*\[[^\]]*@[^\]]*\]\s*$", "", out["Reason"]).strip()
    return out
