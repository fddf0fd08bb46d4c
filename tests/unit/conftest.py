"""Fixtures the balancer's unit tests share: a fake clock, and balancers built on it (closed
after the test)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.unit.balancer_fakes import BalancerFactory, FakeTime


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
async def make_balancer(fake_time: FakeTime) -> AsyncIterator[BalancerFactory]:
    factory = BalancerFactory(fake_time)
    yield factory
    await factory.close()
