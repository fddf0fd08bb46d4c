"""What every transport of the client shares: the shapes of its answers and its options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Inputs = Mapping[str, Any]
"""Input name -> numpy array or torch tensor (batch dimension first)."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


@dataclass(frozen=True, slots=True)
class StreamResult:
    """One streamed answer: ``outputs`` on success, ``error`` on failure (the stream goes on)."""

    request_id: str
    outputs: dict[str, np.ndarray] | None
    error: Exception | None


@dataclass(frozen=True, slots=True)
class ChannelOptions:
    """Connection settings. ``max_message_bytes`` bounds both directions (over HTTP: the
    answers). ``keepalive_time_s`` is gRPC's keep-alive ping. ``max_connections`` is HTTP's
    keep-alive pool: the most requests in flight at once (HTTP/1.1 carries one request per
    connection at a time; more wait for a free one); gRPC multiplexes every call on one."""

    max_message_bytes: int = 64 * 1024 * 1024
    keepalive_time_s: float | None = None
    max_connections: int = 64

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, not {self.max_connections}")

    def grpc_options(self) -> list[tuple[str, int]]:
        options = [("grpc.max_receive_message_length", self.max_message_bytes),
                   ("grpc.max_send_message_length", self.max_message_bytes)]
        if self.keepalive_time_s is not None:
            options.append(("grpc.keepalive_time_ms", round(self.keepalive_time_s * 1000)))
        return options
