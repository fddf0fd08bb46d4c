"""A replica's activation peak: the most device memory one of its batches held above what was
allocated when the batch began (activations, workspaces, the batch's inputs and outputs). The
placement adds it to the parameters and buffers for the memory a replica needs.

CUDA's caching allocator keeps one peak per device and process, and resetting it is the only
way to measure one batch; so a batch is measured only when it is larger than every batch this
replica measured before (the warm-up's, rising to the max batch: serving batches are then
never measured), under a lock per device, so two replicas in this process never reset the peak
under each other's measurement. Other batches running meanwhile on the device are counted in,
which errs on the side of more memory, never less.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol


class AllocatorStats(Protocol):
    """One device's allocator counters (``torch.cuda``'s for a GPU)."""

    def allocated_bytes(self) -> int: ...

    def reset_peak(self) -> None: ...

    def peak_bytes(self) -> int: ...


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def measurement_lock(device: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(device, threading.Lock())


class ActivationPeak:
    """The activation peak of one replica's batches, as its worker thread measures them."""

    def __init__(self, stats: AllocatorStats, lock: threading.Lock) -> None:
        self._stats = stats
        self._lock = lock
        self._largest_samples = 0  # the largest batch measured so far
        self.peak_bytes: int | None = None  # None until a batch has been measured

    @contextlib.contextmanager
    def measure(self, num_samples: int) -> Iterator[None]:
        """Around one batch's device work; a batch that raises is not counted."""
        if num_samples <= self._largest_samples:
            yield
            return
        with self._lock:
            before_bytes = self._stats.allocated_bytes()
            self._stats.reset_peak()
            yield
            held_bytes = max(0, self._stats.peak_bytes() - before_bytes)
        self.peak_bytes = max(self.peak_bytes or 0, held_bytes)
        self._largest_samples = num_samples


class CudaAllocatorStats:
    """``AllocatorStats`` of one CUDA device."""

    def __init__(self, index: int) -> None:
        self._index = index

    def allocated_bytes(self) -> int:
        import torch

        return int(torch.cuda.memory_allocated(self._index))

    def reset_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self._index)

    def peak_bytes(self) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated(self._index))
