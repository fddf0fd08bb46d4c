"""The ``sim`` model spends exactly its profile's cost, scaled by the calling thread's device
speed, and nothing at all when the profile is free (the free model of the overhead benchmarks)."""

from __future__ import annotations

import pytest
import torch

from evenflow.server.models.sim import SleepIdentity, set_thread_speed
from evenflow.server.models.spec import SimProfile

pytestmark = pytest.mark.timeout(10)


class RecordingSleep:
    def __init__(self) -> None:
        self.calls_s: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls_s.append(seconds)


def test_a_free_profile_never_sleeps() -> None:
    sleep = RecordingSleep()
    module = SleepIdentity(SimProfile(0.0, 0.0), sleep=sleep)
    x = torch.arange(6.0).reshape(3, 2)
    out = module(x)
    assert sleep.calls_s == []
    assert torch.equal(out, x)
    assert out.data_ptr() != x.data_ptr()  # a fresh tensor, as a real model returns


def test_the_cost_is_the_profile_over_the_device_speed() -> None:
    sleep = RecordingSleep()
    module = SleepIdentity(SimProfile(10.0, 2.0), sleep=sleep)
    set_thread_speed(0.5)
    try:
        module(torch.zeros(4, 2))
    finally:
        set_thread_speed(1.0)
    assert sleep.calls_s == [pytest.approx(2 * (10.0 + 2.0 * 4) / 1000.0)]
