"""The memory tier's placement rule: a rank's peer copy is one node away, so losing one
machine never loses both copies of any rank's state."""

from __future__ import annotations

from gpuvigil.training import tier_choice


def test_the_peer_is_a_node_away_on_eight_gpu_nodes() -> None:
    offset = tier_choice.peer_offset(world_size=32, local_world_size=8)
    assert offset == 8
    for r in range(32):
        assert tier_choice.peer_of(r, 32, offset) // 8 != r // 8
        assert tier_choice.ward_of(tier_choice.peer_of(r, 32, offset), 32, offset) == r


def test_one_node_and_one_rank_jobs() -> None:
    assert tier_choice.peer_offset(world_size=4, local_world_size=4) == 1
    assert tier_choice.peer_offset(world_size=1, local_world_size=1) == 0
    assert tier_choice.newest_common([{3, 5}], [set()], 0) == 5


def test_losing_one_machine_keeps_the_tier_losing_a_neighbour_pair_does_not() -> None:
    offset = tier_choice.peer_offset(world_size=32, local_world_size=8)
    node = lambda i: range(8 * i, 8 * i + 8)  # noqa: E731
    assert tier_choice.survives(node(2), 32, offset)
    assert not tier_choice.survives([*node(1), *node(2)], 32, offset)
    assert tier_choice.survives([*node(0), *node(2)], 32, offset)
    # With the old rule (the next rank), one machine took both copies of 7 of its 8 ranks.
    assert not tier_choice.survives(node(2), 32, 1)


def test_newest_common_takes_a_peer_copy_and_skips_a_step_a_rank_lacks() -> None:
    # rank 1 lost its own copies; its peer (rank 0, offset 1 in a world of 2) holds step 4
    own = [{2, 4}, set()]
    held = [{4}, {2, 4}]
    assert tier_choice.newest_common(own, held, 1) == 4
    held = [{2}, {2, 4}]
    assert tier_choice.newest_common(own, held, 1) == 2
    assert tier_choice.newest_common(own, [set(), set()], 1) is None
    assert tier_choice.reachable(own, [set(), set()], 1) == [{2, 4}, set()]


def test_survives_is_newest_common_over_a_lost_machine() -> None:
    import random

    rng = random.Random(7)
    for _ in range(300):
        per = rng.choice([1, 2, 4, 8])
        nodes = rng.randint(1, 6)
        world = per * nodes
        offset = tier_choice.peer_offset(world, per)
        gone = rng.sample(range(nodes), rng.randint(0, nodes))
        lost = {n * per + r for n in gone for r in range(per)}
        own = [() if q in lost else (1,) for q in range(world)]
        held = [() if q in lost else (1,) for q in range(world)]
        full = tier_choice.newest_common(own, held, offset) == 1
        assert tier_choice.survives(lost, world, offset) == full, (per, nodes, gone)
