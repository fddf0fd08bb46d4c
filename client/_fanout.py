"""``stream_infer`` where the transport has no streams (HTTP/1.1): every input set becomes its
own request, up to ``window`` in flight at once over the connection pool, and the answers are
yielded as they finish, as ModelStreamInfer's are: request ``i`` gets id ``str(i)``, a failed
request is a ``StreamResult`` with its error and the stream goes on, and ``timeout_s`` bounds
the whole stream (past it the stream raises DeadlineExceededError, as gRPC's call does)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import grpc
import numpy as np

from evenflow.client._types import Inputs, StreamResult
from evenflow.client.errors import DeadlineExceededError, InferenceServerError, error_for

# (input set, request id, time left of the stream's deadline) -> outputs
Answer = Callable[[Inputs, str, float | None], dict[str, np.ndarray]]
AsyncAnswer = Callable[[Inputs, str, float | None], Awaitable[dict[str, np.ndarray]]]


class StreamDeadline:
    """The stream's deadline (monotonic seconds; None: no deadline)."""

    def __init__(self, timeout_s: float | None) -> None:
        self._deadline_s = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining_s(self) -> float | None:
        if self._deadline_s is None:
            return None
        left_s = self._deadline_s - time.monotonic()
        if left_s <= 0:
            raise error_for(grpc.StatusCode.DEADLINE_EXCEEDED, "the stream's deadline passed")
        return left_s

    def result(self, request_id: str, error: InferenceServerError) -> StreamResult:
        """A failed request's answer; its own deadline being the stream's ends the stream."""
        if isinstance(error, DeadlineExceededError) and self._deadline_s is not None \
                and time.monotonic() >= self._deadline_s:
            raise error
        return StreamResult(request_id, None, error)


def fan_out(inputs: Iterable[Inputs], answer: Answer, window: int,
            timeout_s: float | None) -> Iterator[StreamResult]:
    """The blocking stream, on ``window`` threads (each request blocks one)."""
    deadline = StreamDeadline(timeout_s)

    def one(request_id: str, item: Inputs) -> StreamResult:
        try:
            return StreamResult(request_id, answer(item, request_id, deadline.remaining_s()), None)
        except InferenceServerError as exc:
            return deadline.result(request_id, exc)

    pool = ThreadPoolExecutor(max_workers=window, thread_name_prefix="evenflow-stream")
    pending: set[Future[StreamResult]] = set()
    try:
        for index, item in enumerate(inputs):
            if len(pending) >= window:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (future.result() for future in done)
            pending.add(pool.submit(one, str(index), item))
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            yield from (future.result() for future in done)
    finally:
        # A consumer that stops early does not wait for the answers it left.
        pool.shutdown(wait=False, cancel_futures=True)


async def fan_out_async(inputs: AsyncIterable[Inputs] | Iterable[Inputs], answer: AsyncAnswer,
                        window: int, timeout_s: float | None) -> AsyncIterator[StreamResult]:
    """The asyncio stream: inputs are read while answers come (an input source that waits
    does not hold back answers already in)."""
    deadline = StreamDeadline(timeout_s)
    # An answer, the end (None), or what broke the stream (raised to the consumer).
    results: asyncio.Queue[StreamResult | BaseException | None] = asyncio.Queue()
    slots = asyncio.Semaphore(window)
    pending: set[asyncio.Task[None]] = set()

    async def one(request_id: str, item: Inputs) -> None:
        try:
            outputs = await answer(item, request_id, deadline.remaining_s())
            results.put_nowait(StreamResult(request_id, outputs, None))
        except InferenceServerError as exc:
            try:
                results.put_nowait(deadline.result(request_id, exc))
            except InferenceServerError as ended:
                results.put_nowait(ended)
        except Exception as exc:
            results.put_nowait(exc)
        finally:
            slots.release()

    async def feed() -> None:
        try:
            index = 0
            async for item in each_input(inputs):
                await slots.acquire()
                task = asyncio.create_task(one(str(index), item))
                pending.add(task)
                task.add_done_callback(pending.discard)
                index += 1
            if pending:
                await asyncio.wait(set(pending))
            results.put_nowait(None)
        except Exception as exc:
            results.put_nowait(exc)

    feeder = asyncio.create_task(feed())
    try:
        while (result := await results.get()) is not None:
            if isinstance(result, BaseException):
                raise result
            yield result
    finally:
        for task in (feeder, *pending):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(feeder, *pending, return_exceptions=True)


async def each_input(inputs: AsyncIterable[Inputs] | Iterable[Inputs]) -> AsyncIterator[Inputs]:
    if isinstance(inputs, AsyncIterable):
        async for item in inputs:
            yield item
    else:
        for item in inputs:
            yield item
