"""Warm-up: replicas run batches of a few sizes before their model is READY, through the Worker
seam, so the balancer's latency fit and statistics never see them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from evenflow.balancer import BalancerConfig, BatchResult, BatchTiming, Job, Worker, WorkerStatus
from evenflow.server.config.server_config import ModelConfig, ServerConfig
from evenflow.server.engine import model_control
from evenflow.server.engine.model_control import ModelManager, ModelState
from evenflow.server.engine.served import ModelTable
from evenflow.server.engine.warmup import (
    WarmupFailed,
    sample_inputs,
    warm_up,
    warmup_batch_sizes,
    warmup_batches,
)
from evenflow.server.models.spec import ModelDefinition, Padding, TensorSpec
from evenflow.server.workers.activation_peak import ActivationPeak
from evenflow.server.workers.devices import DeviceSpec, parse_devices
from tests.unit.test_activation_peak import FakeAllocator

pytestmark = pytest.mark.timeout(30)

_MODULE = __name__


def linear() -> ModelDefinition:
    torch.manual_seed(0)
    return ModelDefinition(module=torch.nn.Linear(4, 2).eval(),
                           inputs=[TensorSpec("x", "FP32", (-1, 4))],
                           outputs=[TensorSpec("y", "FP32", (-1, 2))])


class _Raises(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("weights not loaded")


def broken() -> ModelDefinition:
    return ModelDefinition(module=_Raises(), inputs=[TensorSpec("x", "FP32", (-1, 4))],
                           outputs=[TensorSpec("y", "FP32", (-1, 4))], traceable=False)


class CountingWorker:
    """Delegates to a real worker and records every batch it is given, in order."""

    def __init__(self, inner: Worker) -> None:
        self.inner = inner
        self.batches: list[int] = []
        self.closed = False

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def devices(self) -> Sequence[str]:
        return self.inner.devices

    @property
    def max_in_flight(self) -> int:
        return self.inner.max_in_flight

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        self.batches.append(sum(job.num_samples for job in jobs))
        return await self.inner.run(jobs)

    def status(self) -> WorkerStatus:
        return self.inner.status()

    async def set_device_speed(self, device: str, speed: float) -> float:
        return await self.inner.set_device_speed(device, speed)

    async def set_device_fault(self, device: str, fault: str, count: int) -> None:
        await self.inner.set_device_fault(device, fault, count)

    async def restart(self) -> None:
        await self.inner.restart()

    async def close(self) -> None:
        self.closed = True
        await self.inner.close()


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> list[CountingWorker]:
    """Every worker the model manager builds, wrapped to count its batches."""
    built: list[CountingWorker] = []
    real = model_control.build_workers

    async def build(*args: object, **kwargs: object) -> list[Worker]:
        workers = [CountingWorker(w) for w in await real(*args, **kwargs)]  # type: ignore[arg-type]
        built.extend(workers)
        return list(workers)

    monkeypatch.setattr(model_control, "build_workers", build)
    return built


def manager_for(source: str, *, warmup_batches: int, devices: str = "cpu:0,cpu:1",
                max_batch: int = 8) -> tuple[ModelManager, ModelTable]:
    config = ServerConfig(models=(ModelConfig("m", source),), workers="thread",
                          warmup_batches=warmup_batches,
                          balancer=BalancerConfig(max_batch=max_batch))
    table = ModelTable()
    return ModelManager(config, table, parse_devices(devices)), table


def test_batch_sizes_run_from_one_to_the_max_batch() -> None:
    assert warmup_batch_sizes(64, 3) == [1, 8, 64]
    assert warmup_batch_sizes(8, 3) == [1, 3, 8]
    assert warmup_batch_sizes(64, 2) == [1, 64]
    assert warmup_batch_sizes(1, 3) == [1, 1, 1]  # a profiling executor wants repeats anyway
    assert warmup_batch_sizes(64, 1) == [64]  # one batch: the size whose memory is counted
    assert warmup_batch_sizes(64, 0) == []


def test_sample_inputs_follow_the_input_spec_in_wire_storage() -> None:
    specs = [TensorSpec("f", "FP16", (-1, 3)), TensorSpec("b", "BF16", (-1, 2)),
             TensorSpec("ids", "INT64", (-1, 5)), TensorSpec("mask", "BOOL", (-1, 5))]
    arrays = sample_inputs(specs, 4, None)
    assert arrays is not None
    assert [(a.shape, a.dtype) for a in arrays] == [
        ((4, 3), np.float16), ((4, 2), np.uint16), ((4, 5), np.int64), ((4, 5), np.bool_)]
    assert not arrays[2].any()  # index 0: valid in any embedding
    as_floats = (arrays[1].astype(np.uint32) << 16).view(np.float32)
    assert np.isfinite(as_floats).all() and as_floats.any()


def test_variable_dims_take_the_given_length_or_are_skipped() -> None:
    specs = [TensorSpec("ids", "INT64", (-1, -1)), TensorSpec("x", "FP32", (-1, -1, 3))]
    padded = sample_inputs(specs, 2, 16)
    assert padded is not None and [a.shape for a in padded] == [(2, 16), (2, 16, 3)]
    assert sample_inputs(specs, 2, None) is None
    assert sample_inputs([TensorSpec("text", "BYTES", (-1, 1))], 2, None) is None


def test_the_first_batch_of_the_max_size_takes_the_largest_bucket() -> None:
    """The worst case a replica will run, so the activation peak the placement counts is
    measured there; the others take the smallest bucket."""
    padding = Padding(buckets=(4, 8, 16, 32))

    def plan(max_batch: int, count: int) -> list[tuple[int, int | None]]:
        return [(b.size, b.length) for b in warmup_batches(max_batch, count, padding)]

    assert plan(8, 3) == [(1, 4), (3, 4), (8, 32)]
    assert plan(8, 1) == [(8, 32)]
    assert plan(1, 3) == [(1, 32), (1, 4), (1, 4)]  # only the first is measured
    assert plan(8, 0) == []
    assert [(b.size, b.length) for b in warmup_batches(8, 2, None)] == [(1, None), (8, None)]


class _FakeReplica:
    """What a fake replica here does besides running batches: no device to slow or fault."""

    async def set_device_speed(self, device: str, speed: float) -> float:
        raise KeyError(device)

    async def set_device_fault(self, device: str, fault: str, count: int) -> None:
        raise KeyError(device)

    async def restart(self) -> None:
        pass

    async def close(self) -> None:
        pass


class Attention(_FakeReplica):
    """A replica on a fake allocator whose batches hold ``size * length**2`` bytes (attention
    scores), measured as a GPU replica measures them (``ActivationPeak``)."""

    name = "attention@cuda0"
    devices = ("cuda0",)
    max_in_flight = 1

    def __init__(self) -> None:
        self.allocator = FakeAllocator()
        self.meter = ActivationPeak(self.allocator, threading.Lock())

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        (x,) = jobs[0].payload
        size, length = x.shape
        with self.meter.measure(jobs[0].num_samples):
            self.allocator.allocate(size * length * length)
            self.allocator.free(size * length * length)
        return BatchResult([("y", x)], BatchTiming(0.0, 0.001, 0.0))

    def status(self) -> WorkerStatus:
        return WorkerStatus(activation_peak_bytes=self.meter.peak_bytes)


@pytest.mark.parametrize("batches", [1, 3])
async def test_the_warmup_measures_the_peak_of_the_largest_batch_at_the_longest_length(
        batches: int) -> None:
    definition = ModelDefinition(module=torch.nn.Identity(),
                                 inputs=[TensorSpec("x", "FP32", (-1, -1))],
                                 outputs=[TensorSpec("y", "FP32", (-1, -1))],
                                 padding=Padding(buckets=(4, 8, 16, 32)))
    worker = Attention()
    await warm_up([worker], definition, model_name="a", max_batch=8, batches=batches)
    assert worker.status().activation_peak_bytes == 8 * 32 * 32


async def test_models_warm_up_before_ready_and_the_balancer_counts_none_of_it(
        counting: list[CountingWorker]) -> None:
    manager, table = manager_for(f"{_MODULE}:linear", warmup_batches=3)
    await manager.start()
    try:
        served = table.get("m")
        assert dict(manager.index())["m"].state is ModelState.READY
        assert [w.batches for w in counting] == [[1, 3, 8], [1, 3, 8]]  # before any request
        counters = served.balancer.counters
        assert counters.inference_count == 0 and counters.execution_count == 0
        assert not counters.batches
        config = served.balancer.config
        for replica in served.balancer.snapshot().replicas:  # the fit is still the prior
            assert replica.num_batches == 0
            assert (replica.fit_base_s, replica.fit_per_sample_s) == (config.prior_base_s,
                                                                      config.prior_per_sample_s)
        warmup_s = dict(manager.index())["m"].warmup_s
        assert warmup_s is not None and warmup_s > 0
        output = await served.submit([np.ones((1, 4), np.float32)], 1)
        assert output[0].shape == (1, 2)
        ran = [w for w in counting if len(w.batches) == 4]
        assert len(ran) == 1 and ran[0].batches[3] == 1  # not the first batch it ever ran
        assert served.balancer.counters.inference_count == 1
    finally:
        await manager.close(grace_s=1.0)


async def test_no_warmup_runs_nothing_before_the_first_request(
        counting: list[CountingWorker]) -> None:
    manager, table = manager_for(f"{_MODULE}:linear", warmup_batches=0, devices="cpu:0")
    await manager.start()
    try:
        assert counting[0].batches == []
        assert dict(manager.index())["m"].warmup_s is None
        await table.get("m").submit([np.ones((1, 4), np.float32)], 1)
        assert counting[0].batches == [1]
    finally:
        await manager.close(grace_s=1.0)


async def test_a_failing_warmup_fails_the_load_with_a_clear_error(
        counting: list[CountingWorker]) -> None:
    manager, table = manager_for(f"{_MODULE}:broken", warmup_batches=3, devices="cpu:0")
    with pytest.raises(WarmupFailed, match=r"'m': warm-up batch of 1 on m@cpu0 failed: .*"
                                           r"weights not loaded"):
        await manager.start()
    entry = dict(manager.index())["m"]
    assert entry.state is ModelState.UNAVAILABLE and "warm-up batch" in entry.reason
    assert "m" not in table
    assert counting[0].closed  # its workers are not left running


async def test_a_joining_device_is_warmed_up_before_it_takes_requests(
        counting: list[CountingWorker]) -> None:
    manager, table = manager_for(f"{_MODULE}:linear", warmup_batches=2, devices="cpu:0")
    await manager.start()
    try:
        await manager.add_device(DeviceSpec("cpu", 1, "cpu1"))
        assert [w.batches for w in counting] == [[1, 8], [1, 8]]
        assert all(r.num_batches == 0 for r in table.get("m").balancer.snapshot().replicas)
    finally:
        await manager.close(grace_s=1.0)


async def test_inputs_that_cannot_be_sampled_skip_the_warmup_with_a_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    definition = ModelDefinition(module=torch.nn.Identity(),
                                 inputs=[TensorSpec("ids", "INT64", (-1, -1))],
                                 outputs=[TensorSpec("y", "INT64", (-1, -1))])
    caplog.set_level(logging.INFO, logger="evenflow.server.engine.warmup")
    assert await warm_up([], definition, model_name="v", max_batch=8, batches=3) is None
    worker = CountingWorker(_Unused())
    assert await warm_up([worker], definition, model_name="v", max_batch=8, batches=3) is None
    assert worker.batches == []
    assert "model v: no warm-up" in caplog.text


class _Unused(_FakeReplica):
    """A worker the warm-up must not call."""

    name = "unused"
    devices = ("cpu0",)
    max_in_flight = 1

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        raise AssertionError("ran a batch")

    def status(self) -> WorkerStatus:
        return WorkerStatus()

