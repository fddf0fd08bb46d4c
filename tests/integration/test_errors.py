"""Every bad input gets the right gRPC status code, and the server keeps serving afterwards."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
import numpy as np
import pytest
import pytest_asyncio

from evenflow.balancer import BalancerConfig, BatchResult, Job, ModelBalancer, Worker
from evenflow.client import (
    AsyncClient,
    DeadlineExceededError,
    InvalidInputError,
    ModelNotFoundError,
    ServerInternalError,
    ServerOverloadedError,
)
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.models.spec import SimProfile
from tests.integration.inprocess import running_app

# One event loop for the module: the bad-request tests share one server per mode (it must keep
# serving after each of them anyway) instead of starting one per case.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("server_mode"),
              pytest.mark.asyncio(loop_scope="module")]

Tensor = pb.ModelInferRequest.InferInputTensor
X = np.ones((1, 256), np.float32)


async def still_serves(client: AsyncClient) -> None:
    y = await client.infer("mlp", {"x": X}, timeout_s=10)
    assert y["y"].shape == (1, 256)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mlp(server_mode: str
              ) -> AsyncIterator[tuple[pb_grpc.GRPCInferenceServiceStub, AsyncClient]]:
    # ``failing`` beside ``mlp``: a model that raises must not stop the server serving ``mlp``.
    models = (("mlp", "mlp"), ("failing", "tests.fixture_models:failing"))
    async with running_app(models, max_message_bytes=1 << 20) as (_, url), \
            AsyncClient(url) as client:
        channel = grpc.aio.insecure_channel(url, options=[
            ("grpc.max_send_message_length", 1 << 24)])
        yield pb_grpc.GRPCInferenceServiceStub(channel), client
        await channel.close()


def raw(name: str = "x", datatype: str = "FP32", shape: tuple[int, ...] = (1, 256),
        data: bytes | None = None, model: str = "mlp", version: str = "") -> pb.ModelInferRequest:
    size = int(np.prod(shape)) * 4
    return pb.ModelInferRequest(model_name=model, model_version=version,
                                inputs=[Tensor(name=name, datatype=datatype, shape=shape)],
                                raw_input_contents=[bytes(size) if data is None else data])


@pytest.mark.parametrize(("request_", "code", "details"), [
    (raw(model="nope"), grpc.StatusCode.NOT_FOUND, "unknown model 'nope'"),
    (raw(version="7"), grpc.StatusCode.NOT_FOUND, "no version '7'"),
    (raw(name="z"), grpc.StatusCode.INVALID_ARGUMENT, "unexpected input 'z'"),
    (pb.ModelInferRequest(model_name="mlp"), grpc.StatusCode.INVALID_ARGUMENT,
     "missing input 'x'"),
    (raw(datatype="FP16", data=bytes(512)), grpc.StatusCode.INVALID_ARGUMENT,
     "input 'x' has datatype FP16; expected FP32"),
    (raw(shape=(1, 16, 16)), grpc.StatusCode.INVALID_ARGUMENT, "rank 3"),
    (raw(shape=(1, 255)), grpc.StatusCode.INVALID_ARGUMENT, "expected [-1, 256]"),
    (raw(data=bytes(1000)), grpc.StatusCode.INVALID_ARGUMENT, "raw data has 1000 bytes"),
    (pb.ModelInferRequest(model_name="mlp", inputs=[Tensor(
        name="x", datatype="FP32", shape=[1, 256],
        contents=pb.InferTensorContents(fp32_contents=[0.0] * 256))],
        raw_input_contents=[bytes(1024)]),
     grpc.StatusCode.INVALID_ARGUMENT, "both raw_input_contents and typed contents"),
    (raw(shape=(65, 256)), grpc.StatusCode.INVALID_ARGUMENT, "exceeds max batch size 64"),
    (raw(shape=(2048, 256)), grpc.StatusCode.RESOURCE_EXHAUSTED, ""),  # 2 MiB > 1 MiB limit
])
async def test_bad_request_status_codes(mlp, request_: pb.ModelInferRequest,
                                        code: grpc.StatusCode, details: str) -> None:
    stub, client = mlp
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(request_, timeout=10)
    assert info.value.code() == code
    assert details in (info.value.details() or "")
    await still_serves(client)


def with_priority(kind: str, value: object) -> pb.ModelInferRequest:
    request = raw()
    setattr(request.parameters["priority"], kind, value)
    return request


@pytest.mark.parametrize(("request_", "details"), [
    (with_priority("int64_param", -1), "'priority' must be >= 0"),
    (with_priority("string_param", "high"), "'priority' must be an integer"),
])
async def test_bad_priorities_are_refused(mlp, request_: pb.ModelInferRequest,
                                          details: str) -> None:
    stub, client = mlp
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(request_, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details in (info.value.details() or "")
    for priority in (0, 1):  # the default and the one level the model has
        assert (await client.infer("mlp", {"x": X}, priority=priority))["y"].shape == (1, 256)


@pytest.mark.parametrize("request_", [
    with_priority("int64_param", 2), with_priority("uint64_param", 2**64 - 1)],
    ids=["2", "uint64 max"])
async def test_a_priority_past_the_levels_is_served_at_the_default_level(
        mlp, request_: pb.ModelInferRequest) -> None:
    """As on Triton: tritonclient's ``infer(priority=2)`` on a one-level model runs."""
    stub, client = mlp
    response = await stub.ModelInfer(request_, timeout=10)
    assert list(response.outputs[0].shape) == [1, 256]
    assert (await client.infer("mlp", {"x": X}, priority=2))["y"].shape == (1, 256)


