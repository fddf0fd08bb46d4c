"""Waiting for the GPU sleeps on a blocking event instead of spinning in Stream.synchronize."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from evenflow.server.models.builtin import build_mlp
from evenflow.server.workers import cuda_sync
from evenflow.server.workers.devices import DeviceSpec
from evenflow.server.workers.torch_worker import TorchWorker

pytestmark = pytest.mark.timeout(30)


class SpinningStream:
    """A stream whose own synchronize is the spin-wait to avoid."""

    def synchronize(self) -> None:
        raise AssertionError("Stream.synchronize spin-waits; wait on a blocking event")


class FakeEvent:
    made: ClassVar[list[FakeEvent]] = []

    def __init__(self, *, blocking: bool = False, **flags: Any) -> None:
        self.blocking = blocking
        self.calls: list[tuple[str, object]] = []
        FakeEvent.made.append(self)

    def record(self, stream: object) -> None:
        self.calls.append(("record", stream))

    def synchronize(self) -> None:
        self.calls.append(("synchronize", None))


@pytest.fixture
def fake_events(monkeypatch: pytest.MonkeyPatch) -> list[FakeEvent]:
    FakeEvent.made = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    return FakeEvent.made


def test_waiting_records_a_blocking_event_on_the_stream_then_sleeps_on_it(
        fake_events: list[FakeEvent]) -> None:
    stream: Any = SpinningStream()
    cuda_sync.wait_for_stream(stream)
    (event,) = fake_events
    assert event.blocking
    assert event.calls == [("record", stream), ("synchronize", None)]


def test_a_given_event_is_reused(fake_events: list[FakeEvent]) -> None:
    stream: Any = SpinningStream()
    event = cuda_sync.blocking_event()
    cuda_sync.wait_for_stream(stream, event)
    cuda_sync.wait_for_stream(stream, event)
    assert fake_events == [event]
    assert event.blocking
    assert [name for name, _ in event.calls] == ["record", "synchronize"] * 2


async def test_a_worker_with_a_stream_waits_on_its_blocking_event(
        fake_events: list[FakeEvent]) -> None:
    worker = TorchWorker(model_name="mlp", definition=build_mlp(),
                         device=DeviceSpec("cpu", 0, "cpu:0"))
    try:
        stream, event = SpinningStream(), cuda_sync.blocking_event()
        # What _thread_main_context sets up on a CUDA device, which this machine lacks.
        worker._stream, worker._stream_done = stream, event
        worker._sync()
    finally:
        await worker.close()
    assert event.calls == [("record", stream), ("synchronize", None)]
