"""A batch's rows: the jobs' inputs joined along the batch dimension, and a whole batch's
outputs cut back into each job's rows. numpy only (no torch): the worker hosts use it on the
engine's side of a process boundary, the device workers on theirs.

Jobs in one batch share their non-batch shapes (the balancer batches by shape key)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def join_rows(payloads: Sequence[Sequence[np.ndarray]], *,
              writable: bool = False) -> list[np.ndarray]:
    """Each input of a whole batch, the jobs' rows one after another. A batch of one job
    returns its arrays as they are unless ``writable``: then every array is fresh (decoded
    inputs are read-only views of the request's bytes, which torch cannot take)."""
    if len(payloads) == 1:
        return [array.copy() for array in payloads[0]] if writable else list(payloads[0])
    return [np.concatenate([payload[i] for payload in payloads])
            for i in range(len(payloads[0]))]


def split_rows(outputs: Sequence[np.ndarray], sizes: Sequence[int]) -> list[list[np.ndarray]]:
    """Each job's rows of each output, as views (slicing: np.split costs several times more);
    ``sizes``: each job's number of rows, in batch order."""
    if len(sizes) == 1:
        return [list(outputs)]
    per_job = []
    start = 0
    for size in sizes:
        end = start + size
        per_job.append([output[start:end] for output in outputs])
        start = end
    return per_job
