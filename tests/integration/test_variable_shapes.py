"""Requests of different non-batch shapes: never in one batch (or padded to a shared bucket and
cut back), every answer right."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from evenflow.balancer import BalancerConfig
from evenflow.client import AsyncClient, InvalidInputError
from tests.integration.inprocess import running_app

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("factory", ["cumsum", "cumsum_padded"])
async def test_concurrent_requests_of_many_lengths_get_their_own_answers(factory: str) -> None:
    rng = np.random.default_rng(0)
    lengths = [3, 5, 3, 7, 5, *rng.integers(1, 32, 60).tolist()]
    xs = [rng.standard_normal((int(rng.integers(1, 3)), n)).astype(np.float32) for n in lengths]
    balancer = BalancerConfig(max_wait_s=0.005, max_queue_delay_s=float("inf"))
    # A sim device runs the model, then takes its simulated batch time (10 ms + 2 ms a sample):
    # slow enough that concurrent requests of different lengths meet in one queue.
    async with running_app((("m", f"tests.fixture_models:{factory}"),), devices="sim:1",
                           balancer=balancer) as (app, url), AsyncClient(url) as client:
        ys = await asyncio.gather(*(client.infer("m", {"x": x}) for x in xs))
        counters = app.models.get("m").balancer.counters
        batches, requests = counters.execution_count, len(xs)
    for x, y in zip(xs, ys, strict=True):
        assert y["y"].shape == x.shape
        np.testing.assert_allclose(y["y"], np.cumsum(x, axis=1), rtol=1e-5, atol=1e-5)
    assert batches < requests  # some requests did share a batch


async def test_a_length_past_the_largest_bucket_is_refused() -> None:
    async with running_app((("m", "tests.fixture_models:cumsum_padded"),)) as (_, url), \
            AsyncClient(url) as client:
        with pytest.raises(InvalidInputError, match="longer than the model's largest padding"):
            await client.infer("m", {"x": np.ones((1, 33), np.float32)})
        y = await client.infer("m", {"x": np.ones((1, 32), np.float32)})
        np.testing.assert_array_equal(y["y"], np.arange(1, 33, dtype=np.float32)[None])
