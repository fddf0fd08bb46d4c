"""Sticky device errors: classify_device_error's mapping, and a replica whose device is lost
leaves routing (for good on a thread worker; restarted on a worker that renews its device)."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch

from evenflow.balancer import (
    BatchFailed,
    DeviceLost,
    ErrorCode,
    Job,
    OutOfMemory,
    Policy,
    WorkerLost,
)
from evenflow.server.models.spec import ModelDefinition, TensorSpec
from evenflow.server.processes.ipc.errors import from_wire, to_wire
from evenflow.server.workers.device_errors import classify_device_error
from tests.fakes import FakeWorker
from tests.unit.balancer_fakes import BalancerFactory, answered, settle

pytestmark = pytest.mark.timeout(10)

_ASSERT = ("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously "
           "reported at some other API call, so the stacktrace below might be incorrect.")


@pytest.mark.parametrize("message", [
    _ASSERT,
    "CUDA error: an illegal memory access was encountered",
    "CUDA error: unspecified launch failure",
])
def test_sticky_cuda_messages_are_device_lost(message: str) -> None:
    error = classify_device_error(RuntimeError(message), device="cuda:0")
    assert type(error) is DeviceLost and isinstance(error, WorkerLost)
    assert error.code is ErrorCode.UNAVAILABLE
    assert "cuda:0" in str(error) and message.splitlines()[0] in str(error)


@pytest.mark.skipif(not hasattr(torch, "AcceleratorError"), reason="torch without it")
def test_an_accelerator_error_is_device_lost() -> None:
    error_class = torch.AcceleratorError
    assert type(classify_device_error(error_class("CUDA error: anything"))) is DeviceLost


def test_out_of_memory_stays_out_of_memory() -> None:
    error = classify_device_error(torch.OutOfMemoryError("CUDA out of memory. Tried to "
                                                         "allocate 2.00 GiB"), device="cuda:0")
    assert type(error) is OutOfMemory and "cuda:0" in str(error)


# What a traced model raises when an operation in it runs out of memory: the TorchScript
# interpreter rethrows the allocator's OutOfMemoryError as a plain RuntimeError, its message
# embedding the original one.
_INTERPRETED_OOM = (
    "The following operation failed in the TorchScript interpreter.\n"
    "Traceback of TorchScript (most recent call last):\n"
    "/models/spread.py(12): forward\n"
    "RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity "
    "of 79.11 GiB of which 312.00 MiB is free.\n")


@pytest.mark.parametrize("message", [
    _INTERPRETED_OOM,
    "CUDA error: out of memory",  # cudaErrorMemoryAllocation, outside the caching allocator
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
])
def test_out_of_memory_however_torch_wraps_it_is_out_of_memory(message: str) -> None:
    error = classify_device_error(RuntimeError(message), device="cuda:0")
    assert type(error) is OutOfMemory
    assert "cuda:0" in str(error) and message.strip().splitlines()[-1] in str(error)


@pytest.mark.skipif(not hasattr(torch, "AcceleratorError"), reason="torch without it")
def test_a_failed_cuda_malloc_is_out_of_memory_not_a_lost_device() -> None:
    error_class = torch.AcceleratorError
    error = classify_device_error(error_class("CUDA error: out of memory"), device="cuda:0")
    assert type(error) is OutOfMemory


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)"),
    IndexError("index out of range in self"),  # the same embedding bug, on the CPU: not sticky
    ValueError("bad input"),
])
def test_other_model_errors_are_batch_failed_with_the_model_message(exc: Exception) -> None:
    error = classify_device_error(exc)
    assert type(error) is BatchFailed
    assert str(exc) in str(error) and type(exc).__name__ in str(error)


def test_an_evenflow_error_passes_through() -> None:
    error = WorkerLost("already classified")
    assert classify_device_error(error) is error


def test_device_lost_crosses_a_process_boundary_as_itself() -> None:
    error = from_wire(to_wire(DeviceLost("device lost on cuda:0")))
    assert type(error) is DeviceLost and str(error) == "device lost on cuda:0"


class ProcessLikeWorker(FakeWorker):
    """A worker whose restart starts a fresh process (as ProcessWorker and RayWorker do)."""

    restart_renews_device = True


@pytest.mark.parametrize("policy", [Policy.ROUND_ROBIN, Policy.SHARED_QUEUE])
async def test_a_lost_device_reroutes_its_batch_and_takes_no_more(
        make_balancer: BalancerFactory, policy: Policy) -> None:
    poisoned = FakeWorker("cuda0", fail_with=[DeviceLost("device lost on cuda:0: "
                                                          "device-side assert triggered")])
    other = FakeWorker("cpu0")
    balancer = make_balancer([poisoned, other], policy=policy)
    states: list[bool] = []
    balancer._on_health = lambda: states.append(balancer.serving)
    first = balancer.submit("a", 1)  # round-robin (and the idle shared queue) start on cuda0
    assert await answered(make_balancer.time, first) == [("out", "a")]  # re-run on cpu0
    assert poisoned.batches == [[1]] and other.batches == [[1]]
    answers = [balancer.submit(f"r{i}", 1) for i in range(6)]
    assert await answered(make_balancer.time, *answers) == [("out", f"r{i}") for i in range(6)]
    await settle()
    assert poisoned.batches == [[1]]  # never fed again
    assert poisoned.restarted == 0  # no restart into the same poisoned context
    assert balancer.counters.rerouted == 1
    lost, kept = balancer.snapshot().replicas
    assert not lost.healthy and "device-side assert" in lost.unusable_reason
    assert kept.healthy and kept.unusable_reason == ""
    assert balancer.serving and states == [True]  # health: still serving, one replica fewer


async def test_a_lost_device_on_the_only_replica_leaves_the_model_not_serving(
        make_balancer: BalancerFactory) -> None:
    only = FakeWorker("cuda0", fail_with=[DeviceLost("device lost on cuda:0")])
    balancer = make_balancer([only])
    with pytest.raises(WorkerLost, match="no other replica is in service"):
        await balancer.submit("a", 1)
    await settle()
    assert not balancer.serving and only.restarted == 0
    with pytest.raises(WorkerLost, match="no replica in service"):
        balancer.submit("b", 1)


async def test_a_worker_that_renews_its_device_is_restarted_and_back_in_routing(
        make_balancer: BalancerFactory) -> None:
    process = ProcessLikeWorker("cuda0", fail_with=[DeviceLost("device lost on cuda:0")])
    other = FakeWorker("cpu0")
    balancer = make_balancer([process, other], policy=Policy.ROUND_ROBIN)
    assert await balancer.submit("a", 1) == ("out", "a")
    await settle()
    assert process.restarted == 1
    replica = balancer.replicas[0]
    assert replica.healthy and replica.unusable_reason == ""
    answers = [balancer.submit(f"r{i}", 1) for i in range(4)]
    await answered(make_balancer.time, *answers)
    assert len(process.batches) > 1  # in routing again


def test_hosted_workers_say_a_restart_renews_their_device() -> None:
    from evenflow.balancer.replica import restart_renews_device
    from evenflow.server.workers.hosted import HostedWorker
    from evenflow.server.workers.thread_worker import ThreadWorker

    assert HostedWorker.restart_renews_device
    assert not hasattr(ThreadWorker, "restart_renews_device")
    assert not restart_renews_device(FakeWorker("thread-like"))


class _PoisonedAboveNine(torch.nn.Module):
    """Raises what CUDA raises after a device-side assert for any input above 9 (an index out
    of a 10-row embedding), so the process path can be driven without a GPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x > 9).any()):
            raise RuntimeError("CUDA error: device-side assert triggered")
        return x * 2


