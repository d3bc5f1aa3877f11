"""A synthetic fleet event log, for the report's benchmark, docs screenshots and tests.

Not a simulator (that is `gpuvigil.sim`, with a fault model and the real policy): this
writes plausible, time-ordered event lines fast and repeatably (seeded), with every kind
the report reads — node states, Xid/ECC/fabric findings with their drain/repair/return,
false alarms, planned maintenance, jobs with checkpoints, restarts, hangs and user-code
failures. Used by `bench/report.py` and the observe tests.
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Iterator
from pathlib import Path

from gpuvigil.core import exit_codes
from gpuvigil.core.exit_codes import Charged

T0 = 1_764_460_800.0  # 2025-11-30 00:00:00 UTC
TICK_S = 60.0

# (weight, code, component prefix, action, fatal) of the node faults the log contains.
FAULTS = (
    (5, "XID_79", "gpu", "REBOOT", True),
    (4, "XID_48", "gpu", "RESET_GPU", True),
    (3, "ECC_UNCORRECTED_VOLATILE", "gpu", "RESET_GPU", True),
    (2, "ROW_REMAP_FAILURE", "gpu", "REPLACE", True),
    (3, "FABRIC_PORT_DOWN", "nic", "REBOOT", True),
    (2, "NVLINK_DOWN", "gpu", "RESET_GPU", True),
    (2, "CHECK_TIMEOUT", "node", "NONE", False),  # a tool hung: drained, nothing found
)


def _line(ts: float, kind: str, source: str, /, *, node: str | None = None,
          job: str | None = None, **data: object) -> str:  # fmt: skip
    obj: dict[str, object] = {"v": 1, "ts": round(ts, 3), "kind": kind, "source": source}
    if node is not None:
        obj["node"] = node
    if job is not None:
        obj["job"] = job
    obj["data"] = data
    return json.dumps(obj, separators=(",", ":"))


class _Fleet:
    def __init__(self, *, nodes: int, seed: int, job_nodes: int) -> None:
        self.rng = random.Random(seed)
        self.names = [f"node-{i:03d}" for i in range(nodes)]
        self.busy: set[str] = set()  # nodes out of service or in maintenance
        self.jobs: dict[str, list[str]] = {}
        self.working: set[str] = set()  # nodes in a running job
        self.job_nodes = job_nodes
        self.queue: list[tuple[float, int, str]] = []
        self.seq = 0
        self.next_job = 0

    def at(self, ts: float, line: str) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (ts, self.seq, line))

    def fault(self, now: float) -> None:
        r = self.rng
        free = [n for n in r.sample(self.names, min(8, len(self.names))) if n not in self.busy]
        if not free:
            return
        node = free[0]
        _, code, prefix, action, fatal = r.choices(FAULTS, weights=[f[0] for f in FAULTS])[0]
        comp = f"{prefix}:{r.randrange(8)}" if prefix == "gpu" else (
            f"nic:rdmap{r.randrange(16)}s0" if prefix == "nic" else "node")  # fmt: skip
        self.busy.add(node)
        detect = now + r.uniform(5, 90)
        self.at(now, _line(now, "fault", "sim", node=node, fault=code, component=comp))
        fs = {"code": code, "component": comp, "status": "FAILED", "action": action,
              "fatal": fatal, "check": "synthetic", "message": f"{code} on {comp}"}  # fmt: skip
        self.at(detect, _line(detect, "finding.set", "agent", node=node, evidence_ts=now, **fs))
        for job, nodes in self.jobs.items():
            if node in nodes:
                lost = r.uniform(60, 900)
                # As training records a worker the fault killed: no code of its own.
                restart = _line(now + 1, "job.restart", "training", job=job, node=node,
                                cause=Charged.UNKNOWN.value, kind="dead",
                                reason="worker lost", lost_s=lost)  # fmt: skip
                self.at(now + 1, restart)
        t = detect + 5
        # As the controller writes a move: the finding's code and component, beside the words.
        why = {"reason": code, "codes": [code], "components": [comp]}
        self.at(t, _line(t, "node.state", "controller", node=node, to="DRAINING", **why,
                         **{"from": "HEALTHY"}))  # fmt: skip
        found = code != "CHECK_TIMEOUT"
        fix = t + r.uniform(600, 4 * 3600 if action != "REPLACE" else 48 * 3600)
        self.at(t + 60, _line(t + 60, "node.state", "controller", node=node, to="REMEDIATING",
                              **why, **{"from": "DRAINING"}))  # fmt: skip
        self.at(t + 60, _line(t + 60, "remediation", "controller", node=node, action=action,
                              result="started", reason=code))  # fmt: skip
        self.at(fix - 1, _line(fix - 1, "remediation", "agent", node=node, action=action,
                               result="succeeded", reason=code, found=found))  # fmt: skip
        self.at(fix, _line(fix, "finding.cleared", "agent", node=node, **fs))
        self.at(fix + 1, _line(fix + 1, "node.state", "controller", node=node, to="HEALTHY",
                               reason="remediated", codes=[], components=[],
                               **{"from": "REMEDIATING"}))  # fmt: skip
        self.at(fix + 1.5, _line(fix + 1.5, "_free", "gen", node=node))

    def maintenance(self, now: float) -> None:
        node = self.rng.choice(self.names)
        if node in self.busy:
            return
        self.busy.add(node)
        end = now + self.rng.uniform(1800, 6 * 3600)
        self.at(now, _line(now, "node.maintenance", "controller", node=node, phase="start",
                           reason="driver upgrade"))  # fmt: skip
        self.at(end, _line(end, "node.maintenance", "controller", node=node, phase="end",
                           reason="driver upgrade"))  # fmt: skip
        self.at(end + 0.5, _line(end + 0.5, "_free", "gen", node=node))

    def job(self, now: float) -> None:
        r = self.rng
        free = [n for n in r.sample(self.names, min(len(self.names), 4 * self.job_nodes))
                if n not in self.busy and n not in self.working]  # fmt: skip
        if len(free) < self.job_nodes:
            return
        nodes = free[: self.job_nodes]
        self.working.update(nodes)
        self.next_job += 1
        job = f"job-{self.next_job:06d}"
        self.jobs[job] = nodes
        gpus = 8 * len(nodes)
        dur = r.uniform(3600, 36 * 3600)
        self.at(now, _line(now, "job.start", "training", job=job, nodes=nodes, gpus=gpus))
        for k in range(1, int(dur // 1800)):
            t = now + 1800 * k
            ok = r.random() > 0.002
            self.at(t, _line(t, "checkpoint", "training", job=job, step=k * 500,
                             duration_s=round(r.uniform(5, 40), 2),
                             stall_s=round(r.uniform(0.1, 2), 2),
                             result="ok" if ok else "failed"))  # fmt: skip
        end = now + dur
        outcome = r.random()
        if outcome < 0.02:
            h = end - 300
            self.at(h, _line(h, "hang", "training", job=job, node=nodes[0], rank=3,
                             step=int(dur // 2), where="all_reduce"))  # fmt: skip
            res, code = "failed", 134
        elif outcome < 0.05:
            res, code = "failed", 1
        elif outcome < 0.07:
            res, code = "cancelled", 143
        else:
            res, code = "succeeded", 0
        alloc = gpus * dur
        charged = {"cause": exit_codes.charged(code).value} if res == "failed" else {}
        self.at(end, _line(end, "job.end", "training", job=job, result=res, exit_code=code,
                           **charged,
                           allocated_gpu_s=round(alloc, 1),
                           productive_gpu_s=round(alloc * r.uniform(0.85, 0.98), 1)))  # fmt: skip
        self.at(end + 0.5, _line(end + 0.5, "_jobdone", "gen", job=job))


def generate(*, nodes: int = 64, days: float = 30.0, seed: int = 0,
             events: int | None = None, job_nodes: int = 4) -> Iterator[str]:  # fmt: skip
    """Event lines in time order: `days` of fleet life, or until `events` lines."""
    f = _Fleet(nodes=nodes, seed=seed, job_nodes=job_nodes)
    for n in f.names:
        yield _line(T0, "node.state", "controller", node=n, to="HEALTHY", reason="registered",
                    **{"from": None})  # fmt: skip
    emitted, now, r = len(f.names), T0, f.rng
    fault_p = nodes / (14 * 86400 / TICK_S)  # each node fails about every two weeks
    # The stream ends when `days` pass, or, if `events` is given, once that many are out.
    while (events is None and now < T0 + days * 86400) or (events is not None and emitted < events):
        now += TICK_S
        if r.random() < fault_p:
            f.fault(now)
        if r.random() < fault_p / 4:
            f.maintenance(now)
        if len(f.jobs) * job_nodes < nodes * 0.7:
            f.job(now)
        if events is not None and r.random() < 0.5:
            # Filler that the report must read and skip quickly (the bulk of a real log).
            n = r.choice(f.names)
            job = next(iter(f.jobs), None)
            yield _line(now, "straggler", "training", node=n, job=job, rank=r.randrange(64),
                        ratio=round(r.uniform(1.1, 1.6), 2), windows=3)  # fmt: skip
            emitted += 1
        while f.queue and f.queue[0][0] <= now:
            _, _, line = heapq.heappop(f.queue)
            if '"kind":"_free"' in line:
                f.busy.discard(json.loads(line)["node"])
                continue
            if '"kind":"_jobdone"' in line:
                f.working.difference_update(f.jobs.pop(json.loads(line)["job"], ()))
                continue
            yield line
            emitted += 1
            if events is not None and emitted >= events:
                return


def write(path: Path, **kw: object) -> int:
    """Write `generate(**kw)` to `path`; returns the number of lines."""
    n = 0
    with path.open("w", encoding="utf-8") as out:
        for line in generate(**kw):  # type: ignore[arg-type]
            out.write(line + "\n")
            n += 1
    return n
