"""Protobuf at the edge: ModelInferRequest -> numpy inputs (validated against the model), and
numpy outputs -> ModelInferResponse. Everything past this module sees arrays, never protos."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from evenflow.balancer.errors import EvenflowError, InvalidRequest
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.server.edge.datatypes import WIRE_TYPES, WireType
from evenflow.server.edge.tensor_checks import (
    both_kinds_of_data,
    checked_count,
    decode_raw,
    encode_bytes,
    inputs_in_spec_order,
    no_data,
    output_indices,
    shown_keys,
    unsupported_tensor_parameters,
    wrong_datatype,
)
from evenflow.server.models.spec import TensorSpec

# Request parameters evenflow acts on, and Triton's that do not change a non-decoupled model's
# answer (perf_analyzer sends the first). Any other is refused rather than silently ignored: a
# client asking for sequence batching or shared memory would otherwise get wrong answers.
REQUEST_PARAMETERS = ("priority", "timeout")
HARMLESS_PARAMETERS = ("triton_enable_empty_final_response", "binary_data_output")


def decode_inputs(request: pb.ModelInferRequest, specs: Sequence[TensorSpec],
                  max_elements: int) -> tuple[list[np.ndarray], int]:
    """The request's inputs in ``specs`` order, and the batch size they share. Every size from
    the wire is checked against the spec, ``max_elements`` and the bytes actually sent before
    anything is allocated for it."""
    tensors = request.inputs
    raw = request.raw_input_contents
    if len(specs) == 1 and len(tensors) == 1 and len(raw) == 1:
        # The common case, kept lean because it runs on the event loop for every request.
        spec = specs[0]
        tensor = tensors[0]
        if tensor.name == spec.name:
            array = _decode_tensor(tensor, spec, raw[0], max_elements)
            return [array], array.shape[0]
    if raw and len(raw) != len(tensors):
        raise InvalidRequest(f"raw_input_contents has {len(raw)} entries for {len(tensors)} "
                             "inputs; expected one per input")
    return inputs_in_spec_order(
        [tensor.name for tensor in tensors], specs,
        lambda position, spec: _decode_tensor(tensors[position], spec,
                                              raw[position] if raw else None, max_elements))


def _decode_tensor(tensor: pb.ModelInferRequest.InferInputTensor, spec: TensorSpec,
                   raw: bytes | None, max_elements: int) -> np.ndarray:
    name = spec.name
    if tensor.datatype != spec.datatype:
        raise wrong_datatype(name, tensor.datatype, spec.datatype)
    if tensor.parameters:
        raise unsupported_tensor_parameters(name, tensor.parameters)
    wire = WIRE_TYPES[spec.datatype]
    shape = tuple(tensor.shape)
    count = checked_count(name, shape, spec.shape, max_elements)
    has_typed = tensor.HasField("contents")
    if raw is not None:
        if has_typed:
            raise both_kinds_of_data(name, "raw_input_contents", "typed contents")
        return decode_raw(name, wire, shape, count, raw)
    if not has_typed:
        raise no_data(name)
    return _decode_typed(name, wire, shape, count, tensor)


def _decode_typed(name: str, wire: WireType, shape: tuple[int, ...], count: int,
                  tensor: pb.ModelInferRequest.InferInputTensor) -> np.ndarray:
    if wire.contents_field is None:
        raise InvalidRequest(f"input {name!r}: {wire.name} has no typed contents field; "
                             "send it in raw_input_contents")
    values = getattr(tensor.contents, wire.contents_field)
    if len(values) != count:
        raise InvalidRequest(f"input {name!r} contents.{wire.contents_field} has {len(values)} "
                             f"elements; shape {list(shape)} needs {count}")
    try:
        return np.array(values, dtype=wire.numpy_dtype).reshape(shape)
    except OverflowError:
        # int_contents and uint_contents are 32-bit on the wire for the 8- and 16-bit types
        # too; numpy 2 refuses a value that does not fit rather than wrapping it.
        info = np.iinfo(wire.numpy_dtype)
        raise InvalidRequest(f"input {name!r} contents.{wire.contents_field} holds values "
                             f"outside {wire.name}'s range [{info.min}, {info.max}]") from None


def requested_outputs(request: pb.ModelInferRequest,
                      specs: Sequence[TensorSpec]) -> list[int]:
    """Indices into ``specs`` of the outputs to return (all when none are named)."""
    requested = request.outputs
    if not requested:
        return list(range(len(specs)))
    if len(requested) == 1 and len(specs) == 1:  # perf_analyzer and tritonclient name it
        output = requested[0]
        if output.name == specs[0].name and not output.parameters:
            return [0]
    return output_indices(((output.name, output.parameters) for output in requested), specs)


def read_parameters(request: pb.ModelInferRequest) -> tuple[int, float | None]:
    """The request's Triton ``priority`` (0: the model's default level) and ``timeout`` in
    seconds (None: none); any parameter evenflow does not act on is refused. Call only when the
    request has parameters (perf_analyzer sends one with every request: one pass, no sets)."""
    parameters = request.parameters
    unknown = [key for key in parameters
               if key not in REQUEST_PARAMETERS and key not in HARMLESS_PARAMETERS]
    if unknown:
        raise unsupported_parameters(unknown)
    timeout_us = _integer_parameter(request, "timeout")
    return (_integer_parameter(request, "priority") or 0,
            timeout_us / 1e6 if timeout_us else None)


def _integer_parameter(request: pb.ModelInferRequest, key: str) -> int | None:
    if key not in request.parameters:
        return None
    parameter = request.parameters[key]
    kind = parameter.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param"):
        raise not_an_integer(key, str(kind))
    value = int(getattr(parameter, kind))
    if value < 0:
        raise negative_parameter(key, value)
    return value


def unsupported_parameters(keys: Iterable[str]) -> InvalidRequest:
    return InvalidRequest(f"unsupported request parameters {shown_keys(keys)}"
                          f"; evenflow acts on {list(REQUEST_PARAMETERS)}")


def not_an_integer(key: str, kind: str) -> InvalidRequest:
    return InvalidRequest(f"parameter {key!r} must be an integer, not {kind}")


def negative_parameter(key: str, value: int) -> InvalidRequest:
    return InvalidRequest(f"parameter {key!r} must be >= 0, not {value}")


def encode_response(request: pb.ModelInferRequest, specs: Sequence[TensorSpec],
                    chosen: Sequence[int], arrays: Sequence[np.ndarray]) -> pb.ModelInferResponse:
    # Filled in place: built from nested keyword arguments it cost 4.7 us for one output,
    # against 2.0 (timeit), on the loop, per request.
    response = pb.ModelInferResponse(model_name=request.model_name, model_version="1",
                                     id=request.id)
    outputs, contents = response.outputs, response.raw_output_contents
    for index in chosen:
        spec = specs[index]
        array = arrays[index]
        output = outputs.add()
        output.name = spec.name
        output.datatype = spec.datatype
        output.shape.extend(array.shape)
        contents.append(encode_bytes(array) if spec.datatype == "BYTES"
                        else wire_array(spec, array).tobytes())
    return response


_INTEGRAL = "biu"  # numpy kinds: bool, signed and unsigned integers


def wire_array(spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """A numeric output in its datatype's wire dtype, for both codecs: the bytes sent must be
    what the ``datatype`` label says (an INT32 output that a model returns as torch's int64,
    argmax's type, would otherwise go out as 8 bytes an element, which no client can read).

    Casts that keep the values are made: to a wider or equal type, integers or booleans to a
    narrower integer type (or BOOL) when every value fits, and to a float type (FP16 overflows
    to infinity, as on the device). Floats to an integer type, or values that do not fit, are
    refused as INTERNAL: the model does not return what its spec declares, and rounding or
    wrapping would send wrong numbers under a right-looking label."""
    wire = WIRE_TYPES[spec.datatype].numpy_dtype
    source = array.dtype
    if source == wire or spec.datatype == "BYTES":
        return array
    if wire.kind == "f" and source.kind in _INTEGRAL + "f":
        return array.astype(wire)
    if wire.kind in _INTEGRAL and source.kind in _INTEGRAL:
        if not np.can_cast(source, wire, "safe") and array.size:
            low, high = (0, 1) if wire.kind == "b" else (np.iinfo(wire).min, np.iinfo(wire).max)
            if array.min() < low or array.max() > high:
                raise EvenflowError(
                    f"model output {spec.name!r} is declared {spec.datatype}, but holds "
                    f"{source} values outside [{low}, {high}]; fix the model or its spec")
        return array.astype(wire)
    raise EvenflowError(f"model output {spec.name!r} is declared {spec.datatype}, but the model "
                        f"returned {source} values, which {spec.datatype} cannot carry "
                        "unchanged; fix the model or its spec")
