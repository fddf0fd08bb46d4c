"""CUDA workers and pipelines (skipped without a GPU)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from evenflow.balancer import Job
from evenflow.server.models.builtin import build_mlp
from evenflow.server.pipeline.worker import PipelineWorker
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.torch_worker import TorchWorker

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


def jobs(x: np.ndarray) -> list[Job]:
    return [Job([x], x.shape[0], 0.0, math.inf, asyncio.get_running_loop().create_future())]


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
async def test_cuda_worker_matches_cpu(dtype: torch.dtype, tolerance: float) -> None:
    definition = build_mlp()
    x = np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32)
    with torch.inference_mode():
        expected = definition.module(torch.from_numpy(x.copy())).numpy()
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
