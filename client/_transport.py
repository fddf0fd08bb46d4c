"""What ``Client`` and ``AsyncClient`` need of a transport (gRPC, HTTP): the KServe v2 calls,
each failing with an ``InferenceServerError``. The clients add what is the same for every
transport (retries, the context manager); an infer request (``R``) is prepared for each
attempt with the time left of the call's deadline, which HTTP sends in the body."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from typing import Protocol, TypeVar

import numpy as np

from evenflow.client._types import Inputs, ModelMetadata, StreamResult

R = TypeVar("R")


class Transport(Protocol[R]):
    def prepare(self, model: str, inputs: Inputs, outputs: Sequence[str] | None,
                request_id: str | None, priority: int | None, timeout_s: float | None) -> R: ...

    def infer(self, model: str, request: R, timeout_s: float | None) -> dict[str, np.ndarray]: ...

    def server_live(self, timeout_s: float | None) -> bool: ...

    def server_ready(self, timeout_s: float | None) -> bool: ...

    def model_ready(self, name: str, timeout_s: float | None) -> bool: ...

    def model_metadata(self, name: str, timeout_s: float | None) -> ModelMetadata: ...

    def stream_infer(self, model: str, inputs: Iterable[Inputs], outputs: Sequence[str] | None,
                     timeout_s: float | None) -> Iterator[StreamResult]: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol[R]):
    def prepare(self, model: str, inputs: Inputs, outputs: Sequence[str] | None,
                request_id: str | None, priority: int | None, timeout_s: float | None) -> R: ...

    async def infer(self, model: str, request: R,
                    timeout_s: float | None) -> dict[str, np.ndarray]: ...

    async def server_live(self, timeout_s: float | None) -> bool: ...

    async def server_ready(self, timeout_s: float | None) -> bool: ...

    async def model_ready(self, name: str, timeout_s: float | None) -> bool: ...

    async def model_metadata(self, name: str, timeout_s: float | None) -> ModelMetadata: ...

    def stream_infer(self, model: str, inputs: AsyncIterable[Inputs] | Iterable[Inputs],
                     outputs: Sequence[str] | None,
                     timeout_s: float | None) -> AsyncIterator[StreamResult]: ...

    async def close(self) -> None: ...
