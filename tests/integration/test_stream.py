"""ModelStreamInfer: many requests in flight on one stream are batched together and each is
answered under its id; a stream that ends with answers still pending leaves nothing behind."""

from __future__ import annotations

import asyncio
import math

import grpc
import numpy as np
import pytest

from evenflow.balancer import BalancerConfig
from evenflow.client import AsyncClient
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.models.spec import SimProfile
from tests.integration.inprocess import running_app

pytestmark = pytest.mark.timeout(60)


@pytest.mark.usefixtures("server_mode")
async def test_many_requests_in_flight_on_one_stream_share_batches() -> None:
    inputs = [{"x": np.full((1, 256), i, np.float32)} for i in range(200)]
    async with running_app((("sim", "sim"),), devices="sim:1",
                           sim_profile=SimProfile(base_ms=5.0, per_sample_ms=0.0)) as (app, url), \
            AsyncClient(url) as client:
        answers = {r.request_id: r async for r in client.stream_infer("sim", inputs,
                                                                        timeout_s=30)}
        replica = app.models.get("sim").balancer.replicas[0]
        num_batches = replica.stats.num_batches
    assert sorted(answers, key=int) == [str(i) for i in range(200)]
    for request_id, answer in answers.items():
        assert answer.error is None
        assert answer.outputs is not None
        assert (answer.outputs["y"] == int(request_id)).all()
    assert num_batches < 100  # one stream kept many requests in flight, and they were batched


async def test_a_stream_cancelled_with_answers_pending_leaves_nothing_behind() -> None:
    # One request per batch, each 200 ms: when the first answer arrives, the rest are pending.
    config = BalancerConfig(max_batch=1, max_wait_s=0.0, max_queue_delay_s=math.inf)
    request = pb.ModelInferRequest(
        model_name="sim",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 256])],
        raw_input_contents=[np.ones((1, 256), np.float32).tobytes()])
    async with running_app((("sim", "sim"),), devices="sim:1", balancer=config,
                           sim_profile=SimProfile(base_ms=200.0, per_sample_ms=0.0)) as (app,
                                                                                         url):
        balancer = app.models.get("sim").balancer
        async with grpc.aio.insecure_channel(url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            call = stub.ModelStreamInfer(iter([request] * 10))
            first = await call.read()
            assert not first.error_message
            call.cancel()
        await asyncio.wait_for(balancer.replicas[0].wait_quiet(), 10)
        assert balancer.admitted_requests == 0
        assert balancer.replicas[0].stats.num_batches < 10  # the cancelled ones never ran
        async with AsyncClient(url) as client:  # and the server goes on serving
            y = (await client.infer("sim", {"x": np.ones((1, 256), np.float32)}))["y"]
        assert y.shape == (1, 256)
