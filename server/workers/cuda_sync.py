"""Waiting for a CUDA stream without burning a core.

``Stream.synchronize`` spin-waits (CUDA's default schedule on a host with more cores than GPUs),
so every worker thread waiting on its GPU holds a core at 100% that the event loop and the
other workers need. An event created with ``blocking=True`` (``cudaEventBlockingSync``) makes
the waiting thread sleep in the driver until the GPU signals it instead.
"""

from __future__ import annotations

import torch


def blocking_event() -> torch.cuda.Event:
    """An event whose ``synchronize`` sleeps instead of spinning (reuse it: one per thread)."""
    return torch.cuda.Event(blocking=True)


def wait_for_stream(stream: torch.cuda.Stream, event: torch.cuda.Event | None = None) -> None:
    """Block this thread, asleep, until the work queued on ``stream`` so far has finished.
    ``event``: a ``blocking_event()`` to reuse (a new one is made when None); an event is
    re-recorded each time, so one per waiting thread suffices."""
    if event is None:
        event = blocking_event()
    event.record(stream)
    event.synchronize()
