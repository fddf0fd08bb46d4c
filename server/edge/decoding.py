"""Request bytes that are not a message: a value the servicer can answer, not a crash.

grpc answers a request its deserializer cannot parse with UNKNOWN and a Python exception text;
a client that sent garbage should get INVALID_ARGUMENT saying what was wrong.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import DecodeError, Message


class Undecodable:
    """What the tolerant deserializer hands the servicer for bytes that are not a message."""

    __slots__ = ("reason",)
    model_name = ""  # what failure accounting reads of a request
    id = ""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def tolerant_deserializer(message: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    """``message.FromString`` that turns a parse failure into an Undecodable value, so the
    servicer answers INVALID_ARGUMENT naming the problem (grpc's own answer is UNKNOWN)."""
    name = message.DESCRIPTOR.full_name

    def parse(data: bytes) -> Message | Undecodable:
        try:
            return message.FromString(data)
        except DecodeError as exc:
            return Undecodable(f"the request is not a valid {name} ({len(data)} bytes): {exc}")

    return parse
