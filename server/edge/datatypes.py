"""KServe v2 datatype strings and how each is carried: numpy storage, typed-contents field,
Triton's ModelConfig enum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from evenflow.proto import model_config_pb2


@dataclass(frozen=True, slots=True)
class WireType:
    name: str
    numpy_dtype: np.dtype  # storage of raw data (BF16 is carried as uint16 bits)
    contents_field: str | None  # InferTensorContents field for typed data; None = raw only
    config_type: model_config_pb2.DataType  # inference.DataType

    @property
    def itemsize(self) -> int:
        return self.numpy_dtype.itemsize


def _wire(name: str, dtype: str, field: str | None, config: str) -> WireType:
    # The enum's members are plain ints at run time; the stubs give them their own type.
    member = cast("model_config_pb2.DataType", model_config_pb2.DataType.Value(config))
    return WireType(name, np.dtype(dtype), field, member)


WIRE_TYPES: dict[str, WireType] = {w.name: w for w in (
    _wire("BOOL", "bool", "bool_contents", "TYPE_BOOL"),
    _wire("UINT8", "<u1", "uint_contents", "TYPE_UINT8"),
    _wire("UINT16", "<u2", "uint_contents", "TYPE_UINT16"),
    _wire("UINT32", "<u4", "uint_contents", "TYPE_UINT32"),
    _wire("UINT64", "<u8", "uint64_contents", "TYPE_UINT64"),
    _wire("INT8", "<i1", "int_contents", "TYPE_INT8"),
    _wire("INT16", "<i2", "int_contents", "TYPE_INT16"),
    _wire("INT32", "<i4", "int_contents", "TYPE_INT32"),
    _wire("INT64", "<i8", "int64_contents", "TYPE_INT64"),
    _wire("FP16", "<f2", None, "TYPE_FP16"),
    _wire("BF16", "<u2", None, "TYPE_BF16"),
    _wire("FP32", "<f4", "fp32_contents", "TYPE_FP32"),
    _wire("FP64", "<f8", "fp64_contents", "TYPE_FP64"),
    _wire("BYTES", "object", "bytes_contents", "TYPE_STRING"),
)}


def wire_type(name: str) -> WireType | None:
    return WIRE_TYPES.get(name)
