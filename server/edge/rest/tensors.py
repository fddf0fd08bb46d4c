"""The KServe v2 REST infer body (Triton's HTTP protocol with its binary tensor extension) ->
numpy inputs validated against the model, and numpy outputs -> a response body. No transport:
the caller hands in the body and ``Inference-Header-Content-Length``, and sends the parts back.

The checks, their order and their wording are the gRPC codec's (``edge.tensor_checks``): a
request is refused alike whichever protocol carried it. Binary inputs are decoded without a
copy: their arrays view the request body, which must stay unchanged while they live.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np

from evenflow.balancer.errors import InvalidRequest
from evenflow.server.edge import codec
from evenflow.server.edge import tensor_checks as checks
from evenflow.server.edge.datatypes import WIRE_TYPES, WireType
from evenflow.server.models.spec import TensorSpec

HEADER_LENGTH = "Inference-Header-Content-Length"
_EXCERPT_CHARS = 300
_LIST_OF_LISTS = re.compile(rb"\[[ \t\n\r]*\[")  # nested data opens so (JSON's whitespace)


# The JSON header as msgspec decodes it: strict types, so a value of the wrong type anywhere
# is refused with its path (`$.inputs[0].shape`); `data` stays undecoded until its input's
# shape and element count have been checked against the model.
class _InputJson(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    datatype: str
    shape: list[Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]]  # int64, as gRPC's dims
    parameters: dict[str, Any] = {}
    data: msgspec.Raw = msgspec.Raw()  # empty: no `data`


class _OutputJson(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    parameters: dict[str, Any] = {}


class _RequestJson(msgspec.Struct, forbid_unknown_fields=True):
    inputs: list[_InputJson]
    id: str | None = None
    parameters: dict[str, Any] = {}
    outputs: list[_OutputJson] = []


_HEADER_DECODER = msgspec.json.Decoder(_RequestJson)
_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class RestInput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: msgspec.Raw | None  # the JSON `data`, not yet decoded
    binary: memoryview | None  # its bytes of the binary section (binary_data_size)
    unsupported: tuple[str, ...]  # parameters evenflow does not act on (refused on decoding)


@dataclass(frozen=True, slots=True)
class RestOutput:
    name: str
    binary: bool | None  # its `binary_data`; None: the request's binary_data_output
    unsupported: tuple[str, ...]


@dataclass(slots=True)
class RestRequest:
    id: str | None
    priority: int  # 0: default
    timeout_s: float | None  # None: none
    inputs: list[RestInput]
    outputs: list[RestOutput]
    binary_output: bool  # request-level binary_data_output


def parse_request(body: bytes | memoryview, header_length: int | None) -> RestRequest:
    """The infer request in ``body``: its first ``header_length`` bytes are the JSON header
    (all of it when None), the rest the binary section, cut into each input's bytes."""
    view = memoryview(body)
    if header_length is None:
        header, binary = view, view[:0]
    else:
        if not 0 <= header_length <= len(view):
            raise InvalidRequest(f"{HEADER_LENGTH} is {header_length}; the body has "
                                 f"{len(view)} bytes")
        header, binary = view[:header_length], view[header_length:]
    try:
        parsed = _HEADER_DECODER.decode(header)
    except msgspec.ValidationError as exc:  # (msgspec quotes names sent: a bounded excerpt)
        raise InvalidRequest("the inference request does not fit the protocol: "
                             f"{str(exc)[:_EXCERPT_CHARS]}") from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest("the inference request is not valid JSON: "
                             f"{str(exc)[:_EXCERPT_CHARS]}") from None
    except RecursionError:
        raise InvalidRequest("the inference request's JSON is nested too deeply") from None
    priority, timeout_s, binary_output = _request_parameters(parsed.parameters)
    return RestRequest(parsed.id, priority, timeout_s, _inputs(parsed.inputs, binary),
                       [_output(output) for output in parsed.outputs], binary_output)


def _request_parameters(parameters: dict[str, Any]) -> tuple[int, float | None, bool]:
    """Triton's ``priority``, ``timeout`` (microseconds on the wire, seconds here) and
    ``binary_data_output``, refused as the gRPC codec refuses them."""
    if not parameters:
        return 0, None, False
    unknown = [key for key in parameters
               if key not in codec.REQUEST_PARAMETERS and key not in codec.HARMLESS_PARAMETERS]
    if unknown:
        raise codec.unsupported_parameters(unknown)
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise InvalidRequest("parameter 'binary_data_output' must be a boolean, not "
                             f"{type(binary_output).__name__}")
    timeout_us = _integer_parameter(parameters, "timeout")
    return (_integer_parameter(parameters, "priority") or 0,
            timeout_us / 1e6 if timeout_us else None, binary_output)


def _integer_parameter(parameters: dict[str, Any], key: str) -> int | None:
    value = parameters.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise codec.not_an_integer(key, type(value).__name__)
    if value < 0:
        raise codec.negative_parameter(key, value)
    return value


