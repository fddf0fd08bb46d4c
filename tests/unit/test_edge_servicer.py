"""EdgeServicer alone: a hand-written model directory and servicer context, no gRPC server. What
goes in is a request message; what comes out is the response, or the status the call aborts
with, and what the failure count hears."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import pytest

from evenflow.balancer import ModelNotFound, Overloaded, WorkerLost
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import metadata
from evenflow.server.edge.decoding import Undecodable
from evenflow.server.edge.servicer import _MAX_STREAM_IN_FLIGHT, EdgeServicer
from evenflow.server.models.spec import Padding, TensorSpec
from tests.fakes import Aborted, FakeContext
from tests.unit.balancer_fakes import settle

pytestmark = pytest.mark.timeout(10)

_WAIT_S = 5.0


@dataclass(frozen=True)
class Specs:
    """A model's tensor specs as the edge reads them: ``x`` in, ``y`` out, both [-1, 4] FP32."""

    inputs: Sequence[TensorSpec] = (TensorSpec("x", "FP32", (-1, 4)),)
    outputs: Sequence[TensorSpec] = (TensorSpec("y", "FP32", (-1, 4)),)
    padding: Padding | None = None
    variable_shapes: bool = False


@dataclass
class Submitted:
    """One request as the model received it, and the answer the test gives it."""

    arrays: list[np.ndarray]
    num_samples: int
    deadline_s: float
    priority: int
    shape_key: Hashable
    answer: asyncio.Future[Any]

    def double(self) -> None:
        self.answer.set_result([self.arrays[0] * 2])


@dataclass
class FakeModel:
    """An InferTarget that records each request; with ``auto`` set its answer is the input
    doubled at once, otherwise it waits until the test resolves ``Submitted.answer``."""

    auto: bool = True
    definition: Specs = field(default_factory=Specs)
    cpu_parts: None = None
    arrived: asyncio.Queue[Submitted] = field(default_factory=asyncio.Queue)

    def submit(self, payload: Any, num_samples: int, deadline_s: float, priority: int,
               shape_key: Hashable = None) -> asyncio.Future[Any]:
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        submitted = Submitted(payload, num_samples, deadline_s, priority, shape_key, answer)
        if self.auto:
            submitted.double()
        self.arrived.put_nowait(submitted)
        return answer

    async def next_request(self) -> Submitted:
        return await asyncio.wait_for(self.arrived.get(), _WAIT_S)


class FakeDirectory:
    """Served models by name (one version each, as the engine's table answers)."""

    def __init__(self, **models: FakeModel) -> None:
        self._models = models

    def get(self, name: str, version: str = "") -> FakeModel:
        if name not in self._models:
            raise ModelNotFound(f"unknown model {name!r}")
        return self._models[name]

    def __contains__(self, name: str) -> bool:
        return name in self._models


@dataclass
class Edge:
    servicer: EdgeServicer
    model: FakeModel
    failures: list[tuple[str, str]]  # (model label, status name) as on_failure heard them


def make_edge(model: FakeModel | None = None) -> Edge:
    model = FakeModel() if model is None else model
    failures: list[tuple[str, str]] = []
    servicer = EdgeServicer(models=FakeDirectory(m=model), server_name="evenflow",
                            server_version="9.9", max_tensor_elements=1 << 16,
                            on_failure=lambda name, code: failures.append((name, code)))
    servicer.ready = True
    return Edge(servicer, model, failures)


def infer_request(x: np.ndarray, *, model: str = "m", request_id: str = "r1",
                  datatype: str = "FP32",
                  timeout_us: int | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name=model, id=request_id,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype,
                                                      shape=list(x.shape))],
        raw_input_contents=[x.tobytes()])
    if timeout_us is not None:
        request.parameters["timeout"].int64_param = timeout_us
    return request


def output_of(response: pb.ModelInferResponse) -> np.ndarray:
    (output,) = response.outputs
    assert (output.name, output.datatype) == ("y", "FP32")
    return np.frombuffer(response.raw_output_contents[0], np.float32).reshape(output.shape)


X = np.arange(8, dtype=np.float32).reshape(2, 4)


