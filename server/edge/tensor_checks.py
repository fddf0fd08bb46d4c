"""Tensor validation and the raw tensor layout, shared by every transport (gRPC's codec, the
REST codec): the same checks in the same order, with the same wording, whatever carried the
request."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Collection, Iterable, Sequence

import numpy as np

from evenflow.balancer.errors import InvalidRequest
from evenflow.server.edge.datatypes import WireType
from evenflow.server.models.spec import TensorSpec


def inputs_in_spec_order(names: Sequence[str], specs: Sequence[TensorSpec],
                         decode: Callable[[int, TensorSpec], np.ndarray]
                         ) -> tuple[list[np.ndarray], int]:
    """``decode(position, spec)`` of the request's input named like each spec, in ``specs``
    order, and the batch size they share. ``names``: the request's input names as sent."""
    by_name: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in by_name:
            raise InvalidRequest(f"input {name[:64]!r} given twice")
        by_name[name] = index
    expected = [spec.name for spec in specs]
    for name in by_name:
        if name not in expected:
            raise InvalidRequest(f"unexpected input {name[:64]!r}; model expects {expected}")
    arrays: list[np.ndarray] = []
    batch = -1
    for spec in specs:
        position = by_name.get(spec.name)
        if position is None:
            raise InvalidRequest(f"missing input {spec.name!r}; model expects {expected}")
        array = decode(position, spec)
        if batch not in (-1, array.shape[0]):
            raise InvalidRequest(f"input {spec.name!r} has batch {array.shape[0]}, other inputs "
                                 f"have {batch}; all inputs must share the batch dimension")
        batch = array.shape[0]
        arrays.append(array)
    return arrays, batch


def wrong_datatype(name: str, datatype: str, expected: str) -> InvalidRequest:
    return InvalidRequest(f"input {name!r} has datatype {datatype[:32] or '(empty)'}; "
                          f"expected {expected}")


def unsupported_tensor_parameters(name: str, keys: Iterable[str]) -> InvalidRequest:
    return InvalidRequest(f"input {name!r}: tensor parameters {shown_keys(keys)} "
                          "are not supported (no shared memory)")


def shown_keys(keys: Iterable[str]) -> list[str]:
    """Client-chosen parameter keys as an error names them: a few, each cut short. The details
    go back in gRPC's trailing metadata, where a 20 KB key would turn INVALID_ARGUMENT into
    RESOURCE_EXHAUSTED (metadata too large)."""
    return sorted(key[:64] for key in keys)[:4]


def checked_count(name: str, shape: tuple[int, ...], expected: tuple[int, ...],
                  max_elements: int) -> int:
    """The number of elements of an input of ``shape``, once the shape fits the spec's and the
    count the server's limit (both before anything is allocated for the input)."""
    if len(shape) != len(expected):
        raise InvalidRequest(f"input {name!r} has shape {list(shape)[:8]} (rank {len(shape)}); "
                             f"expected {list(expected)} (rank {len(expected)})")
    if shape[0] < 1:
        raise InvalidRequest(f"input {name!r} has batch dimension {shape[0]}; expected >= 1")
    for got, want in zip(shape[1:], expected[1:], strict=True):
        if got < 1 or want not in (-1, got):
            raise InvalidRequest(f"input {name!r} has shape {list(shape)}; expected "
                                 f"{list(expected)} (-1: any size >= 1)")
    count = math.prod(shape)
    if count > max_elements:
        raise InvalidRequest(f"input {name!r} has {count} elements; the server's limit is "
                             f"{max_elements} (--max-tensor-elements)")
    return count


def both_kinds_of_data(name: str, raw_kind: str, typed_kind: str) -> InvalidRequest:
    return InvalidRequest(f"input {name!r} has both {raw_kind} and {typed_kind}; "
                          "send one or the other")


def no_data(name: str) -> InvalidRequest:
    return InvalidRequest(f"input {name!r} carries no data")


def decode_raw(name: str, wire: WireType, shape: tuple[int, ...], count: int,
               raw: bytes | memoryview) -> np.ndarray:
    """Triton's raw layout as an array of ``shape``: numeric types view ``raw`` (no copy, so
    the array lives on the buffer); BYTES elements are copied out as ``bytes``."""
    if wire.name == "BYTES":
        # A memoryview is copied first: its slices would be views, not the bytes a model gets.
        elements = split_bytes(name, raw if isinstance(raw, bytes) else bytes(raw))
        if len(elements) != count:
            raise InvalidRequest(f"input {name!r} raw data holds {len(elements)} BYTES elements; "
                                 f"shape {list(shape)} needs {count}")
        return np.array(elements, dtype=object).reshape(shape)
    expected_bytes = count * wire.itemsize
    if len(raw) != expected_bytes:
        raise InvalidRequest(f"input {name!r} raw data has {len(raw)} bytes; shape {list(shape)} "
                             f"of {wire.name} needs {expected_bytes}")
    return np.frombuffer(raw, dtype=wire.numpy_dtype).reshape(shape)


def split_bytes(name: str, raw: bytes) -> list[bytes]:
    """Triton's BYTES encoding: each element is a 4-byte little-endian length, then the bytes."""
    elements: list[bytes] = []
    offset = 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise InvalidRequest(f"input {name!r}: truncated BYTES length prefix")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise InvalidRequest(f"input {name!r}: BYTES element overruns the data")
        elements.append(raw[offset:offset + length])
        offset += length
    return elements


def output_indices(requested: Iterable[tuple[str, Collection[str]]],
                   specs: Sequence[TensorSpec]) -> list[int]:
    """Indices into ``specs`` of the named outputs, in the order named. ``requested``: each
    requested output's name and the parameters it carries that evenflow does not act on."""
    names = [spec.name for spec in specs]
    chosen: list[int] = []
    for name, parameters in requested:
        if name not in names:
            raise InvalidRequest(f"unknown requested output {name[:64]!r}; model has {names}")
        if parameters:
            raise InvalidRequest(f"requested output {name!r}: parameters "
                                 f"{shown_keys(parameters)} are not supported")
        index = names.index(name)
        if index in chosen:
            raise InvalidRequest(f"output {name!r} requested twice")
        chosen.append(index)
    return chosen


def encode_bytes(array: np.ndarray) -> bytes:
    """A BYTES tensor in Triton's raw layout (elements that are not bytes as their str)."""
    parts = []
    for element in array.reshape(-1):
        data = element if isinstance(element, bytes) else str(element).encode()
        parts.append(struct.pack("<I", len(data)) + data)
    return b"".join(parts)
