"""What a TorchWorker's batch raises besides running out of memory: a sticky CUDA failure is
DeviceLost (the replica leaves routing), anything else the model raises fails its batch."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch

from evenflow.balancer import BatchFailed, Job, Worker
from evenflow.balancer.errors import DeviceLost, EvenflowError
from evenflow.server.models.spec import ModelDefinition, TensorSpec
from evenflow.server.workers.devices import DeviceSpec
from evenflow.server.workers.torch_worker import TorchWorker

pytestmark = pytest.mark.timeout(30)


class Raises(torch.nn.Module):
    def __init__(self, error: Exception | None) -> None:
        super().__init__()
        self.error = error

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.error is not None:
            raise self.error
        return x, x  # one output more than the spec lists


async def run_once(error: Exception | None) -> BaseException:
    definition = ModelDefinition(module=Raises(error), inputs=[TensorSpec("x", "FP32", (-1, 4))],
                                 outputs=[TensorSpec("y", "FP32", (-1, 4))], traceable=False)
    return await error_of_one_batch(TorchWorker(model_name="raises", definition=definition,
                                                device=DeviceSpec("cpu", 0, "cpu:0")))


async def error_of_one_batch(worker: Worker) -> EvenflowError:
    """What ``worker`` raises running one batch of two rows of ``[-1, 4]``; it is closed."""
    x = np.ones((2, 4), dtype=np.float32)
    job = Job([x], 2, 0.0, math.inf, asyncio.get_running_loop().create_future())
    try:
        with pytest.raises(EvenflowError) as info:
            await worker.run([job])
    finally:
        await worker.close()
    return info.value


async def test_a_sticky_cuda_error_loses_the_device() -> None:
    error = await run_once(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert isinstance(error, DeviceLost)
    assert "device lost on cpu" in str(error)
    # Not chained: the model's traceback would hold the batch's device tensors.
    assert error.__cause__ is None and error.__context__ is None


async def test_what_else_the_model_raises_fails_the_batch() -> None:
    error = await run_once(ValueError("bad input"))
    assert type(error) is BatchFailed
    assert str(error) == "model raised ValueError: bad input"
    assert error.__cause__ is None and error.__context__ is None


async def test_an_evenflow_error_passes_unchanged() -> None:
    error = await run_once(None)
    assert type(error) is BatchFailed
    assert str(error) == "model returned 2 outputs; spec lists 1"
    assert error.__cause__ is None
