"""``loadtest --streaming`` against an in-process ModelStreamInfer servicer that breaks its
streams or leaves requests unanswered: every request is recorded once, a broken stream costs
the requests outstanding on it (with its status code) and is reopened while the load has time,
a request unanswered past ``--timeout-s`` is DEADLINE_EXCEEDED, and a stream's error message is
recorded by its status code, never by its text."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest

from evenflow.loadtest.runner import RequestRecord, Target
from evenflow.loadtest.streaming import _status, stream_closed_loop, stream_open_loop
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

# Answers per stream before it breaks, by model: ``brittle`` breaks on its second request, so a
# closed loop sees a break after one round trip, at any speed.
ANSWERS_BEFORE_ABORT = {"flaky": 3, "brittle": 1}


class BreakingStreams(pb_grpc.GRPCInferenceServiceServicer):
    """Per stream, by the request's model: ``flaky`` (``brittle``) answers 3 (1) requests,
    then aborts the stream UNAVAILABLE on the next; ``hang`` answers the first and never
    another."""

    async def ModelStreamInfer(
            self, request_iterator: AsyncIterator[pb.ModelInferRequest],
            context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ModelStreamInferResponse]:
        answered = 0
        async for request in request_iterator:
            if answered == ANSWERS_BEFORE_ABORT.get(request.model_name):
                await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
            if request.model_name == "hang" and answered == 1:
                await asyncio.Event().wait()  # until the client gives up (cancels)
            answered += 1
            yield pb.ModelStreamInferResponse(
                infer_response=pb.ModelInferResponse(model_name=request.model_name,
                                                      id=request.id))


@pytest.fixture
async def url() -> AsyncIterator[str]:
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(BreakingStreams(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def target_for(url: str, model: str, timeout_s: float) -> Target:
    return Target(url, pb.ModelInferRequest(model_name=model), timeout_s=timeout_s)


def statuses(records: list[RequestRecord]) -> Counter[str]:
    return Counter(r.status for r in records)


async def test_a_closed_loop_records_a_broken_stream_and_reopens_it(url: str) -> None:
    target = target_for(url, "brittle", timeout_s=5.0)
    answers = ANSWERS_BEFORE_ABORT["brittle"]
    try:
        # Time for a round trip and the next request on its stream, which breaks it.
        records = await stream_closed_loop(target, concurrency=2, duration_s=1.0)
    finally:
        await target.close()
    counts = statuses(records)
    assert set(counts) == {"OK", "UNAVAILABLE"}  # a stream broke, with its status code
    # Each broken stream carried its answers first; at most the 2 last streams are unbroken.
    assert answers * counts["UNAVAILABLE"] <= counts["OK"] \
        <= answers * (counts["UNAVAILABLE"] + 2)


async def test_an_open_loop_records_every_request_of_a_broken_stream(url: str) -> None:
    target = target_for(url, "flaky", timeout_s=5.0)
    try:
        records, dropped = await stream_open_loop(target, [0.0] * 6 + [0.05] * 6)
    finally:
        await target.close()
    counts = statuses(records)
    assert len(records) == 12 and dropped == 0  # each request once, answered or failed
    assert set(counts) == {"OK", "UNAVAILABLE"}
    assert counts["OK"] >= ANSWERS_BEFORE_ABORT["flaky"]


async def test_a_closed_loop_request_past_its_deadline_is_deadline_exceeded(url: str) -> None:
    target = target_for(url, "hang", timeout_s=0.3)
    try:
        records = await stream_closed_loop(target, concurrency=1, duration_s=0.2)
    finally:
        await target.close()
    assert [r.status for r in records] == ["OK", "DEADLINE_EXCEEDED"]
    assert 0.3 <= records[1].latency_s < 1.0  # its own deadline, not the stream's


async def test_an_open_loop_request_past_its_deadline_is_deadline_exceeded(url: str) -> None:
    target = target_for(url, "hang", timeout_s=0.3)
    began_s = time.monotonic()
    try:
        records, _ = await stream_open_loop(target, [0.0, 0.0], began_s)
    finally:
        await target.close()
    assert sorted(r.status for r in records) == ["DEADLINE_EXCEEDED", "OK"]
    late = next(r for r in records if r.status == "DEADLINE_EXCEEDED")
    assert 0.3 <= late.done_s - late.sent_s < 1.0  # its own deadline, not the stream's (1.3 s)


@pytest.mark.parametrize(("message", "status"), [
    ("", "OK"),
    ("RESOURCE_EXHAUSTED: queue full", "RESOURCE_EXHAUSTED"),
    ("the model raised ValueError: shapes (3,4) and (5,) not aligned", "UNKNOWN"),
])
def test_a_stream_error_is_recorded_by_its_status_code(message: str, status: str) -> None:
    assert _status(pb.ModelStreamInferResponse(error_message=message)) == status