def poisoned() -> ModelDefinition:
    return ModelDefinition(module=_PoisonedAboveNine(), inputs=[TensorSpec("x", "FP32", (-1, 1))],
                           outputs=[TensorSpec("y", "FP32", (-1, 1))], traceable=False)


@pytest.mark.slow  # starts a worker process (torch import) twice
@pytest.mark.timeout(90)
async def test_a_worker_process_exits_on_device_lost_and_restarts_fresh() -> None:
    from evenflow.server.config.server_config import PipelineConfig
    from evenflow.server.models.repository import BuiltinOptions
    from evenflow.server.processes.worker_process import DEVICE_LOST_EXIT_CODE
    from evenflow.server.workers.devices import parse_devices
    from evenflow.server.workers.process_host import ProcessWorker
    from evenflow.server.workers.worker_spec import WorkerSpec

    spec = WorkerSpec(model_name="p", source=f"{__name__}:poisoned",
                      devices=tuple(parse_devices("cpu:0")), builtins=BuiltinOptions(),
                      pipeline=PipelineConfig())
    worker = ProcessWorker(spec)
    await worker.start()
    try:
        process = worker._process
        assert process is not None
        with pytest.raises(DeviceLost, match="device-side assert"):
            await worker.run(_jobs(np.array([[50.0]], np.float32)))
        assert await asyncio.wait_for(process.wait(), 30) == DEVICE_LOST_EXIT_CODE
        await worker.restart()
        assert worker.pid is not None and worker.pid != process.pid
        result = await worker.run(_jobs(np.array([[3.0]], np.float32)))
        np.testing.assert_array_equal(result.outputs[0][0], [[6.0]])
    finally:
        await worker.close()


def _jobs(x: np.ndarray) -> list[Job]:
    return [Job([x], x.shape[0], 0.0, math.inf, asyncio.get_running_loop().create_future())]


def test_the_stats_rpc_carries_why_a_replica_is_unusable() -> None:
    from evenflow.balancer import ReplicaSnapshot
    from evenflow.server.engine.stats_service import _replica

    snapshot = ReplicaSnapshot(
        name="m@cuda0", devices=("cuda0",), busy_fraction=0.0, busy_s=0.0, queued_requests=0,
        queued_samples=0, outstanding_work_s=0.0, batch_size=1, fit_base_s=0.0,
        fit_per_sample_s=0.0, fit_reliable=False, num_batches=0, num_samples=0,
        num_stolen_requests=0, running_requests=0, batch_size_counts={}, healthy=False,
        unusable_reason="device lost on cuda:0: device-side assert triggered")
    stats = _replica(snapshot)
    assert not stats.healthy and stats.unusable_reason == snapshot.unusable_reason
