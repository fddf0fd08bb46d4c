"""Warm-up: every replica runs a few batches before its model is published READY.

The first batch a replica runs at a size pays one-off costs (lazy CUDA initialisation, cuBLAS
picking its kernels, TorchScript's profiling runs). Served, that batch would land in the latency
fit, mislead admission and batch sizing, and could trip the watchdog. So, as Triton's
ModelWarmup does, each replica first runs batches of a few sizes up to the max batch on sample
inputs built from the model's input spec, straight through the ``Worker`` seam: the balancer
never sees them, so they are in neither its latency fit nor its statistics.

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
    the max for three); a size repeats when there are fewer sizes than batches, which is what
    a profiling executor needs anyway (it optimises a shape on its second run)."""
    if count <= 0:
        return []
    if count == 1:
        return [1]
    return [max(1, min(max_batch, round(max_batch ** (i / (count - 1)))))
            for i in range(count)]


def sample_inputs(specs: Sequence[TensorSpec], batch: int,
                  padding: Padding | None) -> list[np.ndarray] | None:
    """One array per input, ``batch`` rows, in its wire storage (BF16 as uint16 bits): floats
    drawn from a normal distribution, every other type zeros (an index valid in any embedding);
    variable dimensions take the smallest padding bucket. None where no sample can be built."""
    rng = np.random.default_rng(0)
    arrays = []
    for spec in specs:
        wire = WIRE_TYPES[spec.datatype]
        if spec.datatype == "BYTES":
            return None
        dims = list(spec.shape[1:])
        if -1 in dims:
            if padding is None:
                return None
            dims = [padding.buckets[0] if d == -1 else d for d in dims]
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
    sizes = warmup_batch_sizes(max_batch, batches)
    if not sizes or not workers:
        return None
    if sample_inputs(definition.inputs, 1, definition.padding) is None:
        logger.info("model %s: no warm-up: its inputs are BYTES or have variable dimensions "
                    "without padding buckets", model_name)
        return None
    started_s = time.perf_counter()
    await asyncio.gather(*(_warm_worker(worker, definition, sizes, model_name,
                                        batch_timeout_s) for worker in workers))
    elapsed_s = time.perf_counter() - started_s
    logger.info("model %s: warmed up %d replica(s) with batches of %s in %.2f s", model_name,
                len(workers), ", ".join(map(str, sizes)), elapsed_s)
    return elapsed_s


async def _warm_worker(worker: Worker, definition: ModelDefinition, sizes: list[int],
                       model_name: str, batch_timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    for size in sizes:
        payload = sample_inputs(definition.inputs, size, definition.padding)
        job = Job(payload=payload, num_samples=size, arrival_s=0.0, deadline_s=math.inf,
                  future=loop.create_future())
        timeout = asyncio.timeout(None if math.isinf(batch_timeout_s) else batch_timeout_s)
        try:
            async with timeout:
                await worker.run([job])
        except Exception as exc:
            if timeout.expired():
                raise WarmupFailed(f"model {model_name!r}: warm-up batch of {size} on "
                                   f"{worker.name} did not finish within "
                                   f"{batch_timeout_s:.0f} s") from None
            raise WarmupFailed(f"model {model_name!r}: warm-up batch of {size} on "
                               f"{worker.name} failed: {exc}") from exc
