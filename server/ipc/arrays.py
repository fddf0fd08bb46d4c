"""numpy arrays as ZeroMQ frames: the bytes travel as one raw frame each (no pickle, no copy
on this side for frames past ZeroMQ's copy threshold); their dtype and shape travel in the
message's metadata. BYTES (object) arrays, which have no raw buffer, travel as a list of
their elements in the metadata instead."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np


class ArrayMeta(msgspec.Struct, array_like=True, frozen=True):
    """One array: numpy dtype string, shape, and for object arrays the elements."""

    dtype: str
    shape: tuple[int, ...]
    items: list[bytes] | None = None


_EMPTY = b""


def pack(arrays: Sequence[np.ndarray], metas: list[ArrayMeta], frames: list[object]) -> None:
    """Append each array's metadata to ``metas`` and its buffer to ``frames``."""
    for array in arrays:
        if array.dtype.kind == "O":
            metas.append(ArrayMeta("O", array.shape,
                                   [x if isinstance(x, bytes) else str(x).encode()
                                    for x in array.reshape(-1)]))
            frames.append(_EMPTY)
            continue
        dense = array if array.flags.c_contiguous else np.ascontiguousarray(array)
        metas.append(ArrayMeta(dense.dtype.str, dense.shape))
        frames.append(dense.data.cast("B") if dense.size else _EMPTY)


def unpack(metas: Sequence[ArrayMeta], frames: Sequence[bytes | memoryview]) -> list[np.ndarray]:
    """The arrays back, as read-only views of the frames (no copy)."""
    arrays = []
    for meta, frame in zip(metas, frames, strict=True):
        if meta.items is not None:
            arrays.append(np.array(meta.items, dtype=object).reshape(meta.shape))
        else:
            arrays.append(np.frombuffer(frame, dtype=np.dtype(meta.dtype)).reshape(meta.shape))
    return arrays


# A ZeroMQ receive that finds a message waiting completes without giving the event loop a turn;
# a reader that always finds one would starve every other task. Readers yield this often.
YIELD_EVERY = 32
