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
gives its surviving nodes back to the queue; the adapter does not yet move a requeued job
to the spares (the recipe is documented there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvigil.io.slurm_conf import expand_hostlist
from gpuvigil.platform.clusters.base import Forbidden, Unavailable

if TYPE_CHECKING:
    from gpuvigil.platform.clusters.slurm import SlurmCluster


def reservation_nodes(text: str, name: str) -> list[str] | None:
    """The nodes of reservation `name` in `scontrol show reservation` output; None when
    there is no such reservation, or it has ended (State=INACTIVE: it lingers while a job
    that ran in it runs) (pure; never raises)."""
    for block in text.split("ReservationName=")[1:]:
        head, _, rest = block.partition(" ")
        if head.strip() != name:
            continue
        toks = rest.split()
        if "State=INACTIVE" in toks:
            return None
        for tok in toks:
            if tok.startswith("Nodes="):
                return expand_hostlist(tok.split("=", 1)[1])
        return []
    return None


class SlurmSpares:
    def __init__(self, cluster: SlurmCluster) -> None:
        self.c = cluster
        self.name = cluster.settings.spare_reservation

    def nodes(self) -> list[str] | None:
        return reservation_nodes(self.c._run("scontrol", "show", "reservation"), self.name)

    def _set(self, have: list[str] | None, want: list[str]) -> None:
        if want == (have or []):
            return
        res = f"ReservationName={self.name}"
        if not want:  # end it, not delete it: Slurm refuses to delete one a job runs in
            self.c._run("scontrol", "update", res, "EndTime=now")
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
