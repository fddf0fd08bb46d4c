"""What a pipeline stage raises is classified as a single-device worker's is: a sticky CUDA error
(a device-side assert) loses the device, so the replica leaves routing instead of failing every
later batch; out of memory, however torch wrapped it, splits the batch; anything else fails
that batch. CUDA's errors are raised by the test, so this runs without a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from evenflow.balancer import BatchFailed
from evenflow.balancer.errors import DeviceLost, EvenflowError, OutOfMemory
from evenflow.server.models.spec import ModelDefinition, TensorSpec
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.pipeline.worker import PipelineWorker
from tests.unit.test_torch_worker_errors import error_of_one_batch

pytestmark = pytest.mark.timeout(60)

DEVICE_ASSERT = ("CUDA error: device-side assert triggered\nCUDA kernel errors might be "
                 "asynchronously reported at some other API call")
ILLEGAL_ACCESS = "CUDA error: an illegal memory access was encountered"
INTERPRETED_OOM = ("The following operation failed in the TorchScript interpreter.\n"
                   "Traceback of TorchScript (most recent call last):\n"
                   "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")


class FailsOnCopyOut(torch.Tensor):
    """An output whose copy back to the host raises what CUDA reports late: an asynchronous
    error of the last stage's kernels surfaces at the next synchronizing call."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func in (torch.Tensor.cpu, torch.Tensor.to):
            raise RuntimeError(ILLEGAL_ACCESS)
        return super().__torch_function__(func, types, args, kwargs or {})


class Fails(torch.nn.Module):
    """Passes its input on until told to raise ``error`` (after the pipeline is built: building
    profiles the layers), or with ``on_copy_out``, to return an output that raises later."""

    def __init__(self) -> None:
        super().__init__()
        self.error: Exception | None = None
        self.on_copy_out = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.error is not None:
            raise self.error
        return x.as_subclass(FailsOnCopyOut) if self.on_copy_out else x


async def outcome(arm: Any) -> EvenflowError:
    """What a batch through a two-stage CPU pipeline raises once ``arm(fails)`` has set up the
    second stage's layer (which the stage shares: it runs unchanged on the CPU)."""
    fails = Fails()
    definition = ModelDefinition(module=torch.nn.Sequential(torch.nn.Linear(4, 4), fails).eval(),
                                 inputs=[TensorSpec("x", "FP32", (-1, 4))],
                                 outputs=[TensorSpec("y", "FP32", (-1, 4))], traceable=False)
    worker = PipelineWorker(model_name="p", definition=definition,
                            devices=parse_devices("cpu:0,cpu:1"))
    arm(fails)
    return await error_of_one_batch(worker)


def raising(error: Exception) -> Any:
    def arm(fails: Fails) -> None:
        fails.error = error
    return arm


async def test_a_device_side_assert_in_a_stage_loses_the_device() -> None:
    error = await outcome(raising(RuntimeError(DEVICE_ASSERT)))
    assert type(error) is DeviceLost
    assert "cpu1 (stage 1)" in str(error) and "device-side assert triggered" in str(error)


async def test_a_sticky_error_surfacing_at_the_copy_out_loses_the_device() -> None:
    def arm(fails: Fails) -> None:
        fails.on_copy_out = True

    error = await outcome(arm)
    assert type(error) is DeviceLost
    assert "cpu1" in str(error) and ILLEGAL_ACCESS in str(error)


async def test_a_stage_out_of_memory_through_the_torchscript_interpreter_is_out_of_memory() -> None:
    error = await outcome(raising(RuntimeError(INTERPRETED_OOM)))
    assert type(error) is OutOfMemory
    assert "CUDA out of memory" in str(error)


async def test_what_else_a_stage_raises_fails_the_batch() -> None:
    error = await outcome(raising(ValueError("bad input")))
    assert type(error) is BatchFailed
    assert str(error) == "stage 1 raised ValueError: bad input"
