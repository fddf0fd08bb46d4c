"""Fixtures the balancer's unit tests share: a fake clock, balancers built on it (closed
after the test), and a placer's world of two devices on its own fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.unit.balancer_fakes import BalancerFactory, FakeTime
from tests.unit.placer_fakes import World


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
async def make_balancer(fake_time: FakeTime) -> AsyncIterator[BalancerFactory]:
    factory = BalancerFactory(fake_time)
    yield factory
    await factory.close()


@pytest.fixture
async def world() -> AsyncIterator[World]:
    made = World(FakeTime())
    yield made
    await made.close()
