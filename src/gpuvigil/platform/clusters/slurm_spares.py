"""The Slurm adapter's hot spares (`clusters.base.Sparing`; `platform.spares` decides):
the spare nodes are the nodes of one reservation the controller keeps
(`controller.slurm.spare_reservation`, Flags=FLEX, for `spare_users`), so ordinary jobs
never start there and gang jobs submitted with `--reservation=<it>` may use the spares as
well as any other node (FLEX). Called through `SlurmCluster`.

- read: `scontrol show reservation` once per list (a spare is a node of ours);
- make: only a node with no running job (`squeue`, just before); the reservation is
  created with its first node and updated with each next one;
- unmake: the node leaves the reservation; the last one ends it (`EndTime=now`: Slurm
  keeps no reservation of 0 nodes and refuses to delete one a job runs in; the ended one
  lingers INACTIVE while that job runs, and is renewed for the next spare).

Measured on Slurm 22.05.8 (docs/slurm.md "Hot spares"): a plain `--requeue` of a gang job
gives its surviving nodes back to the queue. So a gang job (2+ nodes) requeued off a
drained node keeps its place while the reservation holds an idle spare (`keep_place`, at
the drain; `follow`, on each later controller pass):

- before the requeue: the job's AdminComment names its survivors (`MOVE`; the one piece
  of state between passes, in Slurm, so a restarted controller carries on), then the
  survivors join the reservation (`Flags=IGNORE_JOBS`: they still run the job);
- once the job is PENDING (seconds later; COMPLETING first):
  `scontrol update JobId=J ReservationName=R StartTime=now` ends the requeue's BeginTime
  hold, and the job starts on its survivors plus a spare (the backfill scheduler);
- once it runs (or has ended): the survivors leave the reservation, its IGNORE_JOBS flag is
  taken off again when no other move holds nodes in it (`Flags-=IGNORE_JOBS`: Slurm keeps
  a flag across node updates and ends, and a renewal is an update; with it Slurm would
  take a busy node into the reservation, without it Slurm refuses one, behind `make`'s
  idle check), and the AdminComment is cleared last (so a pass that fails midway is
  redone by the next). The spare it runs on is a used spare (`platform.spares` gives it
  back).

Fail closed: any failed step before the requeue leaves a plain requeue (logged why); a
failed move of the pending job gives the survivors back at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpuvigil.io.slurm_conf import expand_hostlist
from gpuvigil.platform.clusters.base import ClusterError, Fenced, Forbidden, Unavailable

if TYPE_CHECKING:
    from gpuvigil.platform.clusters.slurm import SlurmCluster

log = logging.getLogger(__name__)

MOVE = "gpuvigil:spare-move:"  # AdminComment of a gang job being moved onto the spares
WAIT = {"COMPLETING", "CONFIGURING", "REQUEUED"}  # states the next pass looks at again


def moved_survivors(admin_comment: Any) -> list[str] | None:
    """The survivors named by a job's AdminComment when it is ours (`MOVE`), else None
    (pure; never raises)."""
    text = str(admin_comment or "")
    if not text.startswith(MOVE):
        return None
    return [n for n in text[len(MOVE) :].split(",") if n.strip()]


def held_nodes(jobs: list[dict[str, Any]]) -> set[str]:
    """Reservation nodes held for a moving gang job (`squeue --json` jobs): not spares."""
    return {n for j in jobs for n in moved_survivors(j.get("admin_comment")) or ()}


def _state(job: dict[str, Any]) -> str:
    return str(job.get("job_state") or "").upper()


def _block(text: str, name: str) -> list[str] | None:
    """The tokens of reservation `name` in `scontrol show reservation` output, or None."""
    for block in text.split("ReservationName=")[1:]:
        head, _, rest = block.partition(" ")
        if head.strip() == name:
            return rest.split()
    return None


def reservation_flags(text: str, name: str) -> set[str]:
    """The Flags of reservation `name` (ended or not; empty when there is none) in
    `scontrol show reservation` output (pure; never raises)."""
    for tok in _block(text, name) or ():
        if tok.startswith("Flags="):
            return {f for f in tok.split("=", 1)[1].split(",") if f and f != "(null)"}
    return set()


def reservation_nodes(text: str, name: str) -> list[str] | None:
    """The nodes of reservation `name` in `scontrol show reservation` output; None when
    there is no such reservation, or it has ended (State=INACTIVE: it lingers while a job
    that ran in it runs) (pure; never raises)."""
    toks = _block(text, name)
    if toks is None or "State=INACTIVE" in toks:
        return None
    for tok in toks:
        if tok.startswith("Nodes="):
            return expand_hostlist(tok.split("=", 1)[1])
    return []


class SlurmSpares:
    def __init__(self, cluster: SlurmCluster) -> None:
        self.c = cluster
        self.name = cluster.settings.spare_reservation

    def nodes(self) -> list[str] | None:
        return reservation_nodes(self._show(), self.name)

    def _show(self) -> str:
        return self.c._run("scontrol", "show", "reservation")

    def _set(self, have: list[str] | None, want: list[str]) -> None:
        if want == (have or []):
            return
        res = f"ReservationName={self.name}"
        if not want:  # end it, not delete it: Slurm refuses to delete one a job runs in
            try:
                self.c._run("scontrol", "update", res, "EndTime=now")
            except Unavailable as e:
                # 22.05.8 answers "Invalid time specified" to EndTime=now once the
                # reservation's nodes were updated (measured), yet takes now+1 (seconds)
                if "Invalid time specified" not in str(e):
                    raise
                self.c._run("scontrol", "update", res, "EndTime=now+1")
        elif have is None:
            users = self.c.settings.spare_users
            if not users:  # Slurm refuses a reservation for nobody: say which setting
                raise Forbidden("controller.slurm.spare_users is empty: name the users "
                                "whose gang jobs may use the spare reservation")  # fmt: skip
            spec = (
                f"Nodes={','.join(want)}",
                "StartTime=now",
                "Duration=infinite",
                f"Users={','.join(users)}",
            )
            try:
                self.c._run("scontrol", "create", "reservation", res, *spec, "Flags=FLEX")
            except Unavailable as e:  # an ended one lingers while its jobs run: renew it
                if "Duplicate reservation name" not in str(e):
                    raise
                # (its start cannot move: Slurm refuses "Reservation already started")
                self.c._run("scontrol", "update", res, spec[0], "Duration=infinite")
        else:
            self.c._run("scontrol", "update", res, f"Nodes={','.join(want)}")

    def make(self, name: str) -> bool:
        if self.c._jobs(name):  # only an idle node: a reservation moves no running job
            return False
        have = self.nodes()
        if name not in (have or []):
            self._set(have, sorted({*(have or []), name}))
        return True

    def unmake(self, name: str) -> None:
        have = self.nodes()
        if have is not None and name in have:
            self._set(have, [n for n in have if n != name])

    # -- a requeued gang job keeps its place (module docstring) ---------------------------
    def keep_place(self, job: dict[str, Any], failed: str, jobs: list[dict[str, Any]]) -> bool:
        """Before `job` (a `squeue --json` job on `failed`) is requeued: when it is a gang
        job and the reservation has an idle spare, name its survivors in its AdminComment
        and put them into the reservation. False (and a plain requeue) when not, or when a
        write fails; Fenced propagates. `jobs`: every job (squeue), for the idle check."""
        jid = str(job.get("job_id"))
        nodes = expand_hostlist(str(job.get("nodes") or ""))
        survivors = [n for n in nodes if n != failed]
        if not self.name or len(nodes) < 2 or not survivors:
            return False
        if str(job.get("admin_comment") or ""):  # someone's note, or already ours
            log.info("job %s: AdminComment set: a plain requeue", jid)
            return False
        try:
            have = self.nodes()
            busy = {n for j in jobs if _state(j) in ("RUNNING", *WAIT)
                    for n in expand_hostlist(str(j.get("nodes") or ""))}  # fmt: skip
            idle = [n for n in have or () if n not in busy | held_nodes(jobs) | set(nodes)]
            if not idle:
                log.info("job %s: no idle spare in reservation %s: a plain requeue", jid,
                         self.name)  # fmt: skip
                return False
            self.c._run("scontrol", "update", f"JobId={jid}",
                        f"AdminComment={MOVE}{','.join(survivors)}")  # fmt: skip
        except Fenced:
            raise
        except ClusterError as e:
            log.warning("job %s: cannot keep its place on the spares (%s): a plain requeue",
                        jid, e)  # fmt: skip
            return False
        try:
            want = sorted({*(have or ()), *survivors})
            self.c._run("scontrol", "update", f"ReservationName={self.name}",
                        f"Nodes={','.join(want)}", "Flags=IGNORE_JOBS")  # fmt: skip
        except ClusterError as e:
            self._forget(jid)
            if isinstance(e, Fenced):
                raise
            log.warning("job %s: survivors %s not added to reservation %s (%s): a plain "
                        "requeue", jid, survivors, self.name, e)  # fmt: skip
            return False
        log.info("job %s: survivors %s kept in reservation %s for the requeue (idle spares "
                 "%s)", jid, survivors, self.name, idle)  # fmt: skip
        return True

    def follow(self, jobs: list[dict[str, Any]]) -> list[str]:
        """One controller pass over the moving gang jobs (`jobs`: every job, squeue):
        point a PENDING one at the reservation; once it runs (or ended) give its survivors
        back. Returns what it did, for the log. Fenced propagates; other errors are
        logged and the move given up (the job stays a plain requeued one)."""
        done: list[str] = []
        held = held_nodes(jobs)  # IGNORE_JOBS stays on while any of them is in a move
        for job in jobs:
            survivors = moved_survivors(job.get("admin_comment"))
            if survivors is None:
                continue
            jid, state = str(job.get("job_id")), _state(job)
            if state in WAIT:
                continue  # the requeue's COMPLETING: its hold starts once PENDING
            try:
                if state == "PENDING":
                    if str(job.get("resv_name") or "") != self.name:
                        self.c._run("scontrol", "update", f"JobId={jid}",
                                    f"ReservationName={self.name}", "StartTime=now")  # fmt: skip
                        done.append(f"job {jid} sent to reservation {self.name}")
                    continue
                self._release(jid, survivors, live=state == "RUNNING",
                              others=held - set(survivors))  # fmt: skip
                held -= set(survivors)
                done.append(f"job {jid} {state.lower()}: survivors {survivors} released")
            except Fenced:
                raise
            except ClusterError as e:
                log.warning("job %s: moving it to the spares failed (%s): survivors %s "
                            "given back, a plain requeue", jid, e, survivors)  # fmt: skip
                try:
                    self._release(jid, survivors, live=True, others=held - set(survivors))
                    held -= set(survivors)
                except Fenced:
                    raise
                except ClusterError as e2:  # the next pass sees the AdminComment again
                    log.warning("job %s: giving its survivors back failed too (%s)", jid, e2)
                done.append(f"job {jid}: move failed: {e}")
        return done

    def _release(self, jid: str, survivors: list[str], *, live: bool, others: set[str]) -> None:
        """Survivors out of the reservation; IGNORE_JOBS off unless `others` (nodes another
        move still holds) need it; the job's AdminComment cleared, last."""
        text = self._show()
        have = reservation_nodes(text, self.name)
        if have is not None:
            self._set(have, [n for n in have if n not in survivors])
        if "IGNORE_JOBS" in reservation_flags(text, self.name) and not others:
            # also on an ended one: a renewal would carry the flag on
            self.c._run("scontrol", "update", f"ReservationName={self.name}",
                        "Flags-=IGNORE_JOBS")  # fmt: skip
        if live:
            self._forget(jid)
        else:  # an ended job's comment may not be writable: its nodes are out already
            try:
                self._forget(jid)
            except Fenced:
                raise
            except ClusterError:
                pass

    def _forget(self, jid: str) -> None:
        self.c._run("scontrol", "update", f"JobId={jid}", "AdminComment=")
