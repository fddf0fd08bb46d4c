"""One pipeline stage: a thread that owns a device, runs its slice of the layers on each
micro-batch, and hands the activations to the next stage.

Hand-offs: a stage finishes a micro-batch (waits for every kernel it queued) before passing its
outputs on, and the receiving stage copies them onto its own device itself, queued on its own
stream, so its kernels are ordered after the copy by the stream and never read activations that
have not landed. The receiver keeps the sources alive until its own wait, so an asynchronous
copy never reads freed memory. Copies to the CPU are blocking: a CPU stage reads its inputs
right away.

A stage computes in its own dtype: it casts the floating activations it receives to it (on its
own queue, after the copy), so a float32 CPU stage can feed a bfloat16 GPU stage and back.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from evenflow.balancer.errors import EvenflowError
from evenflow.server.models.sim import set_thread_speed
from evenflow.server.workers.cuda_sync import blocking_event, wait_for_stream
from evenflow.server.workers.device_errors import classify_device_error

logger = logging.getLogger(__name__)

STOP = object()

Move = Callable[[torch.Tensor, torch.device, bool], torch.Tensor]  # (tensor, device, non_blocking)


@dataclass(eq=False)
class MicroBatch:
    """A batch moving through the stages. ``activations`` are the previous stage's outputs,
    on its device, complete (that stage waited for them)."""

    activations: tuple[Any, ...]
    finish: Callable[[MicroBatch], None]  # called on the last stage's thread (or on failure)
    prepare: Callable[[], tuple[Any, ...]] | None = None  # builds stage 0's inputs there
    stage_s: list[float] = field(default_factory=list)
    error: EvenflowError | None = None


class WorkQueue(Protocol):
    """Where a stage's device work is ordered: its CUDA stream, or nothing on a CPU."""

    def active(self) -> contextlib.AbstractContextManager[None]:
        """Makes this queue the current one of the calling thread: work launched inside goes
        on it."""

    def wait(self) -> None:
        """Blocks until everything queued so far has finished."""


class HostQueue:
    """A CPU stage's: its work is done when the call that launched it returns."""

    def active(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def wait(self) -> None:
        pass


class CudaQueue:
    """A CUDA stage's own stream (built on the stage's thread)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device)
        self._done = blocking_event()  # Stream.synchronize() would spin a core per stage

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        torch.cuda.set_device(self._device)
        with torch.cuda.stream(self._stream):
            yield

    def wait(self) -> None:
        wait_for_stream(self._stream, self._done)


def work_queue_for(device: torch.device) -> WorkQueue:
    return CudaQueue(device) if device.type == "cuda" else HostQueue()


def move_tensor(tensor: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    if tensor.device == device:
        return tensor
    if non_blocking and tensor.device.type == "cpu" and not tensor.is_pinned():
        # Pinned, the copy is one asynchronous DMA; from pageable memory CUDA first waits for
        # the stream and stages the bytes itself, which costs the same memcpy and a stall.
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=non_blocking)


def _drain(work: WorkQueue) -> None:
    """After a failure: what the batch queued before it (copies reading its sources) must be
    done before the sources are freed; a device that cannot even be waited for is already
    failing every batch."""
    try:
        work.wait()
    except Exception:
        logger.debug("waiting for a failed batch's work raised", exc_info=True)


def in_stage_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An activation in a stage's dtype: the stage before may compute in another (a float32
    CPU stage before a bfloat16 GPU stage), and a layer fed another dtype than its weights'
    fails or silently computes in the wider one. Floats only: ids and masks keep theirs."""
    if not tensor.is_floating_point() or tensor.dtype == dtype:
        return tensor
    return tensor.to(dtype)

class Stage:
    """Runs ``module`` on ``device`` in its own thread, with its own work queue (a CUDA stream).

    The inbox is bounded, so a slow stage pushes back on the one before it instead of letting
    activations pile up. A micro-batch that fails here is finished with its error and not
    passed on: only its own requests fail. ``dtype``: the floating dtype the stage computes in
    (received floating activations are cast to it; None: left as they come). ``work_queue``
    and ``move`` are seams: the queue a device's work goes on (built on the stage's thread) and
    how a tensor reaches the device.
    """

    def __init__(self, *, index: int, device: torch.device, device_name: str, speed: float,
                 module: torch.nn.Module, cpu_threads: int, inbox_size: int = 2,
                 dtype: torch.dtype | None = None,
                 work_queue: Callable[[torch.device], WorkQueue] = work_queue_for,
                 move: Move = move_tensor) -> None:
        self.index = index
        self.device = device
        self.device_name = device_name
        self.speed = speed
        self.module = module
        self.dtype = dtype
        self.next: Stage | None = None
        self.inbox: queue.Queue[Any] = queue.Queue(maxsize=inbox_size)
        self._cpu_threads = cpu_threads
        self._make_work_queue = work_queue
        self._move = move
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"stage{index}:{device_name}")
        self._thread.start()

    def _main(self) -> None:
        torch.set_num_threads(self._cpu_threads)
        work = self._make_work_queue(self.device)
        with torch.inference_mode(), work.active():
            self._loop(work)

    def _loop(self, work: WorkQueue) -> None:
        while True:
            item = self.inbox.get()
            if item is STOP:  # behind every micro-batch already sent: pass it on and end
                if self.next is not None:
                    self.next.inbox.put(STOP)
                return
            self._process(item, work)

    def _receive(self, sources: tuple[Any, ...]) -> tuple[Any, ...]:
        """The previous stage's outputs on this device, copied on this stage's queue (the
        current one): asynchronously into a CUDA device, blocking into the CPU."""
        non_blocking = self.device.type == "cuda"
        return tuple(self._cast(self._move(t, self.device, non_blocking))
                     if isinstance(t, torch.Tensor) else t for t in sources)

    def _cast(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.dtype is None else in_stage_dtype(tensor, self.dtype)

    def _process(self, batch: MicroBatch, work: WorkQueue) -> None:
        start = time.perf_counter()
        sources = batch.activations  # alive until work.wait(): an async copy may still read them
        outs: tuple[Any, ...] = ()
        try:
            if batch.prepare is not None:
                inputs, batch.prepare = batch.prepare(), None
            else:
                inputs = self._receive(sources)
            set_thread_speed(self.speed)
            out = self.module(*inputs)
            outs = out if isinstance(out, tuple) else (out,)
            work.wait()  # the outputs are complete when handed on; stage time includes kernels
        except Exception as exc:  # only the message is kept: the traceback holds the tensors
            batch.error = self._classified(exc)
        if batch.error is not None:
            _drain(work)
        del sources
        batch.stage_s.append(time.perf_counter() - start)
        if batch.error is None:
            batch.activations = outs
        if batch.error is not None or self.next is None:
            batch.finish(batch)
            return
        self.next.inbox.put(batch)

    def _classified(self, exc: Exception) -> EvenflowError:
        """What a stage raised, as the balancer's error: a sticky CUDA error (a device-side
        assert) is ``DeviceLost``, so the replica leaves routing (and a worker process is
        restarted) instead of failing every later batch; out of memory is ``OutOfMemory``
        however torch wrapped it (a traced stage's comes as the TorchScript interpreter's
        ``RuntimeError``), so the batch is split; anything else fails this batch only."""
        return classify_device_error(exc, device=f"{self.device_name} (stage {self.index})",
                                     raiser=f"stage {self.index}")

    def stop(self) -> None:
        """Stop this stage and, after the micro-batches ahead of it, every later one."""
        self.inbox.put(STOP)

    def join(self) -> None:
        self._thread.join()
