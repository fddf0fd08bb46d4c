"""Load over ModelStreamInfer: closed loop (one stream per slot, next request after each answer)
and open loop (one stream, requests written on schedule, answers matched by id).

Every request is recorded once, as the unary loops record theirs: answered (OK or the status in
its ``error_message``), unanswered past ``--timeout-s`` (DEADLINE_EXCEEDED), or outstanding when
its stream broke (the stream's status code). A broken stream is reopened while the load has time
left, so one failure costs the requests it carried, not the run."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import grpc

from evenflow.client import _codec as codec
from evenflow.client.errors import InferenceServerError
from evenflow.loadtest.runner import OK, RequestRecord, Target
from evenflow.proto import grpc_service_pb2 as pb

DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED.name
# A stream the server closed with OK while a request on it was still unanswered: no status
# names that, and the request did fail.
ENDED_UNANSWERED = grpc.StatusCode.UNKNOWN.name
# What a call raises once it has ended: the status (AioRpcError), or InvalidStateError when it
# ended with OK and is written to.
_STREAM_ENDED = (grpc.aio.AioRpcError, asyncio.InvalidStateError)


def _with_id(base: pb.ModelInferRequest, request_id: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest()
    request.CopyFrom(base)
    request.id = request_id
    return request


def _status(response: pb.ModelStreamInferResponse) -> str:
    """OK, or the failure's status code name: the client's parse of the error message (free
    text is UNKNOWN), never the text itself, which is no status and would be cut to the
    record's width."""
    if not response.error_message:
        return OK
    error = codec.parse_stream_response(response).error  # an error skips the outputs' parse
    if isinstance(error, InferenceServerError):
        return error.code.name
    return grpc.StatusCode.UNKNOWN.name


def _ended_status(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code().name
    return ENDED_UNANSWERED


async def stream_closed_loop(target: Target, *, concurrency: int, duration_s: float,
                             records: list[RequestRecord] | None = None
                             ) -> list[RequestRecord]:
    now = time.monotonic
    end_s = now() + duration_s
    records = [] if records is None else records

    async def ask(call: grpc.aio.StreamStreamCall) -> tuple[str, bool]:
        """One request's status, and whether the stream is still usable."""
        try:
            # Cancelling a read cancels the call, so a request past its deadline costs its
            # stream: the slot opens another.
            async with asyncio.timeout(target.timeout_s):
                await call.write(target.request)
                response = await call.read()
        except TimeoutError:
            return DEADLINE_EXCEEDED, False
        except _STREAM_ENDED as exc:
            return _ended_status(exc), False
        if response is grpc.aio.EOF:
            return ENDED_UNANSWERED, False
        return _status(response), True

    async def slot(index: int) -> None:
        while now() < end_s:
            # The stream's own deadline only backs up the per-request one.
            call = target.stub(index).ModelStreamInfer(timeout=end_s - now() + target.timeout_s,
                                                       metadata=target.metadata)
            try:
                while (sent_s := now()) < end_s:
                    status, usable = await ask(call)
                    records.append(RequestRecord(sent_s, sent_s, now(), status))
                    if not usable:
                        break
                else:
                    with contextlib.suppress(*_STREAM_ENDED):
                        await call.done_writing()
            finally:
                call.cancel()

    await asyncio.gather(*(slot(i) for i in range(concurrency)))
    return records


async def stream_open_loop(target: Target, send_offsets_s: Sequence[float],
                           start_s: float | None = None,
                           records: list[RequestRecord] | None = None
                           ) -> tuple[list[RequestRecord], int]:
    records = [] if records is None else records
    await _OpenLoop(target, send_offsets_s, time.monotonic() if start_s is None else start_s,
                    records).run()
    return records, 0


class _OpenLoop:
    """One stream at a time, requests written on schedule with ids, answers matched by id."""

    def __init__(self, target: Target, send_offsets_s: Sequence[float], start_s: float,
                 records: list[RequestRecord]) -> None:
        self.target = target
        self.offsets_s = send_offsets_s
        self.start_s = start_s
        self.records = records
        # The last request's deadline: nothing is waited for past it.
        self.end_s = start_s + (send_offsets_s[-1] if send_offsets_s else 0.0) + target.timeout_s
        # Sent and unanswered, in send order (the first is the first to expire): id -> times.
        self.pending: dict[str, tuple[float, float]] = {}
        self.sent = asyncio.Event()  # a request joined ``pending``
        self.settled = asyncio.Event()  # a request left it
        self.next_index = 0  # of the schedule: a reopened stream goes on from here

    async def run(self) -> None:
        expiry = asyncio.create_task(self.expire())
        try:
            await self.one_stream()
            while self.next_index < len(self.offsets_s):  # a stream broke: the rest on a new one
                await self.one_stream()
        finally:
            expiry.cancel()
            await asyncio.gather(expiry, return_exceptions=True)

    def settle(self, request_id: str, status: str) -> None:
        times = self.pending.pop(request_id, None)
        if times is not None:  # else it expired, or its stream broke, first
            self.records.append(RequestRecord(times[0], times[1], time.monotonic(), status))
            self.settled.set()

    def fail_outstanding(self, status: str) -> None:
        for request_id in list(self.pending):
            self.settle(request_id, status)

    async def expire(self) -> None:
        """The per-request deadline (a stream's own deadline is one for all its requests)."""
        while True:
            if not self.pending:
                self.sent.clear()
                await self.sent.wait()
                continue
            request_id, (_, sent_s) = next(iter(self.pending.items()))
            if (left_s := sent_s + self.target.timeout_s - time.monotonic()) > 0:
                await asyncio.sleep(left_s)
            else:
                self.settle(request_id, DEADLINE_EXCEEDED)

    async def read_all(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            while (response := await call.read()) is not grpc.aio.EOF:
                self.settle(response.infer_response.id, _status(response))
            status = ENDED_UNANSWERED
        except grpc.aio.AioRpcError as exc:
            status = exc.code().name
        self.fail_outstanding(status)  # the stream has ended: nothing more is answered on it

    async def one_stream(self) -> None:
        """Write the schedule on one stream until it is all sent and settled, or the stream
        ends early (what was outstanding on it is then failed with its status)."""
        call = self.target.stub(0).ModelStreamInfer(
            timeout=max(0.0, self.end_s - time.monotonic()) + 1.0,
            metadata=self.target.metadata)
        reader = asyncio.create_task(self.read_all(call))
        try:
            while self.next_index < len(self.offsets_s):
                intended_s = self.start_s + self.offsets_s[self.next_index]
                if (delay_s := intended_s - time.monotonic()) > 0:
                    await asyncio.sleep(delay_s)
                if reader.done():  # ended while we waited: the request goes on a new stream
                    return
                request_id = str(self.next_index)
                self.next_index += 1
                self.pending[request_id] = (intended_s, time.monotonic())
                self.sent.set()
                try:
                    await call.write(_with_id(self.target.request, request_id))
                except _STREAM_ENDED as exc:
                    self.fail_outstanding(_ended_status(exc))
                    return
            with contextlib.suppress(*_STREAM_ENDED):
                await call.done_writing()
            while self.pending:  # each leaves by its answer, its deadline or the stream's end
                self.settled.clear()
                await self.settled.wait()
        finally:
            call.cancel()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
