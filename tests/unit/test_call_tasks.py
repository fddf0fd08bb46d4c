"""grpc.aio's own tasks of the calls it serves: found while a call runs, and waited for by
``ServingPort.close`` after gRPC's stop, so that a process's exit has none left to cancel (a
cancelled one that had finished but for a turn of the loop makes grpc log a traceback)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

import grpc
import pytest

from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.edge.call_tasks import CallTasks, calls_ended, grpc_call_tasks
from evenflow.server.edge.grpc_server import PortSettings, ServingPort
from tests.unit.test_grpc_server import Failures, GatedModel, _edge, _request

pytestmark = pytest.mark.timeout(30)

SETTINGS = PortSettings("127.0.0.1", 0, 1 << 20)


class TaskRecordingModel(GatedModel):
    """A gated model that records the task each request was submitted from (the handler's)."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[asyncio.Task[Any] | None] = []

    async def submit(self, payload: Any, num_samples: int, deadline_s: float, priority: int,
                     shape_key: Hashable = None) -> Any:
        self.tasks.append(asyncio.current_task())
        return await super().submit(payload, num_samples, deadline_s, priority, shape_key)


class RecordingTasks:
    """``call_tasks`` for a port: those of ``find``, and an event set the first time it is
    asked while some are running (``close`` is then waiting for them)."""

    def __init__(self, find: CallTasks = grpc_call_tasks) -> None:
        self._find = find
        self.asked_while_running = asyncio.Event()

    def __call__(self) -> set[asyncio.Task[Any]]:
        found = self._find()
        if found:
            self.asked_while_running.set()
        return found

    async def closes_only_after_asking(self, closing: asyncio.Task[None]) -> None:
        """Wait until ``closing`` has asked for the tasks while some run, or has returned;
        it must not have returned."""
        asked = asyncio.create_task(self.asked_while_running.wait())
        try:
            await asyncio.wait({closing, asked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            asked.cancel()
        assert not closing.done(), "close returned while a call's task was still running"


async def test_a_calls_tasks_are_found_while_it_runs_and_none_after_close() -> None:
    model = TaskRecordingModel()
    port = ServingPort(edge=_edge(model, Failures()), name="test")
    bound = await port.start(SETTINGS)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{bound}")
    try:
        call = asyncio.ensure_future(
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(_request(), timeout=10))
        await model.submitted.wait()
        found = grpc_call_tasks()
        # The handler's own task and the one awaiting it: what grpcio names them is what
        # ``call_tasks`` relies on, so an upgrade that renames them fails here.
        assert len(found) == 2 and model.tasks[0] in found
        model.release.set()
        await call
        await port.drain()
        await port.close()
    finally:
        await channel.close()
    assert grpc_call_tasks() == set()


async def test_close_waits_after_the_stop_until_the_call_tasks_have_ended() -> None:
    ended = asyncio.Event()
    call_task = asyncio.create_task(ended.wait(), name="a call's task")
    tasks = RecordingTasks(lambda: set() if call_task.done() else {call_task})
    port = ServingPort(edge=_edge(GatedModel(), Failures()), call_tasks=tasks)
    await port.start(SETTINGS)
    await port.drain()
    closing = asyncio.create_task(port.close())
    try:
        await tasks.closes_only_after_asking(closing)
    finally:
        ended.set()
    await closing
    assert call_task.done() and not call_task.cancelled()


async def test_a_handler_still_ending_after_the_stop_is_waited_for() -> None:
    """A call whose connection the port closed is cancelled by gRPC core; its handler's
    cleanup is still running once gRPC's stop has returned."""
    entered, cleaned_up = asyncio.Event(), asyncio.Event()

    def forward(path: str) -> grpc.RpcMethodHandler:
        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            entered.set()
            try:
                await asyncio.Event().wait()  # never answered
            finally:  # cancelled: a cleanup that takes a while
                await cleaned_up.wait()
            raise AssertionError("unreachable")
        return grpc.unary_unary_rpc_method_handler(handle)

    tasks = RecordingTasks()
    port = ServingPort(edge=_edge(GatedModel(), Failures()), call_tasks=tasks)
    bound = await port.start(SETTINGS, forward=forward)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{bound}")
    try:
        call = asyncio.ensure_future(pb_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
            pb.ModelMetadataRequest(name="m"), timeout=10))
        await entered.wait()
        await port.drain()  # the forwarded call is not the edge's: ``answered`` skips it
        closing = asyncio.create_task(port.close())
        try:
            await tasks.closes_only_after_asking(closing)
        finally:
            cleaned_up.set()
        await closing
        assert grpc_call_tasks() == set()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()


async def test_calls_ended_gives_up_at_its_timeout_and_cancels_nothing() -> None:
    never = asyncio.Event()
    stuck = asyncio.create_task(never.wait())
    try:
        assert await calls_ended(0.0, lambda: {stuck}) == 1
        assert not stuck.done()
    finally:
        never.set()
        await stuck
    assert await calls_ended(0.0, set) == 0
