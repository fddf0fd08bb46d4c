"""Load over ModelStreamInfer: closed loop (one stream per slot, next request after each answer)
and open loop (one stream, requests written on schedule, answers matched by id)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import grpc

from evenflow.loadtest.runner import OK, RequestRecord, Target
from evenflow.proto import grpc_service_pb2 as pb


def _with_id(base: pb.ModelInferRequest, request_id: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest()
    request.CopyFrom(base)
    request.id = request_id
    return request


def _status(response: pb.ModelStreamInferResponse) -> str:
    if not response.error_message:
        return OK
    return response.error_message.partition(":")[0] or "UNKNOWN"


async def stream_closed_loop(target: Target, *, concurrency: int, duration_s: float,
                             records: list[RequestRecord] | None = None
                             ) -> list[RequestRecord]:
    now = time.monotonic
    end_s = now() + duration_s
    records = [] if records is None else records

    async def slot(index: int) -> None:
        call = target.stub(index).ModelStreamInfer(timeout=duration_s + target.timeout_s,
                                                   metadata=target.metadata)
        try:
            while (sent_s := now()) < end_s:
                await call.write(target.request)
                response = await call.read()
                records.append(RequestRecord(sent_s, sent_s, now(), _status(response)))
            await call.done_writing()
        finally:
            call.cancel()

    await asyncio.gather(*(slot(i) for i in range(concurrency)))
    return records


async def stream_open_loop(target: Target, send_offsets_s: Sequence[float],
                           start_s: float | None = None,
                           records: list[RequestRecord] | None = None
                           ) -> tuple[list[RequestRecord], int]:
    now = time.monotonic
    start_s = now() if start_s is None else start_s
    duration_s = (send_offsets_s[-1] if send_offsets_s else 0.0) + target.timeout_s
    call = target.stub(0).ModelStreamInfer(timeout=duration_s + 1.0, metadata=target.metadata)
    pending: dict[str, tuple[float, float]] = {}
    records = [] if records is None else records

    async def reader() -> None:
        while pending or not writer.done():
            response = await call.read()
            if response is grpc.aio.EOF:
                return
            times = pending.pop(response.infer_response.id, None)
            if times is not None:
                records.append(RequestRecord(times[0], times[1], now(), _status(response)))

    async def write_all() -> None:
        for index, offset_s in enumerate(send_offsets_s):
            intended_s = start_s + offset_s
            delay_s = intended_s - now()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            request_id = str(index)
            pending[request_id] = (intended_s, now())
            await call.write(_with_id(target.request, request_id))
        await call.done_writing()

    writer = asyncio.create_task(write_all())
    try:
        await asyncio.gather(writer, reader())
    finally:
        call.cancel()
    return records, 0
