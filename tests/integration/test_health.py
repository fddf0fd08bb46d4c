"""Health follows the replicas: NOT_SERVING while a model has no replica in service, SERVING
again once its worker is back."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from evenflow.balancer import BalancerConfig, WorkerLost
from evenflow.client import AsyncClient, ServerUnavailableError
from tests.integration.inprocess import running_app

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("server_mode")]
SERVING, NOT_SERVING = (health_pb2.HealthCheckResponse.SERVING,
                        health_pb2.HealthCheckResponse.NOT_SERVING)


async def test_health_is_not_serving_only_while_no_replica_is_in_service() -> None:
    config = BalancerConfig(max_wait_s=0.0, max_queue_delay_s=float("inf"))
    async with running_app((("sim", "sim"),), devices="sim:1", balancer=config) as (app, url), \
            AsyncClient(url, retries=0) as client:
        worker = app.models.get("sim").balancer.replicas[0].worker
        restart = worker.restart
        device_back = asyncio.Event()

        async def restart_when_allowed() -> None:  # the device stays gone until the test says
            if not device_back.is_set():
                raise WorkerLost("the device is gone")
            await restart()

        worker.restart = restart_when_allowed  # type: ignore[method-assign]
        async with grpc.aio.insecure_channel(url) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == SERVING
            await worker.set_device_fault("sim0", "die", 1)
            with pytest.raises(ServerUnavailableError):
                await client.infer("sim", {"x": np.ones((1, 256), np.float32)})
            assert (await watch.read()).status == NOT_SERVING
            device_back.set()
            assert (await asyncio.wait_for(watch.read(), 30)).status == SERVING
            watch.cancel()
        y = await client.infer("sim", {"x": np.ones((1, 256), np.float32)})
        assert y["y"].shape == (1, 256)
