"""CUDA workers and pipelines (skipped without a GPU)."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from evenflow.balancer import BalancerConfig, Job, ModelBalancer
from evenflow.server.models.builtin import build_mlp
from evenflow.server.models.exported import load_exported
from evenflow.server.models.repository import load_torchscript
from evenflow.server.models.spec import ModelDefinition, TensorSpec
from evenflow.server.workers.cuda_sync import wait_for_stream
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.pipeline.worker import PipelineWorker
from evenflow.server.workers.torch_worker import TorchWorker
from tests.exported_programs import export_with_positions

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


def jobs(x: np.ndarray) -> list[Job]:
    return [Job([x], x.shape[0], 0.0, math.inf, asyncio.get_running_loop().create_future())]


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-4), (torch.bfloat16, 5e-3)])
async def test_cuda_worker_matches_cpu(dtype: torch.dtype, tolerance: float) -> None:
    """Against the same module run on the CPU in the same dtype: a wrong cast (weights, inputs
    or outputs in another precision) is off by far more than bf16's rounding."""
    definition = build_mlp()
    x = np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32)
    reference = copy.deepcopy(definition.module).to(dtype)
    with torch.inference_mode():
        expected = reference(torch.from_numpy(x.copy()).to(dtype)).float().numpy()
    worker = TorchWorker(model_name="mlp", definition=build_mlp(),
                         device=parse_devices("cuda:0")[0], dtype=dtype)
    try:
        result = await worker.run(jobs(x))
    finally:
        await worker.close()
    y = result.outputs[0][0]
    assert y.dtype == np.float32  # the wire datatype, whatever the compute precision
    np.testing.assert_allclose(y, expected, rtol=tolerance, atol=tolerance)


async def test_cuda_pipeline_moves_activations_between_stages() -> None:
    count = torch.cuda.device_count()
    devices = "cuda:0,cuda:1" if count > 1 else "cuda:0,cpu:0"
    definition = build_mlp()
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    with torch.inference_mode():
        expected = definition.module(torch.from_numpy(x.copy())).numpy()
    worker = PipelineWorker(model_name="mlp", definition=build_mlp(),
                            devices=parse_devices(devices))
    try:
        result = await worker.run(jobs(x))
    finally:
        await worker.close()
    np.testing.assert_allclose(result.outputs[0][0], expected, rtol=1e-4, atol=1e-4)


async def test_exported_program_on_cuda_is_bit_exact(tmp_path: Path) -> None:
    from evenflow.server.models.exported import load_exported
    from tests.exported_programs import export_two_heads

    path = tmp_path / "heads.pt2"
    export_two_heads(path)
    definition = load_exported(path)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    ids = rng.integers(0, 16, (16, 3)).astype(np.int64)
    direct = torch.export.load(str(path)).module().to("cuda:0")
    with torch.inference_mode():
        want = direct(torch.from_numpy(x).cuda(), torch.from_numpy(ids).cuda())
    worker = TorchWorker(model_name="heads", definition=definition,
                         device=parse_devices("cuda:0")[0])
    job = Job([x, ids], 16, 0.0, math.inf, asyncio.get_running_loop().create_future())
    try:
        result = await worker.run([job])
    finally:
        await worker.close()
    for index, name in enumerate(("score", "norm")):
        np.testing.assert_array_equal(result.outputs[0][index], want[name].cpu().numpy())


async def test_replicas_on_two_devices_from_one_definition_each_answer() -> None:
    """``nn.Module.to`` moves in place: before each replica owned its module, building the
    second replica moved the first one's weights away and the first failed every batch."""
    second = "cuda:1" if torch.cuda.device_count() > 1 else "cpu:0"
    definition = build_mlp()
    x = np.random.default_rng(3).standard_normal((8, 256)).astype(np.float32)
    with torch.inference_mode():
        expected = definition.module(torch.from_numpy(x.copy())).numpy()
    workers = [TorchWorker(model_name="mlp", definition=definition, device=device)
               for device in parse_devices(f"cuda:0,{second}")]
    try:
        results = [await worker.run(jobs(x)) for worker in workers]
    finally:
        for worker in workers:
            await worker.close()
    assert {p.device for p in definition.module.parameters()} == {torch.device("cpu")}
    for result in results:
        np.testing.assert_allclose(result.outputs[0][0], expected, rtol=1e-4, atol=1e-4)


