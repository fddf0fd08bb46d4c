"""The memory ``--placement auto`` counts, on a real GPU (skipped without one): the activation
peak a warmed-up replica measures is that of the worst case it will run, and a GPU's usable
memory leaves out what other processes hold. The CPU halves of these are in
``tests/unit/test_warmup.py`` and ``tests/unit/test_device_memory.py``."""

from __future__ import annotations

import pytest
import torch

from evenflow.server.engine import device_memory
from evenflow.server.engine.warmup import warm_up
from evenflow.server.models.spec import ModelDefinition, Padding, TensorSpec
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.torch_worker import TorchWorker

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

MAX_BATCH = 8
LONGEST = 512


class Scores(torch.nn.Module):
    """Attention's shape of memory: a (batch, length, length) score matrix per batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.unsqueeze(-1) * x.unsqueeze(-2)).softmax(-1).sum(-1)


async def test_the_warmup_measures_the_peak_at_the_max_batch_and_the_longest_bucket() -> None:
    definition = ModelDefinition(module=Scores(), inputs=[TensorSpec("x", "FP32", (-1, -1))],
                                 outputs=[TensorSpec("y", "FP32", (-1, -1))], traceable=False,
                                 padding=Padding(0.0, (8, 64, LONGEST)))
    worker = TorchWorker(model_name="scores", definition=definition,
                         device=parse_devices("cuda:0")[0])
    try:
        await warm_up([worker], definition, model_name="scores", max_batch=MAX_BATCH,
                      batches=3)
        peak = worker.status().activation_peak_bytes
    finally:
        await worker.close()
    # One float32 score matrix at the max batch and the longest bucket; the shortest bucket's
    # would be 4,096 times smaller.
    assert peak is not None and peak >= MAX_BATCH * LONGEST * LONGEST * 4


def test_a_gpu_offers_no_more_than_is_free_nor_more_than_nine_tenths() -> None:
    gpu = parse_devices("cuda:0")[0]
    asked: list[tuple[int, int]] = []

    def ask(index: int) -> tuple[int, int]:
        asked.append(device_memory.cuda_free_and_total(index))
        return asked[-1]

    taken = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0")  # another user's
    try:
        usable = device_memory.device_memory_bytes(gpu, {}, ask)
    finally:
        del taken
        torch.cuda.empty_cache()
    ((free, total),) = asked
    assert total == torch.cuda.get_device_properties(0).total_memory
    assert usable <= free <= total - (256 << 20)
    assert usable <= int(total * device_memory.GPU_USABLE)
    assert device_memory.cuda_total(0) == (total, total)


def test_nvml_sees_the_memory_cuda_sees_held() -> None:
    # Process workers ask NVML, which needs no CUDA context; it must see what this process
    # holds as CUDA's own count does, for the same GPU (matched by UUID).
    pytest.importorskip("pynvml")
    taken = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
    try:
        query = device_memory.nvml_free_and_total()  # a snapshot, taken now
        cuda_free, cuda_total_bytes = device_memory.cuda_free_and_total(0)
    finally:
        del taken
        torch.cuda.empty_cache()
    assert query is not None
    nvml_free, nvml_total = query(0)
    assert nvml_total == cuda_total_bytes
    assert abs(nvml_free - cuda_free) <= 64 << 20  # two reads of a driver count, moments apart