def _inputs(inputs: list[_InputJson], binary: memoryview) -> list[RestInput]:
    """Each input, with its slice of ``binary``: the inputs that declare a binary_data_size
    take that many bytes in turn, and together exactly all of them."""
    parsed = []
    offset = 0
    for tensor in inputs:
        parameters = tensor.parameters
        section = None
        if "binary_data_size" in parameters:
            size = parameters["binary_data_size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidRequest(f"input {tensor.name[:64]!r}: binary_data_size must be an "
                                     f"integer >= 0, not {str(size)[:32]!r}")
            left = len(binary) - offset
            if size > left:
                raise InvalidRequest(f"binary_data_size of input {tensor.name[:64]!r} ({size} "
                                     f"bytes) runs past the binary section ({left} bytes left)")
            section = binary[offset:offset + size]
            offset += size
        unsupported = tuple(key for key in parameters if key != "binary_data_size")
        parsed.append(RestInput(tensor.name, tensor.datatype, tuple(tensor.shape),
                                tensor.data if len(tensor.data) else None, section,
                                unsupported))
    if offset != len(binary):
        raise InvalidRequest(f"{len(binary) - offset} bytes of binary data follow the inputs' "
                             "declared sizes")
    return parsed


def _output(output: _OutputJson) -> RestOutput:
    binary = output.parameters.get("binary_data")
    if binary is not None and not isinstance(binary, bool):
        raise InvalidRequest(f"requested output {output.name[:64]!r}: binary_data must be a "
                             f"boolean, not {type(binary).__name__}")
    unsupported = tuple(key for key in output.parameters if key != "binary_data")
    return RestOutput(output.name, binary, unsupported)


def decode_inputs(request: RestRequest, specs: Sequence[TensorSpec],
                  max_elements: int) -> tuple[list[np.ndarray], int]:
    """The request's inputs in ``specs`` order, and the batch size they share. Every size from
    the wire is checked against the spec, ``max_elements`` and the data actually sent before
    anything is allocated for it; binary inputs view the request body."""
    inputs = request.inputs
    if len(specs) == 1 and len(inputs) == 1 and inputs[0].name == specs[0].name:
        array = _decode_input(inputs[0], specs[0], max_elements)
        return [array], array.shape[0]
    return checks.inputs_in_spec_order(
        [tensor.name for tensor in inputs], specs,
        lambda position, spec: _decode_input(inputs[position], spec, max_elements))


def _decode_input(tensor: RestInput, spec: TensorSpec, max_elements: int) -> np.ndarray:
    name = spec.name
    if tensor.datatype != spec.datatype:
        raise checks.wrong_datatype(name, tensor.datatype, spec.datatype)
    if tensor.unsupported:
        raise checks.unsupported_tensor_parameters(name, tensor.unsupported)
    wire = WIRE_TYPES[spec.datatype]
    shape = tensor.shape
    count = checks.checked_count(name, shape, spec.shape, max_elements)
    if tensor.binary is not None:
        if tensor.data is not None:
            raise checks.both_kinds_of_data(name, "binary data (binary_data_size)", "JSON data")
        return checks.decode_raw(name, wire, shape, count, tensor.binary)
    if tensor.data is None:
        raise checks.no_data(name)
    return _decode_json(name, wire, shape, count, tensor.data)


def _decode_json(name: str, wire: WireType, shape: tuple[int, ...], count: int,
                 data: msgspec.Raw) -> np.ndarray:
    """JSON ``data``, row-major, flat or nested as ``shape``; every element checked to fit the
    datatype (300 is no UINT8, 1.5 no INT32, "1" no FP32)."""
    if wire.name == "BF16":
        raise InvalidRequest(f"input {name!r}: BF16 data can only be sent as binary data "
                             "(binary_data_size), not in JSON")
    nested = len(shape) > 1 and _LIST_OF_LISTS.match(data) is not None
    try:
        values = _data_decoder(wire.name, len(shape) if nested else 1).decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"input {name!r} data does not fit {wire.name} {list(shape)}: "
                             f"{exc}") from None
    except RecursionError:
        raise InvalidRequest(f"input {name!r} data is nested too deeply") from None
    if nested:
        values = _flatten(name, values, shape)
    elif len(values) != count:
        raise InvalidRequest(f"input {name!r} data has {len(values)} elements; shape "
                             f"{list(shape)} needs {count}")
    if wire.name == "BYTES":
        return np.array([value.encode() for value in values], dtype=object).reshape(shape)
    try:
        return np.array(values, dtype=wire.numpy_dtype).reshape(shape)
    except OverflowError:  # UINT64's top: msgspec bounds only what fits an int64
        raise InvalidRequest(f"input {name!r} data does not fit {wire.name} {list(shape)}: a "
                             f"value is over {np.iinfo(wire.numpy_dtype).max}") from None


