"""numpy/torch tensors <-> the KServe v2 wire's raw tensor bytes, shared by every transport:
little-endian elements in row-major order; BYTES as elements each prefixed by its length
(4 bytes, little-endian); BF16 as its 16 bits (a uint16 array in numpy)."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evenflow.client.errors import malformed_response

_DATATYPE_OF = {
    np.dtype("bool"): "BOOL", np.dtype("uint8"): "UINT8", np.dtype("uint16"): "UINT16",
    np.dtype("uint32"): "UINT32", np.dtype("uint64"): "UINT64", np.dtype("int8"): "INT8",
    np.dtype("int16"): "INT16", np.dtype("int32"): "INT32", np.dtype("int64"): "INT64",
    np.dtype("float16"): "FP16", np.dtype("float32"): "FP32", np.dtype("float64"): "FP64",
}
_NUMPY_OF = {name: dtype for dtype, name in _DATATYPE_OF.items()} | {"BF16": np.dtype("uint16")}
_LENGTH = struct.Struct("<I")


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype that carries a KServe v2 datatype on the wire (BF16: uint16 bits).
    BYTES has none (its elements vary in size): it decodes to an object array of bytes."""
    dtype = _NUMPY_OF.get(datatype)
    if dtype is None:
        raise TypeError(f"no numpy dtype for datatype {datatype!r}")
    return dtype


@dataclass(frozen=True, slots=True)
class WireTensor:
    """One input as the wire carries it. ``data`` views the caller's array where its layout
    already is the wire's (no copy until a transport writes it)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes | memoryview


def to_wire(name: str, value: Any) -> WireTensor:
    """A numpy array or torch tensor as wire bytes: BF16 (torch's, or ml_dtypes' numpy
    bfloat16) as its bits, object, bytes (``S``) and str (``U``) arrays as BYTES."""
    if not isinstance(value, np.ndarray) and hasattr(value, "detach"):  # a torch tensor
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            import torch

            bits = tensor.contiguous().view(torch.int16).numpy().view(np.uint16)
            return WireTensor(name, "BF16", bits.shape, _view(bits))
        value = tensor.numpy()
    array = np.asarray(value)
    if array.dtype.name == "bfloat16":  # ml_dtypes' numpy bfloat16 (tritonclient's BF16)
        bits = np.ascontiguousarray(array).view(np.uint16)
        return WireTensor(name, "BF16", bits.shape, _view(bits))
    if array.dtype.kind in "OSU":
        return WireTensor(name, "BYTES", array.shape, serialize_bytes(array))
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":  # the wire is little-endian
        array = array.astype(array.dtype.newbyteorder("<"))
    datatype = _DATATYPE_OF.get(array.dtype)
    if datatype is None:
        raise TypeError(f"input {name!r}: unsupported dtype {array.dtype}")
    return WireTensor(name, datatype, array.shape, _view(array))


def _view(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).data).cast("B")


def serialize_bytes(array: np.ndarray) -> bytes:
    """BYTES elements, row-major, each as its length then its bytes (str as UTF-8)."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode()
        parts += (_LENGTH.pack(len(data)), data)
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview, count: int) -> np.ndarray:
    """``count`` length-prefixed elements filling ``buffer`` exactly, as an object array."""
    view = memoryview(buffer)
    items = np.empty(count, dtype=object)
    offset = 0
    for index in range(count):
        if offset + _LENGTH.size > len(view):
            raise malformed_response(f"BYTES data ends after {index} of {count} elements")
        (size,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        if offset + size > len(view):
            raise malformed_response(f"BYTES element {index} runs past the data")
        items[index] = bytes(view[offset:offset + size])
        offset += size
    if offset != len(view):
        raise malformed_response(f"BYTES data has {len(view) - offset} bytes after its "
                                 f"{count} elements")
    return items


def from_wire(buffer: bytes | memoryview, datatype: str, shape: Sequence[int],
              name: str) -> np.ndarray:
    """The output ``name`` from exactly its wire bytes: a read-only view of ``buffer`` for
    fixed-size datatypes (no copy), an object array of bytes for BYTES."""
    shape = tuple(int(d) for d in shape)
    count = math.prod(shape)
    if datatype == "BYTES":
        return deserialize_bytes(buffer, count).reshape(shape)
    try:
        dtype = numpy_dtype(datatype)
    except TypeError as exc:
        raise TypeError(f"output {name!r}: {exc}") from None
    if len(buffer) != count * dtype.itemsize:
        raise malformed_response(f"output {name!r} has {len(buffer)} bytes; {datatype} "
                                 f"{list(shape)} needs {count * dtype.itemsize}")
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)
