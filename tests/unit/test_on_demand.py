"""Where a model with no replica is loaded on demand: the fewest evictions, then the fastest
device; the least recently used evicted first; nowhere when it fits nowhere."""

from __future__ import annotations

from evenflow.balancer.capacity import DeviceCost
from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile
from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.on_demand import Evictable, on_demand_moves, overflow_replica

GIB = 2**30
DEVICES = [DeviceInfo("fast", 16 * GIB), DeviceInfo("slow", 16 * GIB)]


def profile(memory_gib: float, speeds: dict[str, float]) -> ModelProfile:
    return ModelProfile("cold", int(memory_gib * GIB),
                        {d: DeviceCost(0.01, 0.001, s) for d, s in speeds.items()}, 16, 0.05)


BOTH = {"fast": 1.0, "slow": 0.5}


def test_the_fastest_device_with_room_wins() -> None:
    moves = on_demand_moves(profile(4, BOTH), DEVICES, {"fast": 8 * GIB, "slow": 8 * GIB}, {})
    assert moves == [Move("add", "cold", "fast")]


def test_a_device_with_room_beats_a_faster_one_that_must_evict() -> None:
    evictable = {"fast": [Evictable("idle", 8 * GIB, 1.0)]}
    moves = on_demand_moves(profile(4, BOTH), DEVICES, {"fast": 0, "slow": 8 * GIB}, evictable)
    assert moves == [Move("add", "cold", "slow")]


def test_the_least_recently_used_go_first_and_no_more_than_needed() -> None:
    evictable = {"fast": [Evictable("newer", 4 * GIB, 9.0), Evictable("older", 4 * GIB, 2.0),
                          Evictable("oldest", 2 * GIB, 1.0)]}
    moves = on_demand_moves(profile(6, {"fast": 1.0}), DEVICES, {"fast": 0, "slow": 0},
                            evictable)
    assert moves == [Move("drop", "oldest", "fast"), Move("drop", "older", "fast"),
                     Move("add", "cold", "fast")]


def test_small_old_replicas_are_spared_where_the_large_one_taken_after_them_makes_room(
) -> None:
    # Oldest first takes 1 + 1 + 10 GiB for a 10 GiB model; the 10 GiB one alone makes room,
    # and each needless eviction is a reload later.
    evictable = {"fast": [Evictable("large", 10 * GIB, 3.0), Evictable("small", GIB, 2.0),
                          Evictable("tiny", GIB, 1.0)]}
    moves = on_demand_moves(profile(10, {"fast": 1.0}), DEVICES, {"fast": 0, "slow": 0},
                            evictable)
    assert moves == [Move("drop", "large", "fast"), Move("add", "cold", "fast")]
    # With half a GiB free, the large one and the least recently used small one are
    # needed: the newer small one is spared.
    moves = on_demand_moves(profile(11.5, {"fast": 1.0}), DEVICES, {"fast": GIB // 2,
                                                                     "slow": 0}, evictable)
    assert moves == [Move("drop", "tiny", "fast"), Move("drop", "large", "fast"),
                     Move("add", "cold", "fast")]


def test_nowhere_when_it_fits_nowhere_even_after_evicting() -> None:
    evictable = {"fast": [Evictable("idle", 2 * GIB, 1.0)]}
    assert on_demand_moves(profile(6, BOTH), DEVICES, {"fast": 2 * GIB, "slow": 4 * GIB},
                           evictable) is None


def test_a_device_the_model_may_not_use_is_never_chosen() -> None:
    moves = on_demand_moves(profile(4, {"slow": 0.5}), DEVICES,
                            {"fast": 16 * GIB, "slow": 8 * GIB}, {})
    assert moves == [Move("add", "cold", "slow")]


def test_an_overflow_replica_is_one_without_rate_beside_one_with() -> None:
    # At speed 0.1 one sample takes 110 ms, over the 50 ms SLO: no rate there.
    model = profile(4, {"fast": 1.0, "crawl": 0.1})
    assert overflow_replica(model, "crawl", serving=["fast", "crawl"])
    assert not overflow_replica(model, "crawl", serving=["crawl"])  # the only one: kept
    assert not overflow_replica(model, "fast", serving=["fast", "crawl"])
