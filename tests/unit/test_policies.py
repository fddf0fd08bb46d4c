import dataclasses
import math
import random

import pytest

from evenflow.balancer.policies import (
    ReplicaLoad,
    choose_least_work,
    choose_pow2,
    plan_steal,
)


def load(*, queued_samples: int = 0, queued_requests: int | None = None, base_s: float = 0.01,
         per_sample_s: float = 0.002, batch_size: int = 8, running_remaining_s: float = 0.0,
         running_requests: int = 0, arrival_rate_per_s: float = 0.0, cold: bool = False,
         shape_groups: int = 1, stale: bool = False, spread_s: float = 0.0) -> ReplicaLoad:
    return ReplicaLoad(running_remaining_s=running_remaining_s,
                       running_requests=running_requests, queued_samples=queued_samples,
                       queued_requests=queued_samples if queued_requests is None
                       else queued_requests, base_s=base_s, per_sample_s=per_sample_s,
                       batch_size=batch_size, arrival_rate_per_s=arrival_rate_per_s, cold=cold,
                       shape_groups=shape_groups, stale=stale, spread_s=spread_s)


def test_work_prices_queue_in_batches() -> None:
    replica = load(queued_samples=10, batch_size=4, running_remaining_s=0.005)
    # 10 + 2 samples = 3 batches of 4: 0.005 + 3 * 0.01 + 12 * 0.002
    assert abs(replica.work_s(2) - (0.005 + 0.03 + 0.024)) < 1e-12


def test_least_work_routes_by_work_not_by_count() -> None:
    # Replica 0 holds fewer requests but they are big; replica 1 holds many tiny ones.
    heavy = load(queued_samples=48, queued_requests=2)
    light = load(queued_samples=6, queued_requests=6)
    assert choose_least_work([heavy, light], 1, random.Random(0)) == 1


def test_least_work_prefers_fast_device_even_with_a_queue() -> None:
    fast = load(queued_samples=4, base_s=0.0025, per_sample_s=0.0005)
    slow = load(queued_samples=0, base_s=0.04, per_sample_s=0.008)
    assert choose_least_work([slow, fast], 1, random.Random(0)) == 1


def test_least_work_breaks_ties_at_random() -> None:
    replicas = [load(), load(), load()]
    rng = random.Random(1)
    chosen = {choose_least_work(replicas, 1, rng) for _ in range(60)}
    assert chosen == {0, 1, 2}


def test_least_work_prefers_a_replica_that_answers_in_time_over_a_sooner_but_spread_one() -> None:
    # A shared device's replica: predicted 35 ms, but its answers have come up to 20 ms later
    # than predicted. An overflow replica alone on a slow device: 48 ms, exactly.
    shared = load(running_remaining_s=0.023, spread_s=0.020)
    overflow = load(base_s=0.040, per_sample_s=0.008, batch_size=1)
    assert shared.work_s(1) < overflow.work_s(1)
    rng = random.Random(0)
    assert choose_least_work([shared, overflow], 1, rng, within_s=0.050) == 1
    # Without a due time, or with none of them safe, the soonest, as before.
    assert choose_least_work([shared, overflow], 1, rng) == 0
    assert choose_least_work([shared, overflow], 1, rng, within_s=0.040) == 0
    # Where the soonest is safe too, it is the choice.
    assert choose_least_work([load(spread_s=0.020), overflow], 1, rng, within_s=0.050) == 0
    # A stale replica gets its probe whatever its old spread: the probe is how it learns.
    stale = load(stale=True, spread_s=0.100)
    assert choose_least_work([overflow, stale], 1, rng, within_s=0.050) == 1


def test_pow2_takes_the_shorter_of_two() -> None:
    replicas = [load(queued_requests=5, queued_samples=5), load(queued_requests=1,
                                                                queued_samples=1)]
    assert all(choose_pow2(replicas, random.Random(seed)) == 1 for seed in range(10))


def test_steal_moves_tail_work_that_finishes_sooner_on_the_thief() -> None:
    thief = load(batch_size=4)
    victim = load(queued_samples=12, running_remaining_s=0.02, batch_size=4)
    assert plan_steal(thief, victim, [(1, math.inf)] * 12) == 4  # a batch's worth, no more


def test_steal_leaves_work_in_time_where_it_is_when_the_thief_would_answer_it_late() -> None:
    # The victim answers its tail within 38 ms, on time; the idle thief would in 12 ms but its
    # answers have come 40 ms late. Due in 50 ms, the work stays; due in 100 ms, it moves.
    victim = load(queued_samples=4, running_remaining_s=0.020, batch_size=4)
    thief = load(batch_size=4, spread_s=0.040)
    assert plan_steal(thief, victim, [(1, 0.050)] * 4) == 0
    assert plan_steal(thief, victim, [(1, 0.100)] * 4) == 4
    # Where the victim would answer late too, the sooner place wins, as without due times.
    late_victim = dataclasses.replace(victim, spread_s=0.040)
    assert plan_steal(thief, late_victim, [(1, 0.050)] * 4) == 4


def test_steal_tops_up_a_starting_batch_only_to_its_room() -> None:
    thief = load(queued_samples=1, batch_size=4)  # about to start a batch of 1 of a possible 4
    victim = load(queued_samples=12, running_remaining_s=0.02, batch_size=4)
    assert plan_steal(thief, victim, [(1, math.inf)] * 12) == 3
    # a job larger than the room stays put
    assert plan_steal(thief, victim, [(4, math.inf), (1, math.inf)]) == 0
    full = load(queued_samples=4, batch_size=4)
    assert plan_steal(full, victim, [(1, math.inf)] * 12) == 0


