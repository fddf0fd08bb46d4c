"""numpy arrays as ZeroMQ frames: the bytes travel as one raw frame each (no pickle, no copy
on this side for frames past ZeroMQ's copy threshold); their dtype and shape travel in the
message's metadata. BYTES (object) arrays, which have no raw buffer, travel as a list of
their elements in the metadata instead."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np


class ArrayMeta(msgspec.Struct, array_like=True, frozen=True):
    """One array: numpy dtype string, shape; for object arrays the elements, and for small
    arrays the bytes themselves (``inline``: no frame of their own)."""

    dtype: str
    shape: tuple[int, ...]
    items: list[bytes] | None = None
    inline: bytes | None = None


# Arrays up to this size travel inside the metadata: each ZeroMQ frame costs a send and a
# receive call (measured: the engine spent ~16 % of its time in per-frame sends), while copying
# a few KiB into the header is cheap. Larger ones get a frame, sent without a copy past 64 KiB.
INLINE_BYTES = 4096


def pack(arrays: Sequence[np.ndarray], metas: list[ArrayMeta], frames: list[object]) -> None:
    """Append each array's metadata to ``metas`` and, unless it travels inline, its buffer to
    ``frames``."""
    for array in arrays:
        if array.dtype.kind == "O":
            metas.append(ArrayMeta("O", array.shape,
                                   [x if isinstance(x, bytes) else str(x).encode()
                                    for x in array.reshape(-1)]))
            continue
        if array.nbytes <= INLINE_BYTES:
            metas.append(ArrayMeta(array.dtype.str, array.shape, inline=array.tobytes()))
            continue
        dense = array if array.flags.c_contiguous else np.ascontiguousarray(array)
        metas.append(ArrayMeta(dense.dtype.str, dense.shape))
        frames.append(dense.data.cast("B"))


def unpack(metas: Sequence[ArrayMeta], frames: Sequence[bytes | memoryview]) -> list[np.ndarray]:
    """The arrays back, as read-only views of the frames or the inline bytes (no copy)."""
    arrays = []
    rest = iter(frames)
    for meta in metas:
        if meta.items is not None:
            arrays.append(np.array(meta.items, dtype=object).reshape(meta.shape))
            continue
        data = meta.inline if meta.inline is not None else next(rest)
        arrays.append(np.frombuffer(data, dtype=np.dtype(meta.dtype)).reshape(meta.shape))
    if next(rest, None) is not None:
        raise ValueError("more frames than arrays")
    return arrays


def by_reference(frames: Sequence[object]) -> bool:
    """Whether to hand ZeroMQ these frames by reference (``copy=False``): only when there are
    array frames (larger than INLINE_BYTES). pyzmq's by-reference path builds a tracked Frame per
    part; for small messages it cost more than the copy (40 % of the engine's CPU per request,
    measured, before this)."""
    return bool(frames)


# A ZeroMQ receive that finds a message waiting completes without giving the event loop a turn;
# a reader that always finds one would starve every other task. Readers yield this often.
YIELD_EVERY = 32
