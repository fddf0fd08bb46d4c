"""Requests whose non-batch shapes differ: a key to batch them by, and padding to buckets.

Two requests share a batch only when their inputs' non-batch shapes are equal (the balancer
groups queued jobs by this key), as Triton's dynamic batcher does. A model that declares
``Padding`` gets each request padded to bucket sizes first, so requests of nearby lengths share
a batch, and its outputs cut back to each request's own sizes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from evenflow.balancer.errors import InvalidRequest
from evenflow.server.models.spec import Padding, TensorSpec


def shape_key(arrays: Sequence[np.ndarray]) -> Hashable:
    return tuple(array.shape[1:] for array in arrays)


def pad_inputs(arrays: list[np.ndarray], specs: Sequence[TensorSpec],
               padding: Padding) -> tuple[list[np.ndarray], tuple[int, ...]]:
    """Each input's variable dims padded up to their buckets, and the first input's original
    variable sizes (what the outputs are cut back to)."""
    padded = []
    lengths: tuple[int, ...] = ()
    for index, (array, spec) in enumerate(zip(arrays, specs, strict=True)):
        widths = [(0, 0)] * array.ndim
        for dim, declared in enumerate(spec.shape[1:], start=1):
            if declared != -1:
                continue
            size = array.shape[dim]
            bucket = padding.bucket(size)
            if bucket is None:
                raise InvalidRequest(f"input {spec.name!r} dimension {dim} is {size}, longer "
                                     f"than the model's largest padding bucket "
                                     f"{padding.buckets[-1]}")
            widths[dim] = (0, bucket - size)
            if index == 0:
                lengths += (size,)
        needed = any(after for _, after in widths)
        padded.append(np.pad(array, widths, constant_values=padding.value) if needed else array)
    return padded, lengths


def cut_outputs(outputs: Sequence[np.ndarray], specs: Sequence[TensorSpec],
                lengths: tuple[int, ...]) -> list[np.ndarray]:
    """Each output's variable dims, in order, cut back to ``lengths``."""
    cut = []
    for array, spec in zip(outputs, specs, strict=True):
        index: list[slice] = [slice(None)] * array.ndim
        variable = [dim for dim, declared in enumerate(spec.shape[1:], start=1) if declared == -1]
        for dim, length in zip(variable, lengths, strict=False):
            index[dim] = slice(0, length)
        cut.append(array[tuple(index)])
    return cut
