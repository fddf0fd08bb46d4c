"""Out of memory anywhere in a batch (copy in, compute, copy out) is OutOfMemory, raised with
the batch's tensors already freed, so the balancer's split halves can use that memory."""

from __future__ import annotations

import asyncio
import math
import random
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from evenflow.balancer import BalancerConfig, Job, ModelBalancer, OutOfMemory
from evenflow.server.models.spec import ModelDefinition, TensorSpec
from evenflow.server.workers.devices import DeviceSpec
from evenflow.server.workers.torch_worker import TorchWorker, release_cached_memory

pytestmark = pytest.mark.timeout(30)

FAKE_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (a fake, raised by the test)"
# How a traced (TorchScript) model's out-of-memory arrives: the interpreter rethrows it as a
# plain RuntimeError whose message embeds the allocator's.
INTERPRETED_OOM = ("The following operation failed in the TorchScript interpreter.\n"
                   "Traceback of TorchScript (most recent call last):\n"
                   f"RuntimeError: {FAKE_OOM}\n")


class OomOnCopyOut(torch.Tensor):
    """A device output whose copy back to the host runs out of memory."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func in (torch.Tensor.cpu, torch.Tensor.to):
            raise torch.OutOfMemoryError(FAKE_OOM)
        return super().__torch_function__(func, types, args, kwargs or {})


class Recording(torch.nn.Module):
    """Keeps weak references to what it saw and made; ``fails(batch)`` says whether this batch
    runs out of memory, and where: ``"compute"``, ``"copy-out"`` or ``""`` (it fits);
    ``"interpreted"`` is compute as a traced model reports it."""

    def __init__(self, fails: Callable[[int], str]) -> None:
        super().__init__()
        self.fails = fails
        self.seen: list[weakref.ref[torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        activation = x * 2.0
        self.seen += [weakref.ref(x), weakref.ref(activation)]
        where = self.fails(x.shape[0])
        if where == "compute":
            raise torch.OutOfMemoryError(FAKE_OOM)
        if where == "interpreted":
            raise RuntimeError(INTERPRETED_OOM)
        if where == "copy-out":
            return activation.as_subclass(OomOnCopyOut)
        return activation


def worker_for(module: Recording) -> TorchWorker:
    definition = ModelDefinition(module=module, inputs=[TensorSpec("x", "FP32", (-1, 4))],
                                 outputs=[TensorSpec("y", "FP32", (-1, 4))], traceable=False)
    return TorchWorker(model_name="oom", definition=definition,
                       device=DeviceSpec("cpu", 0, "cpu:0"))


def one_job(rows: int) -> list[Job]:
    x = np.ones((rows, 4), dtype=np.float32)
    return [Job([x], rows, 0.0, math.inf, asyncio.get_running_loop().create_future())]


@pytest.mark.parametrize("where", ["compute", "copy-out", "interpreted"])
async def test_out_of_memory_frees_the_batch_and_carries_only_the_message(where: str) -> None:
    module = Recording(lambda batch: where)
    worker = worker_for(module)
    try:
        with pytest.raises(OutOfMemory, match="out of memory on cpu: ") as info:
            await worker.run(one_job(3))
    finally:
        await worker.close()
    error = info.value
    assert FAKE_OOM in str(error)
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__
    assert len(module.seen) == 2
    assert [ref() for ref in module.seen] == [None, None]  # input and activation are freed


async def assert_eight_rows_answered_in_batches_of_two(worker: TorchWorker) -> None:
    """Eight one-row requests queued at once to a worker whose batches over two rows run out
    of memory: the balancer splits its way down, every row is answered right, the cap drops."""
    config = BalancerConfig(adaptive_batching=False, max_batch=8, max_wait_s=0.0)
    balancer = ModelBalancer(model_name="oom", workers=[worker], config=config,
                             rng=random.Random(0))
    rows = [np.full((1, 4), float(i), dtype=np.float32) for i in range(8)]
    balancer.start()
    futures = [balancer.submit([x], 1) for x in rows]  # all queued before the replica runs
    try:
        answers = await asyncio.gather(*futures)
    finally:
        await balancer.close()
        await worker.close()
    for x, answer in zip(rows, answers, strict=True):
        np.testing.assert_array_equal(answer[0], x * 2.0)
    assert balancer.replicas[0].controller.cap <= 2


async def test_the_balancer_splits_a_batch_whose_copy_out_runs_out_of_memory() -> None:
    module = Recording(lambda batch: "copy-out" if batch > 2 else "")
    worker = worker_for(module)
    await assert_eight_rows_answered_in_batches_of_two(worker)


class OutOfMemoryPastTwoRows(torch.nn.Module):
    """Runs out of memory on batches over two rows: scripted, it raises through the
    TorchScript interpreter, as a traced model's operations do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (scripted)")
        return x * 2.0


@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\..*deprecated:DeprecationWarning")
async def test_the_balancer_splits_a_batch_a_torchscript_model_runs_out_of_memory_on() -> None:
    scripted = torch.jit.script(OutOfMemoryPastTwoRows())
    with pytest.raises(Exception, match="TorchScript interpreter") as raised:
        scripted(torch.ones(3, 4))
    assert not isinstance(raised.value, torch.OutOfMemoryError)  # what the worker must read
    definition = ModelDefinition(module=scripted, inputs=[TensorSpec("x", "FP32", (-1, 4))],
                                 outputs=[TensorSpec("y", "FP32", (-1, 4))])
    worker = TorchWorker(model_name="scripted", definition=definition,
                         device=DeviceSpec("cpu", 0, "cpu:0"))
    await assert_eight_rows_answered_in_batches_of_two(worker)


class FakeCuda:
    """``torch.cuda``'s allocator calls, recorded: ``reserved`` bytes cached per device."""

    def __init__(self, reserved: list[int]) -> None:
        self.reserved = reserved
        self.emptied = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.reserved))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: self.reserved[index])
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)

    def empty_cache(self) -> None:
        self.emptied += 1


@pytest.mark.parametrize(("reserved", "empties"), [
    ([64 << 20], True),  # the process's only GPU
    ([64 << 20, 0], True),  # another GPU, on which this process caches nothing
    ([64 << 20, 32 << 20], False),  # a replica on cuda:1 in this process: leave its cache
])
def test_the_cache_is_emptied_only_where_no_other_gpu_of_the_process_has_one(
        monkeypatch: pytest.MonkeyPatch, reserved: list[int], empties: bool) -> None:
    """``torch.cuda.empty_cache`` empties every device's cache (it has no per-device form),
    and each release synchronizes its device: in the thread host it would stall the
    replicas on the other GPUs."""
    cuda = FakeCuda(reserved)
    cuda.install(monkeypatch)
    assert release_cached_memory(torch.device("cuda", 0)) is empties
    assert cuda.emptied == int(empties)
