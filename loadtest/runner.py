"""Load generation against any KServe v2 server (over gRPC here, over HTTP with
``http_target.HttpTarget``): closed loop (N requests always outstanding)
and open loop (requests sent at scheduled times, whatever the server does).

Open-loop latency is measured from each request's *intended* send time, so a server that stalls
cannot hide the queueing it causes (no coordinated omission); the generator also records how far
behind schedule it sent, so a generator that cannot keep up is reported, not mistaken for the
server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from evenflow.client import numpy_dtype
from evenflow.client.credentials import Credentials, aio_channel
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

OK = "OK"


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request. Times are monotonic seconds; ``intended_s`` equals ``sent_s`` in closed loop."""

    intended_s: float
    sent_s: float
    done_s: float
    status: str  # "OK" or a gRPC status code name

    @property
    def latency_s(self) -> float:
        return self.done_s - self.intended_s


class LoadTarget(Protocol):
    """What the loops send to: one request (built once) to one server, over some transport;
    ``send`` answers "OK" or the failure's gRPC status code name, and never raises."""

    url: str
    timeout_s: float

    async def send(self, index: int) -> str: ...

    async def close(self) -> None: ...


class Target:
    """A server, a model and the request to send it (built once: the generator must stay cheap)."""

    def __init__(self, url: str, request: pb.ModelInferRequest, *, timeout_s: float = 30.0,
                 num_channels: int = 1, credentials: Credentials | None = None) -> None:
        options = [("grpc.max_receive_message_length", 1 << 28),
                   ("grpc.max_send_message_length", 1 << 28)]
        # Several channels (distinct sub-channel args) spread load over several HTTP/2 connections.
        self._channels = [aio_channel(url, [*options, ("evenflow.lt", i)], credentials)
                          for i in range(num_channels)]
        self.metadata = credentials.metadata if credentials is not None else None
        self._stubs = [pb_grpc.GRPCInferenceServiceStub(c) for c in self._channels]
        self.request = request
        self.timeout_s = timeout_s
        self.url = url

    def stub(self, index: int) -> pb_grpc.GRPCInferenceServiceStub:
        return self._stubs[index % len(self._stubs)]

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def send(self, index: int) -> str:
        try:
            await self.stub(index).ModelInfer(self.request, timeout=self.timeout_s,
                                              metadata=self.metadata)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        return OK


async def closed_loop(target: LoadTarget, *, concurrency: int, duration_s: float,
                      records: list[RequestRecord] | None = None) -> list[RequestRecord]:
    """``concurrency`` workers, each sending its next request as soon as the last one returns,
    until ``duration_s`` has passed. Records go into ``records`` (a new list by default) as
    requests finish, so a progress reporter can read them while the loop runs."""
    now = time.monotonic
    end_s = now() + duration_s
    records = [] if records is None else records

    async def worker(index: int) -> None:
        while (sent_s := now()) < end_s:
            status = await target.send(index)
            records.append(RequestRecord(sent_s, sent_s, now(), status))

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return records


async def open_loop(target: LoadTarget, send_offsets_s: Sequence[float], *,
                    max_outstanding: int = 20_000, start_s: float | None = None,
                    records: list[RequestRecord] | None = None
                    ) -> tuple[list[RequestRecord], int]:
    """Send at ``start_s + offset`` for each offset (``start_s``: monotonic, default now).
    Returns the records and how many requests were not sent because ``max_outstanding`` were
    already in flight (counted as generator drops)."""
    now = time.monotonic
    start_s = now() if start_s is None else start_s
    records = [] if records is None else records
    tasks: set[asyncio.Task[None]] = set()
    dropped = 0

    async def one(index: int, intended_s: float) -> None:
        sent_s = now()
        status = await target.send(index)
        records.append(RequestRecord(intended_s, sent_s, now(), status))

    try:
        for index, offset_s in enumerate(send_offsets_s):
            intended_s = start_s + offset_s
            delay_s = intended_s - now()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            if len(tasks) >= max_outstanding:
                dropped += 1
                continue
            task = asyncio.create_task(one(index, intended_s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        # Stopped early (cancelled): the requests in flight go too, and are waited for.
        left = list(tasks)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
    return records, dropped


def binned_throughput(records: Sequence[RequestRecord], start_s: float, end_s: float,
                      bin_s: float) -> list[float]:
    """Successful completions per second in consecutive bins from ``start_s``."""
    num_bins = max(1, int((end_s - start_s) / bin_s))
    counts = [0] * num_bins
    for record in records:
        if record.status == OK and start_s <= record.done_s < end_s:
            counts[min(num_bins - 1, int((record.done_s - start_s) / bin_s))] += 1
    return [c / bin_s for c in counts]


def mlp_like_request(model: str, input_name: str, shape: Sequence[int],
                     datatype: str = "FP32", data: bytes | None = None) -> pb.ModelInferRequest:
    """A raw-content request of zeros (or ``data``) for one input."""
    itemsize = numpy_dtype(datatype).itemsize
    count = 1
    for dim in shape:
        count *= dim
    return pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name=input_name, datatype=datatype,
                                                      shape=list(shape))],
        raw_input_contents=[data if data is not None else bytes(count * itemsize)])
