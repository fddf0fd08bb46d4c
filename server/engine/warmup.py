"""Warm-up: every replica runs a few batches before its model is published READY.

The first batch a replica runs at a size pays one-off costs (lazy CUDA initialisation, cuBLAS
picking its kernels, TorchScript's profiling runs). Served, that batch would land in the latency
fit, mislead admission and batch sizing, and could trip the watchdog. So, as Triton's
ModelWarmup does, each replica first runs batches of a few sizes up to the max batch on sample
inputs built from the model's input spec, straight through the ``Worker`` seam: the balancer
never sees them, so they are in neither its latency fit nor its statistics.

The warm-up is also where a replica on a GPU measures its activation peak, which the placement
adds to its parameters for the memory it needs (``workers.activation_peak``). So its first batch
of the max batch size runs at the worst case a replica will be asked to run: the max batch, with
every variable dimension at the largest padding bucket (attention's memory grows with the
square of the length). A batch is measured only when it is larger than every batch measured
before it, so that batch must be the first at the max size. The other batches take the smallest
bucket, which keeps the warm-up short.

The sample inputs are numpy arrays, the payload every worker host takes (a worker process or a
Ray actor gets them over the wire). A model whose inputs cannot be sampled (BYTES, or variable
dimensions without padding buckets to pick a length from) is not warmed up.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from evenflow.balancer import EvenflowError, Job, Worker
from evenflow.server.edge.datatypes import WIRE_TYPES
from evenflow.server.models.spec import ModelDefinition, Padding, TensorSpec

logger = logging.getLogger(__name__)

_FLOAT_TYPES = ("FP16", "FP32", "FP64")


class WarmupFailed(EvenflowError):
    """A warm-up batch failed or did not finish: the model is not loaded."""


def warmup_batch_sizes(max_batch: int, count: int) -> list[int]:
    """``count`` batch sizes from 1 up to ``max_batch``, spread geometrically (1, the middle,
    the max for three; the max alone for one, the batch whose memory the placement counts); a
    size repeats when there are fewer sizes than batches, which is what a profiling executor
    needs anyway (it optimises a shape on its second run)."""
    if count <= 0:
        return []
    if count == 1:
        return [max_batch]
    return [max(1, min(max_batch, round(max_batch ** (i / (count - 1)))))
            for i in range(count)]


@dataclass(frozen=True, slots=True)
class WarmupBatch:
    """One warm-up batch: ``size`` samples, every variable dimension ``length`` long (None
    where the model has no padding buckets)."""

    size: int
    length: int | None


def warmup_batches(max_batch: int, count: int, padding: Padding | None) -> list[WarmupBatch]:
    """The warm-up's batches (``warmup_batch_sizes``): the first of the max size at the largest
    padding bucket, where its activation peak is measured, the others at the smallest (see
    the module's docstring)."""
    sizes = warmup_batch_sizes(max_batch, count)
    if padding is None:
        return [WarmupBatch(size, None) for size in sizes]
    worst = sizes.index(max(sizes)) if sizes else -1
    return [WarmupBatch(size, padding.buckets[-1] if i == worst else padding.buckets[0])
            for i, size in enumerate(sizes)]


def sample_inputs(specs: Sequence[TensorSpec], batch: int,
                  length: int | None) -> list[np.ndarray] | None:
    """One array per input, ``batch`` rows, in its wire storage (BF16 as uint16 bits): floats
    drawn from a normal distribution, every other type zeros (an index valid in any embedding);
    variable dimensions ``length`` long. None where no sample can be built (BYTES, or variable
    dimensions and no ``length``)."""
    rng = np.random.default_rng(0)
    arrays = []
    for spec in specs:
        wire = WIRE_TYPES[spec.datatype]
        if spec.datatype == "BYTES":
            return None
        dims = list(spec.shape[1:])
        if -1 in dims:
            if length is None:
                return None
            dims = [length if d == -1 else d for d in dims]
        shape = (batch, *dims)
        if spec.datatype in _FLOAT_TYPES:
            arrays.append(rng.standard_normal(shape).astype(wire.numpy_dtype))
        elif spec.datatype == "BF16":  # the top half of each float32's bits
            floats = rng.standard_normal(shape, dtype=np.float32)
            arrays.append((floats.view(np.uint32) >> 16).astype(np.uint16))
        else:
            arrays.append(np.zeros(shape, wire.numpy_dtype))
    return arrays


async def warm_up(workers: Sequence[Worker], definition: ModelDefinition, *, model_name: str,
                  max_batch: int, batches: int, batch_timeout_s: float = math.inf
                  ) -> float | None:
    """Run the warm-up batches on every worker (the workers at once, each one's batches in
    turn); the seconds it took, or None when it was skipped. Raises ``WarmupFailed`` naming
    the replica and the batch size when a batch fails or runs past ``batch_timeout_s``."""
    plan = warmup_batches(max_batch, batches, definition.padding)
    if not plan or not workers:
        return None
    if sample_inputs(definition.inputs, 1, plan[0].length) is None:
        logger.info("model %s: no warm-up: its inputs are BYTES or have variable dimensions "
                    "without padding buckets", model_name)
        return None
    started_s = time.perf_counter()
    await asyncio.gather(*(_warm_worker(worker, definition, plan, model_name,
                                        batch_timeout_s) for worker in workers))
    elapsed_s = time.perf_counter() - started_s
    logger.info("model %s: warmed up %d replica(s) with batches of %s in %.2f s", model_name,
                len(workers), ", ".join(_describe(batch) for batch in plan), elapsed_s)
    return elapsed_s


def _describe(batch: WarmupBatch) -> str:
    return str(batch.size) if batch.length is None else f"{batch.size} x {batch.length}"


async def _warm_worker(worker: Worker, definition: ModelDefinition, plan: list[WarmupBatch],
                       model_name: str, batch_timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    for batch in plan:
        payload = sample_inputs(definition.inputs, batch.size, batch.length)
        job = Job(payload=payload, num_samples=batch.size, arrival_s=0.0, deadline_s=math.inf,
                  future=loop.create_future())
        timeout = asyncio.timeout(None if math.isinf(batch_timeout_s) else batch_timeout_s)
        try:
            async with timeout:
                await worker.run([job])
        except Exception as exc:
            if timeout.expired():
                raise WarmupFailed(f"model {model_name!r}: warm-up batch of {_describe(batch)} "
                                   f"on {worker.name} did not finish within "
                                   f"{batch_timeout_s:.0f} s") from None
            raise WarmupFailed(f"model {model_name!r}: warm-up batch of {_describe(batch)} "
                               f"on {worker.name} failed: {exc}") from exc
