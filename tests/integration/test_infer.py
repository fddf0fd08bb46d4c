"""End to end through gRPC with our clients: results, metadata, config, statistics, streaming,
health and reflection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
import pytest_asyncio
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from evenflow.client import AsyncClient
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.proto import model_config_pb2 as mc
from evenflow.server.engine.app import App
from evenflow.server.models.builtin import build_mlp
from tests.integration.inprocess import running_app

# One event loop for the module: the tests that only call the server share one per mode
# (starting one costs seconds with worker or front-end processes); the statistics test, which
# reads a model's counters from zero, and the stream test start their own.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("server_mode"),
              pytest.mark.asyncio(loop_scope="module")]


def mlp_reference(x: np.ndarray) -> np.ndarray:
    """The model called directly, one thread like the server's worker."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            return build_mlp().module(torch.from_numpy(x.copy())).numpy()
    finally:
        torch.set_num_threads(threads)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(server_mode: str) -> AsyncIterator[tuple[App, str]]:
    """``mlp`` and ``t`` (two inputs), shared by the module's tests in this mode."""
    async with running_app((("mlp", "mlp"), ("t", "tests.fixture_models:two_inputs"))) as app:
        yield app


@pytest.mark.parametrize("batch", [1, 8])
async def test_mlp_equals_direct_call_bit_for_bit(served: tuple[App, str], batch: int) -> None:
    x = np.random.default_rng(batch).standard_normal((batch, 256)).astype(np.float32)
    async with AsyncClient(served[1]) as client:
        assert await client.server_ready()
        assert await client.model_ready("mlp")
        y = (await client.infer("mlp", {"x": x}, timeout_s=10))["y"]
        torch_y = (await client.infer("mlp", {"x": torch.from_numpy(x)}, timeout_s=10))["y"]
    assert y.shape == (batch, 256) and y.dtype == np.float32
    np.testing.assert_array_equal(y, mlp_reference(x))
    np.testing.assert_array_equal(torch_y, y)


async def test_two_inputs_and_requested_outputs(served: tuple[App, str]) -> None:
    a = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    b = np.array([[10, -20, 30], [0, 1, -1]], np.int64)
    async with AsyncClient(served[1]) as client:
        both = await client.infer("t", {"a": a, "b": b})
        only_flag = await client.infer("t", {"a": a, "b": b}, outputs=["flag"])
    np.testing.assert_array_equal(both["sum"], a + b)
    np.testing.assert_array_equal(both["flag"], b > 0)
    assert list(only_flag) == ["flag"]


async def test_concurrent_requests_are_batched_and_answered_correctly(
        served: tuple[App, str]) -> None:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 256)).astype(np.float32) for _ in range(64)]
    app, url = served
    counters = app.models.get("mlp").balancer.counters  # type: ignore[union-attr]
    # The server is shared: count this test's requests and batches only.
    requests_before, batches_before = counters.inference_count, counters.execution_count
    async with AsyncClient(url) as client:
        ys = await asyncio.gather(*(client.infer("mlp", {"x": x}) for x in xs))
    requests = counters.inference_count - requests_before
    batches = counters.execution_count - batches_before
    expected = mlp_reference(np.concatenate(xs))
    np.testing.assert_allclose(np.concatenate([y["y"] for y in ys]), expected, rtol=1e-5,
                               atol=1e-6)
    assert requests == 64
    assert batches < requests  # requests were merged into batches


async def test_metadata_config_statistics_and_index() -> None:
    async with running_app() as (_, url):
        channel = grpc.aio.insecure_channel(url)
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        meta = await stub.ServerMetadata(pb.ServerMetadataRequest())
        assert meta.name == "evenflow" and "statistics" in meta.extensions
        model = await stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp"))
        assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [
            ("x", "FP32", [-1, 256])]
        config = (await stub.ModelConfig(pb.ModelConfigRequest(name="mlp"))).config
        assert config.max_batch_size == 64
        assert list(config.input[0].dims) == [256]
        assert config.input[0].data_type == mc.TYPE_FP32
        batching = config.dynamic_batching
        assert (batching.priority_levels, batching.default_priority_level) == (1, 1)
        await stub.ModelInfer(pb.ModelInferRequest(
            model_name="mlp", inputs=[pb.ModelInferRequest.InferInputTensor(
                name="x", datatype="FP32", shape=[2, 256])], raw_input_contents=[bytes(2048)]))
        stats = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="mlp"))).model_stats[0]
        assert stats.inference_count == 2 and stats.execution_count == 1
        assert stats.inference_stats.success.count == 1
        assert stats.inference_stats.compute_infer.ns > 0
        assert [b.batch_size for b in stats.batch_stats] == [2]
        index = await stub.RepositoryIndex(pb.RepositoryIndexRequest())
        assert [(m.name, m.state) for m in index.models] == [("mlp", "READY")]
        await channel.close()


async def test_stream_infer_answers_every_request_and_reports_errors_in_band() -> None:
    x = np.ones((1, 256), np.float32)
    # Its own server: on one that has learnt its batch times from earlier tests, the two good
    # requests may share a batch, and a batch of two is not bit for bit two batches of one.
    async with running_app() as (_, url), AsyncClient(url) as client:
        inputs = [{"x": x}, {"x": np.ones((1, 255), np.float32)}, {"x": x * 2}]
        results = [r async for r in client.stream_infer("mlp", inputs, timeout_s=10)]
    by_id = {r.request_id: r for r in results}
    assert sorted(by_id) == ["0", "1", "2"]
    assert by_id["1"].error is not None and "INVALID_ARGUMENT" in str(by_id["1"].error)
    np.testing.assert_array_equal(by_id["0"].outputs["y"], mlp_reference(x))  # type: ignore[index]
    np.testing.assert_array_equal(by_id["2"].outputs["y"], mlp_reference(x * 2))  # type: ignore[index]


async def test_health_and_reflection(served: tuple[App, str]) -> None:
    channel = grpc.aio.insecure_channel(served[1])
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "inference.GRPCInferenceService"):
        status = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)

    async def requests():  # type: ignore[no-untyped-def]
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    names = []
    async for response in reflection.ServerReflectionInfo(requests()):
        names = [s.name for s in response.list_services_response.service]
    assert "inference.GRPCInferenceService" in names
    assert "evenflow.v1.EvenflowStats" in names
    await channel.close()
