"""Stage hand-offs: the receiving stage copies its inputs itself, on its own work queue (its CUDA
stream), after the sender finished its work, and waits for the copy with its own work.

The CUDA side is replaced by seams (a recording work queue, a recording move), so the order
is checked here without a GPU; tests/gpu/test_pipeline_cuda.py checks the real streams.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from evenflow.server.workers.pipeline.stage import MicroBatch, Stage, move_tensor

pytestmark = pytest.mark.timeout(30)

_active = threading.local()


class RecordingQueue:
    """Stands for a stage's stream: records when it is current and when it is waited for."""

    def __init__(self, name: str, log: list[tuple[Any, ...]]) -> None:
        self.name = name
        self._log = log

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        _active.queue = self.name
        try:
            yield
        finally:
            _active.queue = None

    def wait(self) -> None:
        self._log.append(("wait", self.name))


def build(devices: list[torch.device], log: list[tuple[Any, ...]]) -> list[Stage]:
    def move(tensor: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
        log.append(("move", getattr(_active, "queue", None), threading.current_thread().name,
                    device, non_blocking))
        return tensor + 1  # a new tensor, as a copy is: each hand-off is visible in the answer

    queues = [RecordingQueue(f"queue{i}", log) for i in range(len(devices))]
    stages = [Stage(index=i, device=device, device_name=f"{device.type}{i}", speed=1.0,
                    module=torch.nn.Identity(), cpu_threads=1,
                    work_queue=lambda _device, q=queues[i]: q, move=move)
              for i, device in enumerate(devices)]
    for stage, following in itertools.pairwise(stages):
        stage.next = following
    return stages


def test_each_stage_copies_its_inputs_on_its_own_queue_after_the_sender_finished() -> None:
    log: list[tuple[Any, ...]] = []
    # A CPU -> CUDA -> CPU pipeline; the "CUDA" stage runs on the CPU through the seams.
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    stages = build([cpu, cuda, cpu], log)
    done = threading.Event()
    finished: list[MicroBatch] = []

    def finish(batch: MicroBatch) -> None:
        log.append(("finish",))
        finished.append(batch)
        done.set()

    try:
        stages[0].inbox.put(MicroBatch(activations=(), finish=finish,
                                       prepare=lambda: (torch.zeros(2),)))
        assert done.wait(timeout=20)
    finally:
        stages[0].stop()
        for stage in stages:
            stage.join()
    assert finished[0].error is None
    assert torch.equal(finished[0].activations[0], torch.full((2,), 2.0))  # two hand-offs
    assert log == [
        ("wait", "queue0"),  # stage 0's work is complete before anyone reads its outputs
        # Into the CUDA stage: on its own thread, with its own stream current, asynchronous.
        ("move", "queue1", "stage1:cuda1", cuda, True),
        ("wait", "queue1"),  # ... and its wait covers the copy
        # Out to the CPU: blocking, so the CPU stage reads only what has landed.
        ("move", "queue2", "stage2:cpu2", cpu, False),
        ("wait", "queue2"),
        ("finish",),
    ]


def test_a_failing_stage_finishes_its_batch_without_handing_it_on() -> None:
    log: list[tuple[Any, ...]] = []
    stages = build([torch.device("cpu"), torch.device("cpu")], log)
    stages[0].module = torch.nn.Linear(3, 3)  # the (2,) input does not fit: it raises
    done = threading.Event()
    finished: list[MicroBatch] = []

    def finish(batch: MicroBatch) -> None:
        finished.append(batch)
        done.set()

    try:
        stages[0].inbox.put(MicroBatch(activations=(), finish=finish,
                                       prepare=lambda: (torch.zeros(2),)))
        assert done.wait(timeout=20)
    finally:
        stages[0].stop()
        for stage in stages:
            stage.join()
    assert finished[0].error is not None and "stage 0 raised" in str(finished[0].error)
    assert not [entry for entry in log if entry[0] == "move"]  # nothing reached stage 1


def test_move_tensor_keeps_a_tensor_already_on_the_device() -> None:
    tensor = torch.zeros(2)
    assert move_tensor(tensor, torch.device("cpu"), False) is tensor
    assert move_tensor(tensor, torch.device("meta"), False).device.type == "meta"
