"""gRPC ``stream_infer`` errors as the caller sees them: a request that cannot be built (or an
input iterator that fails) raises its own exception, as the HTTP path does, not gRPC's
UNKNOWN "Exception iterating requests!" or a bare CancelledError, and the call is closed; a
streamed error_message keeps its text unless it starts with a gRPC status name (evenflow's
server's prefix)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from evenflow.balancer import ModelNotFound
from evenflow.client import AsyncClient, Client, InferenceServerError, ModelNotFoundError
from evenflow.client._codec import parse_stream_response
from evenflow.client._types import Inputs
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.edge.status import stream_error_message

pytestmark = pytest.mark.timeout(10)

GOOD: Inputs = {"x": np.arange(4, dtype=np.float32)}
BAD: Inputs = {"x": np.zeros(2, np.complex64)}  # no KServe datatype: to_wire's TypeError
BAD_MESSAGE = "unsupported dtype complex64"  # what the HTTP path raises (test_client_http)


class EchoServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Answers each streamed request with its inputs as outputs; ``ended`` is set when a
    stream's call terminates (completed or cancelled)."""

    def __init__(self) -> None:
        self.ended = threading.Event()

    def ModelStreamInfer(self, request_iterator: Iterator[pb.ModelInferRequest],
                         context: grpc.ServicerContext
                         ) -> Iterator[pb.ModelStreamInferResponse]:
        context.add_callback(self.ended.set)
        for request in request_iterator:
            yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(
                model_name=request.model_name, id=request.id,
                outputs=[pb.ModelInferResponse.InferOutputTensor(
                    name=t.name, datatype=t.datatype, shape=t.shape) for t in request.inputs],
                raw_output_contents=request.raw_input_contents))


@pytest.fixture
def echo() -> Iterator[tuple[EchoServicer, str]]:
    # A threaded server, not grpc.aio: the blocking Client would block an asyncio server's loop.
    servicer = EchoServicer()
    with ThreadPoolExecutor(max_workers=4) as pool:
        server = grpc.server(pool)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield servicer, f"127.0.0.1:{port}"
        finally:
            server.stop(None).wait()


def test_sync_a_first_request_that_cannot_be_built_raises_its_own_error(
        echo: tuple[EchoServicer, str]) -> None:
    with Client(echo[1]) as client:
        with pytest.raises(TypeError, match=BAD_MESSAGE):
            list(client.stream_infer("m", [BAD, GOOD]))
        [result] = client.stream_infer("m", [GOOD])  # a fresh call works
        assert result.outputs is not None
        np.testing.assert_array_equal(result.outputs["x"], GOOD["x"])


def test_sync_a_later_failure_raises_its_own_error_and_closes_the_call(
        echo: tuple[EchoServicer, str]) -> None:
    servicer, address = echo
    answered = threading.Event()

    def inputs() -> Iterator[Inputs]:
        yield GOOD
        # Fail only once the server has answered: its call is then surely open, and must end.
        assert answered.wait(5)
        yield BAD

    with Client(address) as client:
        ids = []
        with pytest.raises(TypeError, match=BAD_MESSAGE):
            for result in client.stream_infer("m", inputs(), timeout_s=5):
                ids.append(result.request_id)
                answered.set()
        assert ids == ["0"]
        assert servicer.ended.wait(5)
        assert [r.request_id for r in client.stream_infer("m", [GOOD, GOOD])] == ["0", "1"]


def test_sync_an_input_iterator_that_fails_raises_its_own_error(
        echo: tuple[EchoServicer, str]) -> None:
    def inputs() -> Iterator[Inputs]:
        yield GOOD
        raise RuntimeError("the input source broke")

    with Client(echo[1]) as client, pytest.raises(RuntimeError, match="input source broke"):
        list(client.stream_infer("m", inputs()))


async def _no_task_left_behind() -> bool:
    """Every other task (gRPC's request consumer, its call's bookkeeping) ends, unprompted."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if not others:
        return True
    _, pending = await asyncio.wait(others, timeout=5)
    return not pending


async def test_async_a_first_request_that_cannot_be_built_raises_its_own_error(
        echo: tuple[EchoServicer, str]) -> None:
    async with AsyncClient(echo[1]) as client:
        with pytest.raises(TypeError, match=BAD_MESSAGE):
            async for _ in client.stream_infer("m", [BAD, GOOD]):
                pass
        assert await _no_task_left_behind()
        results = [r async for r in client.stream_infer("m", [GOOD])]
        assert results[0].outputs is not None
        np.testing.assert_array_equal(results[0].outputs["x"], GOOD["x"])


async def test_async_a_later_failure_raises_its_own_error_and_closes_the_call(
        echo: tuple[EchoServicer, str]) -> None:
    servicer, address = echo
    answered = asyncio.Event()

    async def inputs() -> AsyncIterator[Inputs]:
        yield GOOD
        await answered.wait()  # fail only once the server's call is surely open
        yield BAD

    async with AsyncClient(address) as client:
        ids = []
        with pytest.raises(TypeError, match=BAD_MESSAGE):
            async for result in client.stream_infer("m", inputs(), timeout_s=5):
                ids.append(result.request_id)
                answered.set()
        assert ids == ["0"]
        assert await _no_task_left_behind()
        assert await asyncio.to_thread(servicer.ended.wait, 5)
        assert sorted([r.request_id async for r in client.stream_infer("m", [GOOD, GOOD])]) \
            == ["0", "1"]


async def test_async_an_input_iterator_that_fails_raises_its_own_error(
        echo: tuple[EchoServicer, str]) -> None:
    async def inputs() -> AsyncIterator[Inputs]:
        yield GOOD
        raise RuntimeError("the input source broke")

    async with AsyncClient(echo[1]) as client:
        with pytest.raises(RuntimeError, match="input source broke"):
            async for _ in client.stream_infer("m", inputs()):
                pass


def _stream_error(message: str) -> Exception | None:
    return parse_stream_response(pb.ModelStreamInferResponse(
        error_message=message, infer_response=pb.ModelInferResponse(id="7"))).error


def test_a_message_without_a_status_prefix_is_kept_whole() -> None:
    message = "Request for unknown model: 'foo' is not found"  # Triton's
    error = _stream_error(message)
    assert isinstance(error, InferenceServerError)
    assert (error.code, error.details) == (grpc.StatusCode.UNKNOWN, message)


def test_evenflows_stream_error_parses_back_to_its_status() -> None:
    error = _stream_error(stream_error_message(ModelNotFound("unknown model 'foo'")))
    assert isinstance(error, ModelNotFoundError)
    assert (error.code, error.details) == (grpc.StatusCode.NOT_FOUND, "unknown model 'foo'")


def test_a_status_name_alone_is_that_status() -> None:
    error = _stream_error("UNAVAILABLE")
    assert isinstance(error, InferenceServerError)
    assert (error.code, error.details) == (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE")
