"""Pipeline stages own their layers: the definition's module is never moved or cast (by building
replicas, by profiling, by re-partitioning), and each layer is profiled where it would run."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch

from evenflow.balancer import Job
from evenflow.server.models.builtin import build_mlp
from evenflow.server.models.sim import SleepIdentity
from evenflow.server.models.spec import ModelDefinition, SimProfile, TensorSpec
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.pipeline.layers import layer_costs_s, placed, split_into_layers
from evenflow.server.workers.pipeline.worker import PipelineWorker

pytestmark = pytest.mark.timeout(90)

WIDTH = 8


def storages(module: torch.nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr()
            for t in (*module.parameters(), *module.buffers()) if t.device.type != "meta"}


def snapshot(module: torch.nn.Module) -> list[tuple[int, torch.device, torch.dtype, torch.Tensor]]:
    return [(t.untyped_storage().data_ptr(), t.device, t.dtype, t.detach().clone())
            for t in (*module.parameters(), *module.buffers())]


def assert_untouched(module: torch.nn.Module,
                     before: list[tuple[int, torch.device, torch.dtype, torch.Tensor]]) -> None:
    after = snapshot(module)
    assert len(after) == len(before)
    for (ptr, device, dtype, value), (ptr2, device2, dtype2, value2) in zip(before, after,
                                                                            strict=True):
        assert (ptr2, device2, dtype2) == (ptr, device, dtype)
        assert torch.equal(value2, value)


def job(x: np.ndarray) -> Job:
    return Job([x], x.shape[0], 0.0, math.inf, asyncio.get_running_loop().create_future())


def reference(module: torch.nn.Module, x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what a stage thread runs with: the same kernels, bit for bit
    try:
        with torch.inference_mode():
            out = placed(module, torch.device("cpu"), dtype)(torch.from_numpy(x).to(dtype))
        return out.to(torch.float32).numpy()
    finally:
        torch.set_num_threads(threads)


async def test_two_replicas_of_one_definition_own_their_weights_and_leave_it_untouched() -> None:
    definition = build_mlp()
    before = snapshot(definition.module)
    float32 = PipelineWorker(model_name="mlp", definition=definition,
                             devices=parse_devices("cpu:0,cpu:1"))
    float64 = PipelineWorker(model_name="mlp", definition=definition,
                             devices=parse_devices("cpu:0,cpu:1"), dtype=torch.float64)
    try:
        assert_untouched(definition.module, before)
        own = storages(definition.module)
        for stage in float64.stage_modules:
            # Another dtype than the definition's: a copy of its own, in that dtype.
            assert {p.dtype for p in stage.parameters()} == {torch.float64}
            assert not storages(stage) & own
        for stage in float32.stage_modules:
            assert {p.dtype for p in stage.parameters()} == {torch.float32}
            assert not storages(stage) & storages(float64.stage_modules[0])
            assert not storages(stage) & storages(float64.stage_modules[1])
        x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
        got32, got64 = await asyncio.gather(float32.run([job(x)]), float64.run([job(x)]))
        np.testing.assert_array_equal(got32.outputs[0][0],
                                      reference(definition.module, x, torch.float32))
        np.testing.assert_allclose(got64.outputs[0][0],
                                   reference(definition.module, x, torch.float64),
                                   rtol=1e-6, atol=1e-7)
        assert_untouched(definition.module, before)
    finally:
        await float32.close()
        await float64.close()


class ScaledSleep(torch.nn.Module):
    """``x * scale`` (scale = 1, so exact) costing what the ``sim`` model's layer costs
    (``SleepIdentity``: its profile at the thread's device speed): a layer with weights whose
    cost the partitioner knows, so drift can be provoked."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(WIDTH))
        self.cost = SleepIdentity(SimProfile(ms, 0.0))

    @property
    def sim_profile(self) -> SimProfile:
        return self.cost.sim_profile

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cost(x) * self.scale


def scaled_sleeps(count: int, ms: float) -> ModelDefinition:
    return ModelDefinition(
        module=torch.nn.Sequential(*(ScaledSleep(ms) for _ in range(count))).eval(),
        inputs=[TensorSpec("x", "FP32", (-1, WIDTH))],
        outputs=[TensorSpec("y", "FP32", (-1, WIDTH))], traceable=False)


def layer_storages(worker: PipelineWorker) -> list[dict[int, int]]:
    """Per stage: layer index -> the storage of that stage's copy of the layer's weight."""
    out = []
    for stage, first in zip(worker.stage_modules, worker.plan.bounds, strict=False):
        out.append({first + k: layer.scale.untyped_storage().data_ptr()
                    for k, layer in enumerate(stage.children())})
    return out


async def test_repartition_moves_the_stages_copies_not_the_definitions_layers() -> None:
    definition = scaled_sleeps(6, 1.0)
    before = snapshot(definition.module)
    worker = PipelineWorker(model_name="s", definition=definition,
                            devices=parse_devices("sim:1,sim:1"), dtype=torch.float64)
    x = np.arange(WIDTH, dtype=np.float32)[None, :]
    try:
        assert worker.plan.bounds == (0, 3, 6)
        placed_before = layer_storages(worker)
        assert_untouched(definition.module, before)
        await worker.set_device_speed("sim1", 0.25)
        for _ in range(40):  # bounded: re-planning needs ~12 batches of evidence
            results = await asyncio.gather(*(worker.run([job(x + k)]) for k in range(3)))
            for k, result in enumerate(results):
                np.testing.assert_array_equal(result.outputs[0][0], x + k)
            if worker.num_repartitions:
                break
        assert worker.num_repartitions == 1
        assert worker.plan.bounds == (0, 5, 6)
        assert_untouched(definition.module, before)
        placed_after = layer_storages(worker)
        # Both stages are the CPU in float64: layers 3 and 4 changed stage, not device, so the
        # copies they already had moved with them; no two stages hold one copy.
        assert placed_after[0] == {**placed_before[0], 3: placed_before[1][3],
                                   4: placed_before[1][4]}
        assert placed_after[1] == {5: placed_before[1][5]}
        assert not storages(definition.module) & {*placed_after[0].values(),
                                                  *placed_after[1].values()}
        for stage in worker.stage_modules:
            assert {p.dtype for p in stage.parameters()} == {torch.float64}
        np.testing.assert_array_equal((await worker.run([job(x)])).outputs[0][0], x)
    finally:
        await worker.close()


def test_placed_shares_only_what_would_not_change_and_is_not_training() -> None:
    cpu = torch.device("cpu")
    layer = torch.nn.Linear(3, 3).eval()
    assert placed(layer, cpu, torch.float32) is layer
    for other in (placed(layer, cpu, torch.float64), placed(layer.train(), cpu, torch.float32),
                  placed(layer, torch.device("meta"), torch.float32)):
        assert other is not layer
        assert not storages(other) & storages(layer)
    assert layer.weight.dtype == torch.float32 and layer.weight.device == cpu


class ChecksPlacement(torch.nn.Module):
    """Raises unless its input has its weight's device and dtype; counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(WIDTH))
        self.seen: list[tuple[torch.device, torch.dtype]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((x.device, x.dtype))
        if (x.device, x.dtype) != (self.weight.device, self.weight.dtype):
            raise AssertionError(f"input on {x.device}/{x.dtype}, weight on "
                                 f"{self.weight.device}/{self.weight.dtype}")
        return x * self.weight


def checked_chain() -> ModelDefinition:
    return ModelDefinition(module=torch.nn.Sequential(ChecksPlacement(), ChecksPlacement()),
                           inputs=[TensorSpec("x", "FP32", (-1, WIDTH))],
                           outputs=[TensorSpec("y", "FP32", (-1, WIDTH))], traceable=False)


def test_profiling_runs_each_layer_on_the_device_and_dtype_it_profiles() -> None:
    definition = checked_chain()
    before = snapshot(definition.module)
    layers = split_into_layers(definition.module)
    # meta stands for an accelerator: the layers start on the CPU, the input is made on meta.
    devices = [torch.device("cpu"), torch.device("meta"), torch.device("cpu")]
    costs = layer_costs_s(definition, layers, devices, [torch.float64] * len(devices), batch=2,
                          repeats=1)
    assert len(costs) == 3 and all(len(row) == 2 and min(row) >= 0 for row in costs)
    assert costs[0] == costs[2]  # one device, measured once
    assert_untouched(definition.module, before)


def test_a_float64_pipeline_profiles_and_runs_its_layers_in_float64() -> None:
    definition = checked_chain()
    before = snapshot(definition.module)
    worker = PipelineWorker(model_name="c", definition=definition,
                            devices=parse_devices("cpu:0,cpu:1"), dtype=torch.float64)
    asyncio.run(worker.close())
    assert_untouched(definition.module, before)
    assert {p.dtype for stage in worker.stage_modules for p in stage.parameters()} == {
        torch.float64}


def test_each_stage_is_planned_with_its_own_devices_costs() -> None:
    definition = scaled_sleeps(4, 2.0)
    worker = PipelineWorker(model_name="s", definition=definition,
                            devices=parse_devices("sim:1,sim:0.5"))
    asyncio.run(worker.close())
    assert worker.stage_layer_costs_s == [[0.002] * 4, [0.004] * 4]
    assert worker.plan.bounds == (0, 3, 4)  # 3 layers at 2 ms vs 1 at 4 ms