async def test_an_exported_program_that_makes_tensors_runs_on_cuda(tmp_path: Path) -> None:
    """Its graph's ``arange(..., device=cpu)`` must be placed on the GPU with the weights."""
    path = tmp_path / "positions.pt2"
    eager = export_with_positions(path)
    x = np.random.default_rng(4).standard_normal((16, 8)).astype(np.float32)
    with torch.inference_mode():
        want = eager(torch.from_numpy(x)).numpy()
    worker = TorchWorker(model_name="positions", definition=load_exported(path),
                         device=parse_devices("cuda:0")[0])
    try:
        result = await worker.run(jobs(x))
    finally:
        await worker.close()
    np.testing.assert_allclose(result.outputs[0][0], want, rtol=1e-5, atol=1e-5)


class WithOffset(torch.nn.Module):
    """A plain tensor attribute: a trace keeps it as a constant, which ``.to`` does not move."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.offset = torch.arange(8, dtype=torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.offset


@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\..*deprecated:DeprecationWarning")
async def test_a_torchscript_file_with_constants_runs_on_cuda(tmp_path: Path) -> None:
    path = tmp_path / "offset.pt"
    eager = WithOffset().eval()
    torch.jit.trace(eager, (torch.ones(2, 8),)).save(str(path))
    spec = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 8]}]}
    path.with_name(path.name + ".json").write_text(json.dumps(spec))
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    with torch.inference_mode():
        want = eager(torch.from_numpy(x)).numpy()
    worker = TorchWorker(model_name="offset", definition=load_torchscript(path),
                         device=parse_devices("cuda:0")[0])
    try:
        result = await worker.run(jobs(x))
    finally:
        await worker.close()
    np.testing.assert_allclose(result.outputs[0][0], want, rtol=1e-5, atol=1e-5)


SPREAD = 16384  # each sample's activation: 256 x SPREAD float32 = 16 MiB
MiB = 1 << 20


class Spread(torch.nn.Module):
    """Output equals input, through an activation of 16 MiB per sample."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(-1).expand(-1, -1, SPREAD).contiguous().amax(-1)


@pytest.mark.parametrize("traceable", [False, True], ids=["eager", "traced"])
async def test_a_batch_that_does_not_fit_is_split_and_answered(traceable: bool) -> None:
    """64 samples need 1 GiB of activations under a 384 MiB limit: the balancer halves the
    batch until it fits, which works only if each failed attempt let go of its memory.
    Traced, the out-of-memory comes as the TorchScript interpreter's RuntimeError, not as
    torch.OutOfMemoryError: it must split the batch all the same."""
    definition = ModelDefinition(module=Spread(), inputs=[TensorSpec("x", "FP32", (-1, 256))],
                                 outputs=[TensorSpec("y", "FP32", (-1, 256))],
                                 traceable=traceable)
    worker = TorchWorker(model_name="spread", definition=definition,
                         device=parse_devices("cuda:0")[0])
    assert isinstance(worker._module, torch.jit.ScriptModule) is traceable
    balancer = ModelBalancer(model_name="spread", workers=[worker],
                             config=BalancerConfig(adaptive_batching=False, max_batch=64,
                                                   max_wait_s=0.0),
                             rng=random.Random(0))
    rng = np.random.default_rng(6)
    rows = [rng.standard_normal((4, 256)).astype(np.float32) for _ in range(16)]
    torch.cuda.empty_cache()
    total_bytes = torch.cuda.get_device_properties(0).total_memory
    limit_bytes = torch.cuda.memory_reserved(0) + 384 * MiB
    torch.cuda.set_per_process_memory_fraction(limit_bytes / total_bytes, 0)
    try:
        balancer.start()
        futures = [balancer.submit([x], 4) for x in rows]  # one batch of 64 samples
        answers = await asyncio.wait_for(asyncio.gather(*futures), timeout=60)
    finally:
        await balancer.close()
        await worker.close()
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
    for x, answer in zip(rows, answers, strict=True):
        np.testing.assert_array_equal(answer[0], x)
    assert balancer.replicas[0].controller.cap < 64


