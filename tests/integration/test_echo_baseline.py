"""The echo baselines of the overhead benchmarks answer every request with its own bytes, in
each answering mode, under concurrent unary calls and over a stream (``benchmarks.echo_server``)."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest

from benchmarks.echo_server import DeferredEchoServicer, build_server, make_servicer
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)


def _request(index: int) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name="mlp", id=str(index),
        inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 256])],
        raw_input_contents=[np.full((1, 256), index, np.float32).tobytes()])


@pytest.mark.parametrize("defer", ["none", "turn", "thread"])
async def test_every_request_gets_its_own_echo(defer: str) -> None:
    servicer = make_servicer(defer)
    server, port = build_server(servicer, "127.0.0.1", 0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            responses = await asyncio.gather(*(stub.ModelInfer(_request(i)) for i in range(64)))
            streamed = [answer.infer_response async for answer in
                        stub.ModelStreamInfer(iter([_request(i) for i in range(8)]))]
    finally:
        await server.stop(None)
        if isinstance(servicer, DeferredEchoServicer):
            servicer.close()
    assert [response.id for response in streamed] == [str(i) for i in range(8)]
    for index, response in [*enumerate(responses), *enumerate(streamed)]:
        assert response.id == str(index)
        assert list(response.outputs[0].shape) == [1, 256]
        echoed = np.frombuffer(response.raw_output_contents[0], np.float32)
        assert (echoed == index).all()


@pytest.mark.parametrize("defer", ["none", "turn", "thread"])
async def test_a_delayed_echo_answers_no_sooner_than_its_delay(defer: str) -> None:
    delay_s = 0.05
    servicer = make_servicer(defer, delay_s)
    server, port = build_server(servicer, "127.0.0.1", 0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            await stub.ModelInfer(_request(0))  # connected
            started_s = time.monotonic()
            response = await stub.ModelInfer(_request(7))
            elapsed_s = time.monotonic() - started_s
    finally:
        await server.stop(None)
        if isinstance(servicer, DeferredEchoServicer):
            servicer.close()
    assert response.id == "7"
    # A loop timer may fire up to the clock's resolution early.
    assert elapsed_s >= delay_s - 1e-3