def _flatten(name: str, rows: list[Any], shape: tuple[int, ...]) -> list[Any]:
    """Nested ``rows`` (a list of depth ``len(shape)``) flattened row-major, once every list at
    every depth has its dimension's length: a ragged list is refused, not reshaped."""
    for depth, size in enumerate(shape):
        for row in rows if depth else (rows,):
            if len(row) != size:
                raise InvalidRequest(f"input {name!r} data is ragged: a list at depth {depth} "
                                     f"has {len(row)} elements; shape {list(shape)} needs "
                                     f"{size} there")
        if depth:
            rows = list(itertools.chain.from_iterable(rows))
    return rows


# Halfway between each type's largest finite value and the next power of two: a magnitude
# this large or larger rounds to infinity.
_FP16_LIMIT = 2.0 ** 16 - 2.0 ** 4
_FP32_LIMIT = 2.0 ** 128 - 2.0 ** 103


def _element_type(datatype: str) -> Any:
    if datatype == "BOOL":
        return bool
    if datatype == "BYTES":
        return str
    if datatype == "FP64":
        return float
    if datatype in ("FP16", "FP32"):
        limit = _FP16_LIMIT if datatype == "FP16" else _FP32_LIMIT
        return Annotated[float, msgspec.Meta(gt=-limit, lt=limit)]
    info = np.iinfo(WIRE_TYPES[datatype].numpy_dtype)
    if datatype == "UINT64":  # msgspec bounds only int64; numpy refuses what is over
        return Annotated[int, msgspec.Meta(ge=0)]
    return Annotated[int, msgspec.Meta(ge=int(info.min), le=int(info.max))]


@functools.cache
def _data_decoder(datatype: str, depth: int) -> msgspec.json.Decoder[Any]:
    """A strict decoder of ``depth`` nested lists of ``datatype``'s elements (one per pair)."""
    kind = _element_type(datatype)
    for _ in range(depth):
        kind = list[kind]  # type: ignore[valid-type]
    return msgspec.json.Decoder(kind)


def requested_outputs(request: RestRequest, specs: Sequence[TensorSpec]) -> list[int]:
    """Indices into ``specs`` of the outputs to return (all when none are named)."""
    if not request.outputs:
        return list(range(len(specs)))
    return checks.output_indices(((output.name, output.unsupported) for output in request.outputs),
                          specs)


def encode_response(request: RestRequest, model_name: str, model_version: str,
                    specs: Sequence[TensorSpec], chosen: Sequence[int],
                    arrays: Sequence[np.ndarray]) -> tuple[list[bytes | memoryview], int | None]:
    """The response body as parts to send in order (the JSON header, then each binary output's
    bytes, uncopied where the array allows), and the header's length for
    ``Inference-Header-Content-Length`` (None: no binary output, the body is all JSON)."""
    binary_by_name = {output.name: output.binary for output in request.outputs
                      if output.binary is not None}
    outputs: list[dict[str, Any]] = []
    buffers: list[bytes | memoryview] = []
    for index in chosen:
        spec = specs[index]
        array = codec.wire_array(spec, arrays[index])
        entry: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype,
                                 "shape": list(array.shape)}
        if binary_by_name.get(spec.name, request.binary_output):
            data = checks.encode_bytes(array) if spec.datatype == "BYTES" else _raw_view(array)
            entry["parameters"] = {"binary_data_size": len(data)}
            buffers.append(data)
        else:
            entry["data"] = _json_data(spec, array)
        outputs.append(entry)
    response: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        response["id"] = request.id
    response["outputs"] = outputs
    header = _ENCODER.encode(response)
    if not buffers:
        return [header], None
    return [header, *buffers], len(header)


def _raw_view(array: np.ndarray) -> memoryview:
    """The array's bytes in the raw layout, as a view where it is contiguous already."""
    return np.ascontiguousarray(array).data.cast("B")


def _json_data(spec: TensorSpec, array: np.ndarray) -> list[Any]:
    name = spec.name
    flat = array.reshape(-1)
    if spec.datatype == "BF16":
        raise InvalidRequest(f"BF16 output {name!r} can only be sent as binary data; request it "
                             "with binary_data")
    if spec.datatype == "BYTES":
        try:
            return [element.decode() if isinstance(element, bytes) else str(element)
                    for element in flat]
        except UnicodeDecodeError:
            raise InvalidRequest(f"BYTES output {name!r} holds an element that is not UTF-8, "
                                 "which JSON cannot carry; request it with binary_data") from None
    if spec.datatype in ("FP16", "FP32", "FP64") and not np.isfinite(flat).all():
        raise InvalidRequest(f"{spec.datatype} output {name!r} holds NaN or infinity, which "
                             "JSON cannot carry; request it with binary_data")
    values: list[Any] = flat.tolist()
    return values