async def test_a_valid_call_is_answered_with_the_models_output() -> None:
    edge = make_edge()
    response = await edge.servicer.ModelInfer(infer_request(X), FakeContext())
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "r1")
    np.testing.assert_array_equal(output_of(response), X * 2)
    submitted = await edge.model.next_request()
    assert (submitted.num_samples, submitted.priority, submitted.deadline_s) == (2, 0, np.inf)
    np.testing.assert_array_equal(submitted.arrays[0], X)
    assert edge.failures == []


async def test_the_earlier_of_the_calls_deadline_and_its_timeout_reaches_the_model() -> None:
    edge = make_edge()
    before_s = time.monotonic()
    await edge.servicer.ModelInfer(infer_request(X), FakeContext(time_remaining_s=5.0))
    await edge.servicer.ModelInfer(infer_request(X, timeout_us=1_000_000),
                                   FakeContext(time_remaining_s=5.0))
    after_s = time.monotonic()
    by_deadline, by_timeout = await edge.model.next_request(), await edge.model.next_request()
    assert before_s + 5.0 <= by_deadline.deadline_s <= after_s + 5.0
    assert before_s + 1.0 <= by_timeout.deadline_s <= after_s + 1.0


@pytest.mark.parametrize(("request_", "details"), [
    (infer_request(X, datatype="FP16"), "input 'x' has datatype FP16; expected FP32"),
    (infer_request(np.ones((2, 3), np.float32)),
     "input 'x' has shape [2, 3]; expected [-1, 4] (-1: any size >= 1)"),
    (Undecodable("the request is not a valid inference.ModelInferRequest (3 bytes): bad"),
     "the request is not a valid inference.ModelInferRequest (3 bytes): bad"),
], ids=["datatype", "shape", "undecodable"])
async def test_bad_input_is_invalid_argument_with_the_reason(
        request_: pb.ModelInferRequest | Undecodable, details: str) -> None:
    edge = make_edge()
    context = FakeContext()
    with pytest.raises(Aborted):
        await edge.servicer.ModelInfer(request_, context)
    assert (context.code, context.details) == (grpc.StatusCode.INVALID_ARGUMENT, details)
    assert context.trailing_metadata == ()  # sent again, it would fail again
    assert edge.model.arrived.empty()  # refused before the model saw it
    label = "m" if isinstance(request_, pb.ModelInferRequest) else ""
    assert edge.failures == [(label, "INVALID_ARGUMENT")]


async def test_an_unknown_model_is_not_found_and_its_name_is_no_metric_label() -> None:
    edge = make_edge()
    context = FakeContext()
    with pytest.raises(Aborted):
        await edge.servicer.ModelInfer(infer_request(X, model="nope"), context)
    assert (context.code, context.details) == (grpc.StatusCode.NOT_FOUND, "unknown model 'nope'")
    assert edge.failures == [("", "NOT_FOUND")]


