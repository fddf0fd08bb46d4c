"""evenflow's own services over gRPC: the stats RPC and the admin RPC (with its bad inputs)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from evenflow.balancer import BalancerConfig, Policy
from evenflow.client import AsyncClient
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc
from evenflow.server.models.spec import SimProfile
from tests.integration.inprocess import running_app

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("server_mode")]
FAST = SimProfile(base_ms=1.0, per_sample_ms=0.1)


async def test_admin_sets_a_sim_device_speed_and_refuses_bad_requests() -> None:
    async with running_app((("sim", "sim"),), devices="sim:1,sim:0.5", sim_profile=FAST,
                           admin=True) as (app, url), grpc.aio.insecure_channel(url) as channel:
        admin = ef_grpc.EvenflowAdminStub(channel)
        reply = await admin.SetDeviceSpeed(ef.SetDeviceSpeedRequest(device="sim1", speed=2))
        assert reply.previous_speed == 0.5
        # Each device kept its own speed (asked through the same seam, whatever the host).
        replicas = app.models.get("sim").balancer.replicas  # type: ignore[union-attr]
        assert [await r.worker.set_device_speed(device, speed) for r, device, speed in
                zip(replicas, ("sim0", "sim1"), (1.0, 2.0), strict=True)] == [1.0, 2.0]
        for request, code in (
                (ef.SetDeviceSpeedRequest(device="sim9", speed=1), grpc.StatusCode.NOT_FOUND),
                (ef.SetDeviceSpeedRequest(device="sim0", speed=0),
                 grpc.StatusCode.INVALID_ARGUMENT)):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await admin.SetDeviceSpeed(request)
            assert info.value.code() == code


async def test_admin_is_off_unless_asked_for() -> None:
    async with running_app((("sim", "sim"),), devices="sim:1", sim_profile=FAST) as (_, url), \
            grpc.aio.insecure_channel(url) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await ef_grpc.EvenflowAdminStub(channel).SetDeviceSpeed(
                ef.SetDeviceSpeedRequest(device="sim0", speed=2))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_stats_report_each_replica_and_refuse_unknown_models() -> None:
    config = BalancerConfig(policy=Policy.LEAST_WORK, max_wait_s=0.0)
    async with running_app((("sim", "sim"),), devices="sim:1,sim:1", sim_profile=FAST,
                           balancer=config) as (_, url), AsyncClient(url) as client:
        x = np.ones((2, 256), np.float32)
        for _ in range(20):
            await client.infer("sim", {"x": x})
        async with grpc.aio.insecure_channel(url) as channel:
            stats = ef_grpc.EvenflowStatsStub(channel)
            response = await stats.GetStats(ef.GetStatsRequest())
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stats.GetStats(ef.GetStatsRequest(model_name="nope"))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
    (model,) = response.models
    assert model.policy == "least-work" and model.batch_policy == "adaptive"
    assert [list(r.devices) for r in model.replicas] == [["sim0"], ["sim1"]]
    assert sum(r.num_samples for r in model.replicas) == 40
    assert all(r.fit_base_s > 0 and r.fit_per_sample_s > 0 for r in model.replicas)
    assert sum(sum(r.batch_size_counts.values()) for r in model.replicas) == sum(
        r.num_batches for r in model.replicas)
    assert response.uptime_s > 0
    assert not response.devices  # no GPU, no NVML telemetry
