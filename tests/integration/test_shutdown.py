"""Shutdown without loss: SIGTERM under load answers every request exactly once; a grace that
runs out, or a second SIGTERM, fails what is left with UNAVAILABLE, never with silence."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from evenflow.proto import evenflow_pb2, evenflow_pb2_grpc
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

# slow, timing: SIGTERM to subprocess servers while batches run for set times.
pytestmark = [pytest.mark.slow, pytest.mark.timing,
              pytest.mark.timeout(90), pytest.mark.usefixtures("server_mode")]

X = np.ones((1, 256), np.float32)
REQUEST = pb.ModelInferRequest(model_name="sim", inputs=[
    pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 256])],
    raw_input_contents=[X.tobytes()])


async def call(stub: pb_grpc.GRPCInferenceServiceStub) -> str:
    try:
        await stub.ModelInfer(REQUEST, timeout=30)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "OK"


async def test_sigterm_under_load_answers_every_request(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory("--model", "sim", "--devices", "sim:1,sim:1", "--sim-base-ms", "20",
                            "--latency-target-ms", "5000")
    answers: Counter[str] = Counter()
    sent = 0
    signalled = asyncio.Event()
    under_load = asyncio.Event()

    async with grpc.aio.insecure_channel(server.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)

        async def client() -> None:
            nonlocal sent
            while True:
                sent += 1
                answer = await call(stub)
                answers[answer] += 1
                if answers["OK"] >= 200:
                    under_load.set()
                if answer != "OK" and signalled.is_set():
                    return  # refused: the server is going away

        clients = [asyncio.create_task(client()) for _ in range(16)]
        await asyncio.wait_for(under_load.wait(), 30)
        server.proc.send_signal(signal.SIGTERM)
        signalled.set()
        status = await health_status(health)
        await asyncio.wait_for(asyncio.gather(*clients), 60)
    assert status in ("NOT_SERVING", "UNAVAILABLE")
    assert await asyncio.to_thread(server.proc.wait, 30) == 0
    assert sum(answers.values()) == sent  # every request answered once
    assert set(answers) <= {"OK", "UNAVAILABLE"}, answers  # accepted ones succeeded
    assert answers["OK"] >= 200


async def admitted(channel: grpc.aio.Channel, count: int) -> None:
    """Return once the server holds ``count`` requests (running or queued), by its own stats."""
    stats = evenflow_pb2_grpc.EvenflowStatsStub(channel)
    for _ in range(10_000):
        model = (await stats.GetStats(evenflow_pb2.GetStatsRequest(model_name="sim"))).models[0]
        if model.queued_requests + sum(r.running_requests for r in model.replicas) >= count:
            return
    pytest.fail(f"the server never held {count} requests")


async def health_status(health: health_pb2_grpc.HealthStub) -> str:
    """The first health status other than SERVING (watched, so a signal that has to travel
    from the engine to its front-end processes is seen when it lands), or the call's error."""
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
    try:
        async for response in watch:
            if response.status != health_pb2.HealthCheckResponse.SERVING:
                return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "ended"


@pytest.mark.parametrize("second_signal", [False, True], ids=["grace-runs-out", "second-sigterm"])
async def test_what_is_left_fails_with_unavailable(server_factory, second_signal: bool) -> None:  # type: ignore[no-untyped-def]
    grace_s = "60" if second_signal else "0.5"
    server = server_factory("--model", "sim", "--devices", "sim:1", "--sim-base-ms", "3000",
                            "--max-batch", "1", "--latency-target-ms", "60000",
                            "--shutdown-grace-s", grace_s, "--no-warmup")  # 3 s a batch
    async with grpc.aio.insecure_channel(server.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = [asyncio.create_task(call(stub)) for _ in range(3)]  # one runs, two queue
        await admitted(channel, 3)
        assert not any(c.done() for c in calls)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        if second_signal:
            await health_status(health_pb2_grpc.HealthStub(channel))  # the first one landed
            server.proc.send_signal(signal.SIGTERM)
        answers = await asyncio.wait_for(asyncio.gather(*calls), 30)
    assert answers == ["UNAVAILABLE"] * 3
    assert time.monotonic() - started < 2.5  # before the 3 s batch would have ended
    assert await asyncio.to_thread(server.proc.wait, 30) == 0


async def test_open_stream_gets_its_answers_then_unavailable(server_factory) -> None:  # type: ignore[no-untyped-def]
    """A stream the client keeps open through SIGTERM: what it had admitted is answered, then
    the server ends it with UNAVAILABLE at once (it used to stay open until gRPC's stop gave up
    on it, 5 s later)."""
    server = server_factory("--model", "sim", "--devices", "sim:1", "--sim-base-ms", "300",
                            "--max-batch", "1", "--latency-target-ms", "60000", "--no-warmup")
    async with grpc.aio.insecure_channel(server.url) as channel:
        call = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(timeout=30)
        for request_id in ("a", "b"):
            await call.write(pb.ModelInferRequest(
                id=request_id, model_name=REQUEST.model_name, inputs=REQUEST.inputs,
                raw_input_contents=REQUEST.raw_input_contents))
        await admitted(channel, 2)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        answers = [await call.read() for _ in range(2)]
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call.read()
    assert sorted((a.infer_response.id, a.error_message) for a in answers) == [("a", ""),
                                                                               ("b", "")]
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
    assert time.monotonic() - started < 4.0  # the stream's end waited for nothing
    assert await asyncio.to_thread(server.proc.wait, 30) == 0