async def test_a_huge_tensor_parameter_key_is_invalid_argument_not_resource_exhausted(
        mlp) -> None:
    """The details go back in trailing metadata: the key is cut short, or the client would
    hear RESOURCE_EXHAUSTED (metadata too large) for its own bad request."""
    stub, client = mlp
    request = raw()
    request.inputs[0].parameters["k" * 20_000].bool_param = True
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tensor parameters" in (info.value.details() or "")
    await still_serves(client)


async def test_typed_contents_are_accepted(mlp) -> None:
    stub, _ = mlp
    response = await stub.ModelInfer(pb.ModelInferRequest(model_name="mlp", inputs=[Tensor(
        name="x", datatype="FP32", shape=[1, 256],
        contents=pb.InferTensorContents(fp32_contents=[1.0] * 256))]), timeout=10)
    assert list(response.outputs[0].shape) == [1, 256]


async def test_client_errors_carry_the_code(mlp) -> None:
    _, client = mlp
    with pytest.raises(ModelNotFoundError) as info:
        await client.infer("nope", {"x": X})
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(InvalidInputError):
        await client.infer("mlp", {"x": X.astype(np.float64)})
    with pytest.raises(ModelNotFoundError):
        await client.model_metadata("nope")


async def test_model_exception_is_internal_and_server_keeps_serving(mlp) -> None:
    _, client = mlp
    poisoned = np.array([[13.0, 0, 0, 0]], np.float32)
    with pytest.raises(ServerInternalError, match="poisoned input"):
        await client.infer("failing", {"x": poisoned}, timeout_s=10)
    fine = await client.infer("failing", {"x": np.ones((1, 4), np.float32)}, timeout_s=10)
    np.testing.assert_array_equal(fine["y"], np.full((1, 4), 2.0, np.float32))
    await still_serves(client)


class SubmitSpy:
    """Wraps a balancer's submit: an event per admitted request, and the futures it returned."""

    def __init__(self, balancer: ModelBalancer) -> None:
        self.futures: list[asyncio.Future[object]] = []
        self.admitted = asyncio.Event()
        original: Callable[..., asyncio.Future[object]] = balancer.submit

        def submit(*args: object, **kwargs: object) -> asyncio.Future[object]:
            future = original(*args, **kwargs)
            self.futures.append(future)
            self.admitted.set()
            return future

        balancer.submit = submit  # type: ignore[method-assign]

    async def next_admitted(self) -> asyncio.Future[object]:
        await asyncio.wait_for(self.admitted.wait(), 10)
        self.admitted.clear()
        return self.futures[-1]