def test_steal_leaves_work_that_is_faster_where_it_is() -> None:
    slow_thief = load(base_s=0.5, per_sample_s=0.1, batch_size=4)
    victim = load(queued_samples=2, batch_size=4)
    assert plan_steal(slow_thief, victim, [(1, math.inf)] * 2) == 0


def test_busy_replica_is_priced_with_the_arrivals_that_will_join_its_next_batch() -> None:
    quiet = load(queued_samples=1, running_remaining_s=0.02, batch_size=8)
    busy = load(queued_samples=1, running_remaining_s=0.02, batch_size=8,
                arrival_rate_per_s=200.0)
    # 20 ms until the next batch starts at 200 samples/s: 4 more samples join it.
    assert busy.work_s(1) - quiet.work_s(1) == pytest.approx(4 * 0.002)
    assert busy.work_s() == quiet.work_s()  # the queue alone is priced as it is


def test_a_cold_replica_gets_one_probe_before_it_is_trusted() -> None:
    warm = load(queued_samples=20)
    cold_idle = load(base_s=0.002, per_sample_s=0.0002, cold=True)
    cold_busy = load(running_requests=1, base_s=0.002, per_sample_s=0.0002, cold=True)
    rng = random.Random(0)
    assert choose_least_work([warm, cold_idle], 1, rng) == 1  # the probe
    assert choose_least_work([warm, cold_busy], 1, rng) == 0  # wait for its first result


def test_a_queue_serves_urgent_levels_first_and_gives_up_its_least_urgent_tail() -> None:
    import asyncio

    from evenflow.balancer.job import Job
    from evenflow.balancer.queue import JobQueue

    loop = asyncio.new_event_loop()
    try:
        queue = JobQueue(levels=2)
        jobs = {name: Job(name, size, arrival_s, math.inf, loop.create_future(), level)
                for name, size, arrival_s, level in [("a", 1, 1.0, 1), ("b", 2, 2.0, 0),
                                                     ("c", 3, 3.0, 1), ("d", 4, 4.0, 0)]}
        for job in jobs.values():
            queue.push(job)
        assert (len(queue), queue.num_samples, queue.oldest_arrival_s) == (4, 10, 1.0)
        # the least urgent level's newest first
        assert list(queue.tail()) == [(3, math.inf), (1, math.inf), (4, math.inf), (2, math.inf)]
        assert queue.pop_tail() is jobs["c"]
        assert queue.take(7, now_s=5.0) == [jobs["b"], jobs["d"], jobs["a"]]
        assert (len(queue), queue.num_samples) == (0, 0)
    finally:
        loop.close()


def test_a_batch_takes_only_jobs_of_the_first_ones_shape() -> None:
    import asyncio

    from evenflow.balancer.job import Job
    from evenflow.balancer.queue import JobQueue

    loop = asyncio.new_event_loop()
    try:
        queue = JobQueue()
        jobs = [Job(name, 1, 1.0, math.inf, loop.create_future(), shape_key=key)
                for name, key in [("a", (3,)), ("b", (5,)), ("c", (3,)), ("d", (5,))]]
        for job in jobs:
            queue.push(job)
        assert queue.num_shape_groups == 2
        assert [j.payload for j in queue.take(8, now_s=2.0)] == ["a", "c"]
        assert queue.num_shape_groups == 1
        assert [j.payload for j in queue.take(8, now_s=2.0)] == ["b", "d"]
        assert (len(queue), queue.num_samples, queue.num_shape_groups) == (0, 0, 0)
    finally:
        loop.close()


def test_distinct_shapes_are_priced_as_separate_batches() -> None:
    one_shape = load(queued_samples=4, base_s=0.010, per_sample_s=0.001)
    four_shapes = load(queued_samples=4, base_s=0.010, per_sample_s=0.001, shape_groups=4)
    assert four_shapes.work_s() == pytest.approx(one_shape.work_s() + 3 * 0.010)


def test_an_idle_replica_on_a_stale_estimate_gets_a_probe() -> None:
    fast = load(base_s=0.005, per_sample_s=0.001)
    was_slow = load(base_s=0.050, per_sample_s=0.010, stale=True)
    assert choose_least_work([fast, was_slow], 1, random.Random(0)) == 1
    fresh_slow = load(base_s=0.050, per_sample_s=0.010)
    assert choose_least_work([fast, fresh_slow], 1, random.Random(0)) == 0


def test_a_queue_orders_by_due_time_and_moved_work_goes_behind() -> None:
    import asyncio

    from evenflow.balancer.job import Job
    from evenflow.balancer.queue import JobQueue

    loop = asyncio.new_event_loop()
    try:
        queue = JobQueue()

        def job(name: str, due_s: float) -> Job:
            return Job(name, 1, 0.0, math.inf, loop.create_future(), due_s=due_s)

        late, early, tight = job("late", 2.0), job("early", 1.0), job("tight", 0.5)
        for each in (late, early, tight):
            queue.push(each)
        assert queue.take(3, now_s=0.0) == [tight, early, late]  # earliest due first
        mine, moved, later = job("mine", 2.0), job("moved", 0.5), job("later", 1.5)
        queue.push(mine)
        queue.push_behind(moved)  # stolen or rebound work: priced at the end, stays there
        # still due when it was: stealing and late binding read the time its caller waits for
        assert list(queue.tail()) == [(1, 0.5), (1, 2.0)]
        queue.push(later)  # ordered among this queue's own jobs, ahead of the moved one
        assert queue.take(3, now_s=0.0) == [later, mine, moved]
    finally:
        loop.close()