async def test_a_replica_reads_its_weights_only_once_they_are_written() -> None:
    """A bfloat16 replica of a model already on cuda:0: its weights are cast on the device, on
    the building thread's default stream, here queued behind half a second of GPU sleep. The
    worker's own stream is non-blocking, so nothing but the builder's wait orders its first
    batch after the cast; without it the batch reads weights not yet written."""
    definition = build_mlp()
    x = np.random.default_rng(7).standard_normal((8, 256)).astype(np.float32)
    reference = copy.deepcopy(definition.module).to(torch.bfloat16)
    with torch.inference_mode():
        expected = reference(torch.from_numpy(x.copy()).to(torch.bfloat16)).float().numpy()
    on_gpu = ModelDefinition(module=copy.deepcopy(definition.module).to("cuda:0"),
                             inputs=definition.inputs, outputs=definition.outputs,
                             traceable=False)  # tracing would wait for the cast itself
    torch.cuda.synchronize()
    clock_khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 1_500_000
    torch.cuda._sleep(int(0.5 * clock_khz * 1000))  # on the default stream, ahead of the cast
    worker = TorchWorker(model_name="mlp", definition=on_gpu,
                         device=parse_devices("cuda:0")[0], dtype=torch.bfloat16)
    try:
        result = await worker.run(jobs(x))
    finally:
        await worker.close()
    np.testing.assert_allclose(result.outputs[0][0], expected, rtol=5e-3, atol=5e-3)


def _wait_costs(wait: Callable[[torch.cuda.Stream], None]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) this thread spends in ``wait`` for ~0.3 s of GPU work."""
    stream = torch.cuda.Stream()
    clock_khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 1_500_000
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(0.3 * clock_khz * 1000))
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    wait(stream)
    return time.thread_time() - cpu0, time.perf_counter() - wall0


def test_waiting_for_the_gpu_leaves_the_cpu_idle() -> None:
    torch.cuda.synchronize()
    spin_cpu_s, spin_wall_s = _wait_costs(lambda stream: stream.synchronize())
    cpu_s, wall_s = _wait_costs(wait_for_stream)
    assert wall_s > 0.1, "the GPU finished too soon to measure the wait"
    if spin_cpu_s < 0.5 * spin_wall_s:
        pytest.skip("this host's CUDA schedule does not spin in Stream.synchronize")
    assert cpu_s < 0.25 * wall_s, f"{cpu_s:.3f} s of CPU in a {wall_s:.3f} s wait"


async def test_a_cuda_worker_measures_its_activation_peak_for_the_placement() -> None:
    """What ``--placement auto`` adds to a replica's parameters: nothing is known before a
    batch; a larger batch holds more; the batch's input on the device is part of it."""
    worker = TorchWorker(model_name="mlp", definition=build_mlp(),
                         device=parse_devices("cuda:0")[0])
    rng = np.random.default_rng(0)
    try:
        assert worker.status().activation_peak_bytes is None
        await worker.run(jobs(rng.standard_normal((8, 256)).astype(np.float32)))
        small = worker.status().activation_peak_bytes
        await worker.run(jobs(rng.standard_normal((4096, 256)).astype(np.float32)))
        large = worker.status().activation_peak_bytes
    finally:
        await worker.close()
    assert small is not None and small > 0
    assert large is not None and large > small
    assert large >= 4096 * 256 * 4
