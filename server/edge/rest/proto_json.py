"""Protobuf messages as Triton's HTTP API writes them in JSON: field names as in the .proto,
every field present (defaults included), 64-bit integers as JSON numbers, enums by name.

protobuf's own ``json_format`` quotes 64-bit integers (proto3's JSON mapping) and leaves out
unset fields; perf_analyzer and tritonclient read Triton's statistics and configuration with
the numbers unquoted and every block present, so the HTTP edge writes them this way."""

from __future__ import annotations

import base64
import math
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


def to_json(message: Message) -> dict[str, Any]:
    """``message`` as a JSON-ready dict (see the module docstring)."""
    out: dict[str, Any] = {}
    descriptor: Descriptor = message.DESCRIPTOR
    for field in descriptor.fields:
        oneof = field.containing_oneof
        if oneof is not None and message.WhichOneof(oneof.name) != field.name:
            continue  # only the member of a oneof that is set
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {str(key): _value(value_field, item) for key, item in value.items()}
        elif _is_repeated(field):
            out[field.name] = [_value(field, item) for item in value]
        else:
            out[field.name] = _value(field, value)
    return out


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf >= 5.28 has ``is_repeated``; ``label`` is deprecated there.
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return to_json(value)
    if field.enum_type is not None:
        member = field.enum_type.values_by_number.get(value)
        return member.name if member is not None else value
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    if field.type in _FLOATS and math.isnan(value):  # NaN has no JSON number
        return None
    return value
