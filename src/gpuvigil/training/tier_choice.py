"""Which rank holds whose in-memory copy, and which step the memory tier can resume from.

Torch-free, so the simulator decides a loss's cost with the same rule `memtier` restores
with. The peer that holds rank r's copy sits one *node* away, not one rank: with torchrun's
`--nproc-per-node` ranks per node placed node by node, rank r + 1 shares r's node (7 times
in 8 on an 8-GPU node), and losing that machine would lose both copies.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def peer_offset(world_size: int, local_world_size: int) -> int:
    """How many ranks away a rank's peer copy lives: one node's worth of ranks, or 1 when
    the job has one node (its copy then only outlives its own process, not the node)."""
    if world_size <= 1:
        return 0
    if 0 < local_world_size < world_size:
        return local_world_size
    return 1


def peer_of(rank: int, world_size: int, offset: int) -> int:
    """The rank that holds `rank`'s copy."""
    return (rank + offset) % world_size if world_size else rank


def ward_of(rank: int, world_size: int, offset: int) -> int:
    """The rank whose copy `rank` holds."""
    return (rank - offset) % world_size if world_size else rank


def reachable(
    own: Sequence[Collection[int]], held: Sequence[Collection[int]], offset: int
) -> list[set[int]]:
    """Per rank q, the steps of q's state that some live rank holds: q's own copies
    (`own[q]`) and those q's peer keeps for it (`held[peer]`: the copies a rank holds of its
    ward's state)."""
    world = len(own)
    out = []
    for q in range(world):
        have = set(own[q])
        if world > 1 and offset:
            have |= set(held[peer_of(q, world, offset)])
        out.append(have)
    return out


def newest_common(
    own: Sequence[Collection[int]], held: Sequence[Collection[int]], offset: int
) -> int | None:
    """The newest step every rank's state can be restored from, or None: the tier is then
    skipped and the job resumes from the persistent checkpoint."""
    have = reachable(own, held, offset)
    common = set.intersection(*have) if have else set()
    return max(common) if common else None


def survives(lost_ranks: Collection[int], world_size: int, offset: int) -> bool:
    """Whether the newest copy survives losing these ranks' processes *and* their node's
    host memory (a lost machine): `newest_common` over that loss, computed on the lost
    ranks alone (a live rank keeps its own copy), so the simulator can ask it of a
    16,384-rank job hundreds of times. Each lost rank's peer must be alive."""
    lost = set(lost_ranks)
    if not lost:
        return True
    if world_size <= 1 or not offset:
        return False
    return all(peer_of(r, world_size, offset) not in lost for r in lost)
