"""One pipeline stage: a thread that owns a device, runs its slice of the layers on each
micro-batch, and hands the activations to the next stage."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from evenflow.balancer.errors import BatchFailed, EvenflowError, OutOfMemory
from evenflow.server.models.sim import set_thread_speed

logger = logging.getLogger(__name__)

STOP = object()


@dataclass(eq=False)
class MicroBatch:
    """A batch moving through the stages. ``activations`` are the current stage's inputs."""

    activations: tuple[Any, ...]
    finish: Callable[[MicroBatch], None]  # called on the last stage's thread (or on failure)
    prepare: Callable[[], tuple[Any, ...]] | None = None  # builds stage 0's inputs there
    stage_s: list[float] = field(default_factory=list)
    error: EvenflowError | None = None
    ready: Any = None  # a CUDA event the next stage waits on before touching activations


class Stage:
    """Runs ``module`` on ``device`` in its own thread, with its own CUDA stream.

    The inbox is bounded, so a slow stage pushes back on the one before it instead of letting
    activations pile up. A micro-batch that fails here is finished with its error and not
    passed on: only its own requests fail.
    """

    def __init__(self, *, index: int, device: torch.device, device_name: str, speed: float,
                 module: torch.nn.Module, cpu_threads: int, inbox_size: int = 2) -> None:
        self.index = index
        self.device = device
        self.device_name = device_name
        self.speed = speed
        self.module = module
        self.next: Stage | None = None
        self.inbox: queue.Queue[Any] = queue.Queue(maxsize=inbox_size)
        self._cpu_threads = cpu_threads
        self._stream: Any = None
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"stage{index}:{device_name}")
        self._thread.start()

    def _main(self) -> None:
        torch.set_num_threads(self._cpu_threads)
        with torch.inference_mode():
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
                self._stream = torch.cuda.Stream(self.device)
                with torch.cuda.stream(self._stream):
                    self._loop()
            else:
                self._loop()

    def _loop(self) -> None:
        while True:
            item = self.inbox.get()
            if item is STOP:  # behind every micro-batch already sent: pass it on and end
                if self.next is not None:
                    self.next.inbox.put(STOP)
                return
            self._process(item)

    def _process(self, batch: MicroBatch) -> None:
        start = time.perf_counter()
        try:
            if batch.prepare is not None:
                batch.activations, batch.prepare = batch.prepare(), None
            if batch.ready is not None:
                torch.cuda.current_stream().wait_event(batch.ready)
            set_thread_speed(self.speed)
            out = self.module(*batch.activations)
            outs = out if isinstance(out, tuple) else (out,)
            if self.next is not None and self.next.device != self.device:
                # Device to device, no host round trip; ordered by an event, not a sync.
                outs = tuple(t.to(self.next.device, non_blocking=True) for t in outs)
            if self._stream is not None:
                batch.ready = torch.cuda.Event()
                batch.ready.record(self._stream)
                batch.ready.synchronize()  # stage time must include the kernels it launched
            else:
                batch.ready = None
        except torch.OutOfMemoryError as exc:
            batch.error = OutOfMemory(f"stage {self.index} on {self.device_name}: {exc}")
        except Exception as exc:
            batch.error = BatchFailed(f"stage {self.index} raised {type(exc).__name__}: {exc}")
        batch.stage_s.append(time.perf_counter() - start)
        if batch.error is not None or self.next is None:
            if batch.error is None:
                batch.activations = outs
            batch.finish(batch)
            return
        batch.activations = outs
        self.next.inbox.put(batch)

    def stop(self) -> None:
        """Stop this stage and, after the micro-batches ahead of it, every later one."""
        self.inbox.put(STOP)

    def join(self) -> None:
        self._thread.join()