async def test_a_refusal_by_the_model_keeps_its_status_and_message() -> None:
    edge = make_edge(FakeModel(auto=False))
    context = FakeContext()
    call = asyncio.create_task(edge.servicer.ModelInfer(infer_request(X), context))
    (await edge.model.next_request()).answer.set_exception(Overloaded("queue full"))
    with pytest.raises(Aborted):
        await call
    assert (context.code, context.details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
    assert edge.failures == [("m", "RESOURCE_EXHAUSTED")]


@pytest.mark.parametrize(("error", "marked"), [
    (WorkerLost("lost while running the batch"), False),  # it may have run
    (WorkerLost("no replica in service", not_run=True), True),  # refused before it ran
], ids=["ran", "not-run"])
async def test_only_an_unavailable_that_did_not_run_is_marked_may_resend(
        error: WorkerLost, marked: bool) -> None:
    edge = make_edge(FakeModel(auto=False))
    context = FakeContext()
    call = asyncio.create_task(edge.servicer.ModelInfer(infer_request(X), context))
    (await edge.model.next_request()).answer.set_exception(error)
    with pytest.raises(Aborted):
        await call
    assert context.code is grpc.StatusCode.UNAVAILABLE
    assert context.trailing_metadata == (((metadata.MAY_RESEND, "1"),) if marked else ())


async def test_a_bug_is_internal_and_the_next_call_is_still_served() -> None:
    edge = make_edge(FakeModel(auto=False))
    context = FakeContext()
    call = asyncio.create_task(edge.servicer.ModelInfer(infer_request(X), context))
    (await edge.model.next_request()).answer.set_exception(RuntimeError("bug"))
    with pytest.raises(Aborted):
        await call
    assert context.code is grpc.StatusCode.INTERNAL
    assert context.details == "internal server error (RuntimeError); see the server log"
    call = asyncio.create_task(edge.servicer.ModelInfer(infer_request(X), FakeContext()))
    (await edge.model.next_request()).double()
    np.testing.assert_array_equal(output_of(await call), X * 2)
    assert edge.failures == [("m", "INTERNAL")]


async def test_the_server_level_calls_answer_from_the_servicer() -> None:
    edge = make_edge()
    context = FakeContext()
    live = await edge.servicer.ServerLive(pb.ServerLiveRequest(), context)
    ready = await edge.servicer.ServerReady(pb.ServerReadyRequest(), context)
    metadata = await edge.servicer.ServerMetadata(pb.ServerMetadataRequest(), context)
    assert (live.live, ready.ready) == (True, True)
    assert (metadata.name, metadata.version) == ("evenflow", "9.9")
    assert "binary_tensor_data" in metadata.extensions


async def test_a_drain_refuses_new_calls_and_counts_those_taken_until_their_status_is_sent(
        ) -> None:
    edge = make_edge()
    taken = FakeContext()
    await edge.servicer.ModelInfer(infer_request(X), taken)
    edge.servicer.drain()
    refused = FakeContext()
    with pytest.raises(Aborted):
        await edge.servicer.ModelInfer(infer_request(X), refused)
    assert refused.code is grpc.StatusCode.UNAVAILABLE
    # Refused before it ran: marked as one the client may send again (to another server).
    assert refused.trailing_metadata == ((metadata.MAY_RESEND, "1"),)
    ready = await edge.servicer.ServerReady(pb.ServerReadyRequest(), refused)
    assert not ready.ready
    assert await edge.servicer.answered(timeout_s=0.0) == 1  # answered, status not yet sent
    taken.finish()
    assert await edge.servicer.answered(timeout_s=_WAIT_S) == 0


class Requests:
    """A client's side of a stream: requests the test sends, then ``end``."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[pb.ModelInferRequest | Undecodable | None] = asyncio.Queue()

    def send(self, request: pb.ModelInferRequest | Undecodable) -> None:
        self._queue.put_nowait(request)

    def end(self) -> None:
        self._queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[pb.ModelInferRequest | Undecodable]:
        while (request := await self._queue.get()) is not None:
            yield request


class Responses:
    """What a stream wrote, read by a task, with a wait for the n-th response."""

    def __init__(self, stream: AsyncIterator[pb.ModelStreamInferResponse]) -> None:
        self.written: list[pb.ModelStreamInferResponse] = []
        self._changed = asyncio.Event()
        self.reading = asyncio.create_task(self._read(stream))

    async def _read(self, stream: AsyncIterator[pb.ModelStreamInferResponse]) -> None:
        async for response in stream:
            self.written.append(response)
            self._changed.set()

    async def until(self, count: int) -> None:
        async def wait() -> None:
            while len(self.written) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), _WAIT_S)

    async def end(self) -> list[pb.ModelStreamInferResponse]:
        await asyncio.wait_for(self.reading, _WAIT_S)
        return self.written


async def test_a_stream_answers_each_request_as_it_finishes_and_goes_on_past_a_bad_one(
        ) -> None:
    edge = make_edge(FakeModel(auto=False))
    requests = Requests()
    responses = Responses(edge.servicer.ModelStreamInfer(aiter(requests), FakeContext()))
    requests.send(infer_request(X, request_id="a"))
    requests.send(infer_request(X, request_id="bad", datatype="INT8"))
    requests.send(infer_request(X + 1, request_id="b"))
    first, second = await edge.model.next_request(), await edge.model.next_request()
    second.double()  # b finishes first: written first
    await responses.until(2)
    first.double()
    requests.end()
    bad, b, a = await responses.end()
    assert (bad.infer_response.id, bad.error_message) == (
        "bad", "INVALID_ARGUMENT: input 'x' has datatype INT8; expected FP32")
    assert (b.infer_response.id, b.error_message, a.infer_response.id) == ("b", "", "a")
    np.testing.assert_array_equal(output_of(b.infer_response), (X + 1) * 2)
    np.testing.assert_array_equal(output_of(a.infer_response), X * 2)
    assert edge.failures == [("m", "INVALID_ARGUMENT")]


async def test_a_drained_stream_answers_what_it_admitted_then_ends_unavailable() -> None:
    edge = make_edge(FakeModel(auto=False))
    requests = Requests()
    context = FakeContext()
    responses = Responses(edge.servicer.ModelStreamInfer(aiter(requests), context))
    requests.send(infer_request(X, request_id="admitted"))
    admitted = await edge.model.next_request()
    edge.servicer.drain()
    admitted.double()
    with pytest.raises(Aborted):
        await responses.end()
    assert [r.infer_response.id for r in responses.written] == ["admitted"]
    assert responses.written[0].error_message == ""
    assert context.code is grpc.StatusCode.UNAVAILABLE


async def test_a_request_read_after_the_drain_is_refused_on_the_stream_before_it_ends(
        ) -> None:
    """The client sent a request and half-closed before the drain, and nothing was in flight:
    the drain and the reader's refusal land in one turn of the loop, and the refusal is still
    written before the stream ends OK (the half-close came before the stream had to end)."""
    edge = make_edge(FakeModel(auto=False))
    requests = Requests()
    context = FakeContext()
    responses = Responses(edge.servicer.ModelStreamInfer(aiter(requests), context))
    await asyncio.sleep(0)  # let the stream start (no request is in flight)
    requests.send(infer_request(X, request_id="late"))
    requests.end()
    edge.servicer.drain()
    late, = await responses.end()
    assert (late.infer_response.id, late.error_message.split(":")[0]) == ("late", "UNAVAILABLE")
    assert context.code is None
    assert edge.failures == [("m", "UNAVAILABLE")]


async def test_a_stream_whose_reading_fails_ends_with_the_error_and_drops_its_answers(
        ) -> None:
    edge = make_edge(FakeModel(auto=False))

    async def failing() -> AsyncIterator[pb.ModelInferRequest]:
        yield infer_request(X)
        raise RuntimeError("the transport broke")

    responses = Responses(edge.servicer.ModelStreamInfer(failing(), FakeContext()))
    pending = await edge.model.next_request()
    with pytest.raises(RuntimeError, match="the transport broke"):
        await responses.end()  # at once, not once the answer in flight comes
    assert pending.answer.cancelled()


async def test_a_stream_that_goes_away_cancels_the_answers_it_still_awaits() -> None:
    edge = make_edge(FakeModel(auto=False))
    requests = Requests()
    responses = Responses(edge.servicer.ModelStreamInfer(aiter(requests), FakeContext()))
    requests.send(infer_request(X))
    pending = await edge.model.next_request()
    responses.reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await responses.reading
    assert pending.answer.cancelled()  # the balancer drops a job whose caller went away
    assert responses.written == []


async def test_a_client_that_does_not_read_holds_its_stream_back_instead_of_filling_a_queue(
        ) -> None:
    """The model answers at once and the client takes one response, then none: the stream
    reads no further than its bound (responses written count against it, not only answers
    awaited), so gRPC's flow control reaches the sender. Once the client reads on, every
    request is answered."""
    edge = make_edge()
    total = 5000
    pulled = 0

    async def requests() -> AsyncIterator[pb.ModelInferRequest]:
        nonlocal pulled
        for index in range(total):
            pulled += 1
            yield infer_request(X, request_id=str(index))

    responses = edge.servicer.ModelStreamInfer(requests(), FakeContext())
    first = await asyncio.wait_for(anext(responses), _WAIT_S)
    await settle(rounds=50)  # unbounded, the reader would have taken all 5000 by now
    (stream,) = edge.servicer._streams
    assert stream.results.qsize() <= _MAX_STREAM_IN_FLIGHT + 1
    assert pulled == _MAX_STREAM_IN_FLIGHT + 1  # the next one read waits for a slot
    rest = await asyncio.wait_for(collect(responses), _WAIT_S)
    ids = [response.infer_response.id for response in (first, *rest)]
    assert sorted(ids, key=int) == [str(index) for index in range(total)]
    assert all(not response.error_message for response in rest)


async def collect(responses: AsyncIterator[pb.ModelStreamInferResponse]
                  ) -> list[pb.ModelStreamInferResponse]:
    return [response async for response in responses]


async def test_every_streamed_response_is_marked_final_as_triton_marks_it() -> None:
    """Triton sets ``triton_final_response`` on each response of a non-decoupled model's
    stream, errors included; clients written for decoupled models wait for it."""
    edge = make_edge(FakeModel(auto=False))
    requests = Requests()
    responses = Responses(edge.servicer.ModelStreamInfer(aiter(requests), FakeContext()))
    requests.send(infer_request(X, request_id="ok"))
    requests.send(infer_request(X, request_id="refused", datatype="INT8"))
    requests.send(infer_request(X, request_id="overloaded"))
    ok, overloaded = await edge.model.next_request(), await edge.model.next_request()
    ok.double()
    overloaded.answer.set_exception(Overloaded("queue full"))
    requests.end()
    written = {response.infer_response.id: response for response in await responses.end()}
    assert sorted(written) == ["ok", "overloaded", "refused"]
    assert written["ok"].error_message == ""
    assert written["refused"].error_message.startswith("INVALID_ARGUMENT")
    assert written["overloaded"].error_message.startswith("RESOURCE_EXHAUSTED")
    for response in written.values():
        final = response.infer_response.parameters["triton_final_response"]
        assert final.WhichOneof("parameter_choice") == "bool_param" and final.bool_param


def int_request(datatype: str, field_name: str, values: list[int]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id="r1", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype,
                                              shape=[1, len(values)])])
    getattr(request.inputs[0].contents, field_name).extend(values)
    return request


@pytest.mark.parametrize(("datatype", "field_name", "value", "bounds"), [
    ("INT8", "int_contents", 300, "[-128, 127]"),
    ("INT8", "int_contents", -129, "[-128, 127]"),
    ("INT16", "int_contents", 70000, "[-32768, 32767]"),
    ("UINT8", "uint_contents", 300, "[0, 255]"),
    ("UINT16", "uint_contents", 70000, "[0, 65535]"),
])
async def test_typed_integers_outside_the_datatype_are_invalid_argument(
        datatype: str, field_name: str, value: int, bounds: str) -> None:
    spec = TensorSpec("x", datatype, (-1, 2))
    edge = make_edge(FakeModel(definition=Specs(inputs=(spec,), outputs=(spec,))))
    context = FakeContext()
    with pytest.raises(Aborted):
        await edge.servicer.ModelInfer(int_request(datatype, field_name, [1, value]), context)
    assert context.code is grpc.StatusCode.INVALID_ARGUMENT
    assert context.details == (f"input 'x' contents.{field_name} holds values outside "
                               f"{datatype}'s range {bounds}")
    assert edge.model.arrived.empty()


async def test_typed_integers_at_the_datatypes_bounds_are_served() -> None:
    spec = TensorSpec("x", "INT8", (-1, 2))
    edge = make_edge(FakeModel(auto=False, definition=Specs(inputs=(spec,), outputs=(spec,))))
    call = asyncio.create_task(edge.servicer.ModelInfer(
        int_request("INT8", "int_contents", [-128, 127]), FakeContext()))
    submitted = await edge.model.next_request()
    np.testing.assert_array_equal(submitted.arrays[0], np.array([[-128, 127]], np.int8))
    submitted.answer.set_result(submitted.arrays)
    assert (await call).outputs[0].datatype == "INT8"


_LONG_KEY = "k" * 20_000


def with_tensor_parameter(request: pb.ModelInferRequest) -> pb.ModelInferRequest:
    request.inputs[0].parameters[_LONG_KEY].bool_param = True
    return request


def with_output_parameter(request: pb.ModelInferRequest) -> pb.ModelInferRequest:
    request.outputs.add(name="y").parameters[_LONG_KEY].bool_param = True
    return request


@pytest.mark.parametrize("add_key", [with_tensor_parameter, with_output_parameter],
                         ids=["tensor", "requested output"])
async def test_a_huge_parameter_key_is_named_cut_short(
        add_key: Callable[[pb.ModelInferRequest], pb.ModelInferRequest]) -> None:
    """The details travel in gRPC's trailing metadata (8 KiB by default): echoing a 20,000
    character key would make the client see RESOURCE_EXHAUSTED instead of the refusal."""
    edge = make_edge()
    context = FakeContext()
    with pytest.raises(Aborted):
        await edge.servicer.ModelInfer(add_key(infer_request(X)), context)
    assert context.code is grpc.StatusCode.INVALID_ARGUMENT
    assert context.details is not None and len(context.details) < 300
    assert f"['{'k' * 64}']" in context.details
