"""Pipelined replicas end to end: exact outputs, per-micro-batch failure, re-partitioning."""

from __future__ import annotations

import asyncio
import math

import grpc
import numpy as np
import pytest
import torch

from evenflow.balancer import BalancerConfig, Job
from evenflow.client import AsyncClient, ServerInternalError
from evenflow.proto import evenflow_pb2, evenflow_pb2_grpc
from evenflow.server.config.server_config import PipelineConfig, ServerConfig
from evenflow.server.engine.app import App
from evenflow.server.models.builtin import build_encoder, build_mlp, build_sim_layers
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.pipeline.worker import PipelineWorker

pytestmark = pytest.mark.timeout(90)


async def pipelined_app(models: tuple[tuple[str, str], ...]) -> App:
    app = App(ServerConfig(http_port=None, port=0, models=models, devices="cpu:0,cpu:1",
                           pipeline=PipelineConfig(stages=2),
                           balancer=BalancerConfig(max_wait_s=0.0)))
    await app.start()
    return app


def reference(module: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            return module(torch.from_numpy(x.copy())).numpy()
    finally:
        torch.set_num_threads(threads)


async def test_pipelined_mlp_and_encoder_equal_the_unsplit_models_bit_for_bit() -> None:
    app = await pipelined_app((("mlp", "mlp"), ("encoder", "encoder")))
    try:
        async with AsyncClient(f"127.0.0.1:{app.port}") as client:
            for name, build in (("mlp", build_mlp), ("encoder", build_encoder)):
                definition = build()
                for batch in (1, 8):
                    shape = (batch, *definition.inputs[0].shape[1:])
                    x = np.random.default_rng(batch).standard_normal(shape).astype(np.float32)
                    y = (await client.infer(name, {"x": x}, timeout_s=30))["y"]
                    np.testing.assert_array_equal(y, reference(definition.module, x),
                                                  err_msg=f"{name} batch {batch}")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
            stats = await evenflow_pb2_grpc.EvenflowStatsStub(channel).GetStats(
                evenflow_pb2.GetStatsRequest(model_name="mlp"))
        replica = stats.models[0].replicas[0]
        assert list(replica.devices) == ["cpu0", "cpu1"]
        assert [s.device for s in replica.stages] == ["cpu0", "cpu1"]
        assert replica.stages[0].first_layer == 0
        assert replica.stages[1].last_layer == 6  # mlp: 4 Linear + 3 GELU
        assert replica.stages[0].last_layer + 1 == replica.stages[1].first_layer
    finally:
        await app.stop(grace_s=5)


async def test_a_failing_micro_batch_fails_only_its_requests() -> None:
    app = await pipelined_app((("chain", "tests.fixture_models:failing_chain"),))
    try:
        async with AsyncClient(f"127.0.0.1:{app.port}") as client:
            with pytest.raises(ServerInternalError, match="stage 1 raised ValueError"):
                await client.infer("chain", {"x": np.full((1, 4), 13.0, np.float32)})
            ok = await client.infer("chain", {"x": np.ones((2, 4), np.float32)})
        np.testing.assert_array_equal(ok["y"], np.full((2, 4), 2.0, np.float32))
    finally:
        await app.stop(grace_s=5)


async def test_slowed_device_triggers_repartition_and_no_batch_is_lost() -> None:
    definition = build_sim_layers((1.0, 1.0, 1.0, 1.0, 1.0, 1.0))
    worker = PipelineWorker(model_name="s", definition=definition,
                            devices=parse_devices("sim:1,sim:1"))
    assert worker.plan.bounds == (0, 3, 6)
    loop = asyncio.get_running_loop()
    x = np.zeros((1, 256), np.float32)

    def job(i: int) -> Job:
        return Job([x + i], 1, 0.0, math.inf, loop.create_future())

    try:
        assert await worker.set_device_speed("sim1", 0.25) == 1.0
        answered = 0
        for round_ in range(40):  # bounded: re-planning needs ~12 batches of evidence
            results = await asyncio.gather(*(worker.run([job(round_ * 3 + k)]) for k in range(3)))
            for k, result in enumerate(results):
                np.testing.assert_array_equal(result.outputs[0][0], x + round_ * 3 + k)
            answered += len(results)
            if worker.num_repartitions:
                break
        assert worker.num_repartitions == 1
        # Layers moved off the slow device: 1 layer at speed 0.25 vs 5 at speed 1 is best.
        assert worker.plan.bounds == (0, 5, 6)
        more = await asyncio.gather(*(worker.run([job(1000 + k)]) for k in range(4)))
        assert len(more) == 4 and answered >= 12
    finally:
        await worker.close()