class DeviceGate:
    """Holds the gated model's only device: its next batch hangs (the sim device fault, which
    reaches a worker thread or a worker process alike) until ``open``; ``entered`` is set when
    the balancer hands a batch to the worker."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self.entered = asyncio.Event()
        original = worker.run

        async def run(jobs: Sequence[Job]) -> BatchResult:
            self.entered.set()
            return await original(jobs)

        worker.run = run  # type: ignore[method-assign]

    async def close(self) -> None:
        await self._worker.set_device_fault("sim0", "hang", 1)

    async def open(self) -> None:
        await self._worker.set_device_fault("sim0", "clear", 0)


Gated = tuple[AsyncClient, ModelBalancer, SubmitSpy, DeviceGate]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gated_server(server_mode: str) -> AsyncIterator[Gated]:
    """One server per mode for the gated tests; ``gated`` closes its gate for each test."""
    models = (("mlp", "mlp"), ("gated", "sim"))
    # The gate makes batch times whatever the test holds them for: no time-based admission.
    config = BalancerConfig(max_wait_s=0.0, max_queued_requests=1, adaptive_batching=False,
                            latency_target_s=60.0)
    async with running_app(models, devices="sim:1", balancer=config,
                           sim_profile=SimProfile(base_ms=0.0, per_sample_ms=0.0)) as (app, url), \
            AsyncClient(url) as client:
        balancer = app.models.get("gated").balancer  # type: ignore[union-attr]
        gate = DeviceGate(balancer.replicas[0].worker)
        spy = SubmitSpy(balancer)
        yield client, balancer, spy, gate


@pytest_asyncio.fixture(loop_scope="module")
async def gated(gated_server: Gated) -> AsyncIterator[Gated]:
    """The shared gated server with its gate closed, and nothing seen yet by this test: the
    tests count what ran from their own start (``since``)."""
    _, _, spy, gate = gated_server
    gate.entered.clear()
    spy.admitted.clear()
    await gate.close()
    yield gated_server
    await gate.open()


Counts = tuple[int, int, Counter[str]]  # samples run, batches run, refusals by reason


def counts(balancer: ModelBalancer) -> Counts:
    counters = balancer.counters
    return counters.inference_count, counters.execution_count, Counter(counters.rejected)


def since(before: Counts, balancer: ModelBalancer) -> tuple[int, int, dict[str, int]]:
    """What ran, and what was refused, since ``before`` was counted."""
    samples, batches, rejected = counts(balancer)
    return (samples - before[0], batches - before[1],
            {reason: n - before[2][reason] for reason, n in rejected.items()
             if n != before[2][reason]})


async def hold_worker(client: AsyncClient, spy: SubmitSpy,
                      gate: DeviceGate) -> asyncio.Task[dict[str, np.ndarray]]:
    """Start a request that occupies the gated model's only worker until the gate opens."""
    first = asyncio.create_task(client.infer("gated", {"x": np.ones((1, 256), np.float32)},
                                             timeout_s=30))
    await spy.next_admitted()
    await asyncio.wait_for(gate.entered.wait(), 10)
    return first


async def test_deadline_exceeded_drops_queued_work(gated) -> None:
    client, balancer, spy, gate = gated
    before = counts(balancer)
    first = await hold_worker(client, spy, gate)
    with pytest.raises(DeadlineExceededError):
        await client.infer("gated", {"x": np.zeros((1, 256), np.float32)}, timeout_s=0.3)
    await gate.open()
    await first
    await client.infer("gated", {"x": np.ones((1, 256), np.float32)}, timeout_s=10)
    # The expired request never ran: two requests ran, in two batches.
    assert since(before, balancer)[:2] == (2, 2)


async def test_client_cancellation_drops_queued_work(gated) -> None:
    client, balancer, spy, gate = gated
    before = counts(balancer)
    first = await hold_worker(client, spy, gate)
    second = asyncio.create_task(client.infer("gated", {"x": np.zeros((1, 256), np.float32)}))
    queued = await spy.next_admitted()
    second.cancel()
    cancelled = asyncio.Event()
    queued.add_done_callback(lambda _: cancelled.set())
    await asyncio.wait_for(cancelled.wait(), 10)  # the server saw the cancellation
    assert queued.cancelled()
    await gate.open()
    await first
    assert since(before, balancer)[0] == 1  # the cancelled request never ran
    with pytest.raises(asyncio.CancelledError):
        await second


async def test_full_queue_is_resource_exhausted(gated) -> None:
    client, balancer, spy, gate = gated
    before = counts(balancer)
    first = await hold_worker(client, spy, gate)
    second = asyncio.create_task(client.infer("gated", {"x": np.ones((1, 256), np.float32)}))
    await spy.next_admitted()
    with pytest.raises(ServerOverloadedError, match="limit 1"):
        await client.infer("gated", {"x": np.ones((1, 256), np.float32)})
    await gate.open()
    await first
    await second
    assert since(before, balancer)[2] == {"queue_full": 1}


async def test_a_bug_in_the_server_answers_internal_and_the_server_keeps_serving(
        mlp, monkeypatch: pytest.MonkeyPatch, server_mode: str) -> None:
    if "frontends" in server_mode:
        pytest.skip("patches the edge's encoder in this process; with --frontends the edge "
                    "runs in the front-end processes")
    from evenflow.client import ServerInternalError
    from evenflow.server.edge import codec

    real_encode = codec.encode_response

    def encode_or_fail(request, specs, chosen, arrays):  # type: ignore[no-untyped-def]
        if request.id in ("boom", "1"):
            raise RuntimeError("a bug while encoding")
        return real_encode(request, specs, chosen, arrays)

    monkeypatch.setattr(codec, "encode_response", encode_or_fail)
    _, client = mlp
    with pytest.raises(ServerInternalError, match="internal server error"):
        await client.infer("mlp", {"x": X}, request_id="boom")
    assert (await client.infer("mlp", {"x": X}))["y"].shape == (1, 256)
    # Over a stream the failing request (id "1") is answered too, and the stream goes on.
    answers = {r.request_id: r async for r in client.stream_infer("mlp", [{"x": X}] * 3)}
    assert set(answers) == {"0", "1", "2"}
    assert isinstance(answers["1"].error, ServerInternalError)
    assert answers["0"].error is None and answers["2"].error is None
