"""The activation peak a replica measures for the placement (``workers.activation_peak``) and
what the placement makes of it, with a fake allocator: which batches are measured, what a
measurement counts, and the memory a replica is then said to need."""

from __future__ import annotations

import threading

import pytest

from evenflow.balancer.job import WorkerStatus
from evenflow.server.engine.placement import replica_memory_bytes
from evenflow.server.workers.activation_peak import ActivationPeak, measurement_lock

pytestmark = pytest.mark.timeout(10)


class FakeAllocator:
    """A device's allocator: ``allocate`` and ``free`` move the counters as CUDA's do."""

    def __init__(self, allocated_bytes: int = 0) -> None:
        self.allocated = allocated_bytes
        self.peak = allocated_bytes
        self.resets = 0

    def allocate(self, size: int) -> None:
        self.allocated += size
        self.peak = max(self.peak, self.allocated)

    def free(self, size: int) -> None:
        self.allocated -= size

    def allocated_bytes(self) -> int:
        return self.allocated

    def reset_peak(self) -> None:
        self.resets += 1
        self.peak = self.allocated

    def peak_bytes(self) -> int:
        return self.peak


def batch(meter: ActivationPeak, allocator: FakeAllocator, samples: int,
          bytes_per_sample: int) -> None:
    with meter.measure(samples):
        allocator.allocate(samples * bytes_per_sample)  # activations, freed by the batch's end
        allocator.free(samples * bytes_per_sample)


def test_a_batch_counts_what_it_held_above_what_was_allocated_before_it() -> None:
    allocator = FakeAllocator(allocated_bytes=1000)  # the parameters, and an old peak above them
    allocator.peak = 5000
    meter = ActivationPeak(allocator, threading.Lock())
    assert meter.peak_bytes is None
    batch(meter, allocator, 4, 100)
    assert meter.peak_bytes == 400  # neither the parameters nor the old peak


def test_only_a_batch_larger_than_every_measured_one_resets_the_device_peak() -> None:
    allocator = FakeAllocator()
    meter = ActivationPeak(allocator, threading.Lock())
    for samples in (1, 8, 64):  # the warm-up's sizes
        batch(meter, allocator, samples, 10)
    assert (meter.peak_bytes, allocator.resets) == (640, 3)
    for samples in (64, 3, 64):  # serving: never measured, so never resets another's peak
        batch(meter, allocator, samples, 1000)
    assert (meter.peak_bytes, allocator.resets) == (640, 3)


def test_a_batch_that_raises_is_not_counted_and_is_measured_again() -> None:
    allocator = FakeAllocator()
    meter = ActivationPeak(allocator, threading.Lock())
    with pytest.raises(MemoryError), meter.measure(16):
        allocator.allocate(10_000)
        raise MemoryError
    assert meter.peak_bytes is None
    allocator.free(10_000)
    batch(meter, allocator, 16, 10)
    assert meter.peak_bytes == 160


def test_a_measurement_holds_its_device_lock_and_only_its_device_lock() -> None:
    """What keeps a second replica on the device from resetting the peak under the first's
    measurement: both wait on one lock per device."""
    allocator = FakeAllocator()
    lock = measurement_lock("cuda:7")
    assert measurement_lock("cuda:7") is lock and measurement_lock("cuda:6") is not lock
    meter = ActivationPeak(allocator, lock)
    with meter.measure(4):
        assert not lock.acquire(blocking=False)
    assert not lock.locked()
    with meter.measure(4):  # not measured: no lock taken
        assert lock.acquire(blocking=False)
        lock.release()


def test_a_replica_needs_its_parameters_and_its_largest_measured_peak() -> None:
    statuses = [WorkerStatus(activation_peak_bytes=b) for b in (300, None, 500)]
    assert replica_memory_bytes(None, 1000, statuses) == 1500
    assert replica_memory_bytes(None, 1000, [WorkerStatus()]) == 1000  # a CPU: nothing measured
    assert replica_memory_bytes(4096, 1000, statuses) == 4096  # declared in the configuration
