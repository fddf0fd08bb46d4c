"""Pipelines across the CPU and a GPU (skipped without one): built (profiled, traced) with the
first stage on either side, answering the model's own answers with many micro-batches in
flight, so a hand-off that lets a stage read activations before they land would show; and the
definition's module left on the CPU in float32 however many replicas are built from it."""

from __future__ import annotations

import asyncio
import itertools
import math

import numpy as np
import pytest
import torch

from evenflow.balancer import Job
from evenflow.server.config.server_config import PipelineConfig
from evenflow.server.models.builtin import build_encoder, build_mlp
from evenflow.server.models.repository import BuiltinOptions
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.pipeline.layers import layer_costs_s, split_into_layers
from evenflow.server.workers.pipeline.worker import PipelineWorker
from evenflow.server.workers.replica_module import copied_to
from evenflow.server.workers.thread_host import build_thread_worker
from evenflow.server.workers.worker_spec import WorkerSpec

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-3}
BATCH_SIZES = (1, 7, 64, 256, 512)  # large ones make copies long enough for a race to show
IN_FLIGHT = 40


def reference(definition: ModelDefinition, x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The unsplit model on the CPU, in ``dtype`` (a copy: the definition stays as it is)."""
    module = copied_to(definition.module, torch.device("cpu"), dtype)
    with torch.inference_mode():
        return module(torch.from_numpy(x).to(dtype)).to(torch.float32).numpy()


def job(x: np.ndarray) -> Job:
    return Job([x], x.shape[0], 0.0, math.inf, asyncio.get_running_loop().create_future())


def inputs(definition: ModelDefinition, count: int, seed: int,
           sizes: tuple[int, ...] = BATCH_SIZES) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = definition.inputs[0].shape[1:]
    return [rng.standard_normal((sizes[k % len(sizes)], *shape)).astype(np.float32)
            for k in range(count)]


async def answers_under_load(worker: PipelineWorker, xs: list[np.ndarray]) -> list[np.ndarray]:
    results = await asyncio.gather(*(worker.run([job(x)]) for x in xs))
    return [result.outputs[0][0] for result in results]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("devices", ["cpu,cuda:0", "cuda:0,cpu"])
async def test_cpu_cuda_pipelines_answer_like_the_model_under_load(devices: str,
                                                                   dtype: torch.dtype) -> None:
    definition = build_mlp()
    worker = PipelineWorker(model_name="mlp", definition=definition,
                            devices=parse_devices(devices), dtype=dtype)
    xs = inputs(definition, IN_FLIGHT, seed=len(devices))
    try:
        got = await answers_under_load(worker, xs)
        got_again = await answers_under_load(worker, xs[::-1])  # other neighbours in flight
    finally:
        await worker.close()
    tolerance = TOLERANCE[dtype]
    for k, (x, y, y_again) in enumerate(zip(xs, got, got_again[::-1], strict=True)):
        expected = reference(definition, x, dtype)
        np.testing.assert_allclose(y, expected, rtol=tolerance, atol=tolerance,
                                   err_msg=f"{devices} {dtype} request {k}")
        np.testing.assert_allclose(y_again, expected, rtol=tolerance, atol=tolerance,
                                   err_msg=f"{devices} {dtype} request {k}, second pass")


async def test_replicas_of_one_definition_on_cuda_leave_it_on_the_cpu() -> None:
    definition = build_encoder()
    before = [(t.untyped_storage().data_ptr(), t.detach().clone())
              for t in definition.module.parameters()]
    float32 = PipelineWorker(model_name="encoder", definition=definition,
                             devices=parse_devices("cuda:0,cpu"))
    bfloat16 = PipelineWorker(model_name="encoder", definition=definition,
                              devices=parse_devices("cpu,cuda:0"), dtype=torch.bfloat16)
    try:
        for parameter, (ptr, value) in zip(definition.module.parameters(), before, strict=True):
            assert parameter.device.type == "cpu" and parameter.dtype == torch.float32
            assert parameter.untyped_storage().data_ptr() == ptr
            assert torch.equal(parameter.detach(), value)
        cuda_stages = [float32.stage_modules[0], bfloat16.stage_modules[1]]
        assert all(p.device.type == "cuda" for m in cuda_stages for p in m.parameters())
        assert {p.dtype for p in bfloat16.stage_modules[1].parameters()} == {torch.bfloat16}
        xs = inputs(definition, 12, seed=3, sizes=(1, 5, 32))
        got32, got16 = await asyncio.gather(answers_under_load(float32, xs),
                                            answers_under_load(bfloat16, xs))
    finally:
        await float32.close()
        await bfloat16.close()
    for x, y32, y16 in zip(xs, got32, got16, strict=True):
        np.testing.assert_allclose(y32, reference(definition, x, torch.float32),
                                   rtol=1e-4, atol=1e-4)
        # bf16 encoder outputs reach ~4 and differ from float32 by up to ~0.03 on the CPU;
        # this checks the bf16 replica computes the model, not the GPU's bf16 precision.
        np.testing.assert_allclose(y16, reference(definition, x, torch.bfloat16),
                                   rtol=5e-2, atol=1e-1)


@pytest.mark.parametrize("devices", ["cpu,cuda:0", "cuda:0,cpu"])
async def test_a_mixed_pipeline_runs_its_gpu_stage_in_the_dtype_and_its_cpu_stage_in_float32(
        devices: str) -> None:
    """Built as the server builds it (``--dtype bfloat16``): each stage in its device's dtype,
    not the first device's, the activations cast at each hand-off."""
    definition = build_mlp()
    group = tuple(parse_devices(devices))
    spec = WorkerSpec(model_name="mlp", source="mlp", devices=group, builtins=BuiltinOptions(),
                      pipeline=PipelineConfig(stages=2), dtype="bfloat16")
    worker = build_thread_worker(spec, definition)
    assert isinstance(worker, PipelineWorker)
    dtypes = [torch.bfloat16 if d.kind == "cuda" else torch.float32 for d in group]
    xs = inputs(definition, 12, seed=9)
    try:
        for stage, device, dtype in zip(worker.stage_modules, group, dtypes, strict=True):
            assert {(p.device.type, p.dtype) for p in stage.parameters()} == {(device.kind,
                                                                              dtype)}
        got = await answers_under_load(worker, xs)
    finally:
        await worker.close()
    layers = split_into_layers(definition.module)
    for k, (x, y) in enumerate(zip(xs, got, strict=True)):
        out = torch.from_numpy(x)
        with torch.inference_mode():  # the model cut where the worker cut it, on the CPU
            for (first, end), dtype in zip(itertools.pairwise(worker.plan.bounds), dtypes,
                                           strict=True):
                part = copied_to(torch.nn.Sequential(*layers[first:end]),
                                 torch.device("cpu"), dtype)
                out = part(out.to(dtype))
        np.testing.assert_allclose(y, out.to(torch.float32).numpy(),
                                   rtol=TOLERANCE[torch.bfloat16],
                                   atol=TOLERANCE[torch.bfloat16], err_msg=f"request {k}")


def test_each_device_profiles_its_own_row() -> None:
    definition = build_mlp()
    worker = PipelineWorker(model_name="mlp", definition=definition,
                            devices=parse_devices("cpu,cuda:0"))
    asyncio.run(worker.close())
    cpu_row, cuda_row = worker.stage_layer_costs_s
    assert len(cpu_row) == len(cuda_row) == 7
    assert cpu_row != cuda_row  # measured on each device, not copied from the first


def test_profiling_waits_for_its_own_work_not_other_replicas_batches() -> None:
    """Another replica's long batch, queued on its own (pool, non-blocking) stream: the layer
    costs are the layers', not the wait for that batch, as a device-wide sync made them."""
    device = torch.device("cuda:0")
    definition = build_mlp()
    layers = split_into_layers(definition.module)
    busy = torch.randn(4096, 4096, device=device)
    other = torch.cuda.Stream(device)
    other.wait_stream(torch.cuda.current_stream(device))  # ``busy`` was made on this one
    started, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(other):
        started.record(other)
        for _ in range(200):  # a batch of several hundred ms on any current GPU
            busy = busy @ busy
            busy = busy / busy.norm()
        ended.record(other)
    costs = layer_costs_s(definition, layers, [device], [torch.float32], batch=8, repeats=1)
    ended.synchronize()
    busy_s = started.elapsed_time(ended) / 1000.0
    assert sum(costs[0]) < busy_s / 4, (costs, busy_s)
