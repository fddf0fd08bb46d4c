"""The worker endpoint and the engine's side of the same schema (``HostedWorker``), joined by a
loopback host that carries each message msgpack-encoded, as a worker process and a Ray actor
do: batches are cut per job, errors and controls come back by name, a lost device is noted."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import msgspec
import numpy as np
import pytest

from evenflow.balancer import BatchFailed, BatchResult, BatchTiming, Job, OutOfMemory, WorkerStatus
from evenflow.balancer.errors import DeviceLost
from evenflow.server.config.server_config import PipelineConfig
from evenflow.server.models.repository import BuiltinOptions
from evenflow.server.processes.ipc import worker_messages as msg
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.endpoint import WorkerEndpoint
from evenflow.server.workers.hosted import BatchReply, HostedWorker
from evenflow.server.workers.worker_spec import WorkerSpec

pytestmark = pytest.mark.timeout(30)


class DoublingWorker:
    """Doubles its one input; scriptable failures, a speed per simulated device, a record of
    the batches (their sizes) and controls it got."""

    name = "m@sim0"
    devices = ("sim0",)
    max_in_flight = 1

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.fail_with: list[Exception] = []
        self.speeds = {"sim0": 1.0}
        self.faults: list[tuple[str, str, int]] = []
        self.closed = False

    def status(self) -> WorkerStatus:
        return WorkerStatus(({"device": "sim0", "layers": 3},), 2, activation_peak_bytes=12345)

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        self.batches.append([job.num_samples for job in jobs])
        if self.fail_with:
            raise self.fail_with.pop(0)
        return BatchResult([[job.payload[0] * 2] for job in jobs], BatchTiming(0.1, 0.2, 0.3))

    async def set_device_speed(self, device: str, speed: float) -> float:
        if device not in self.speeds:
            raise KeyError(device)
        self.speeds[device] = speed
        return speed

    async def set_device_fault(self, device: str, fault: str, count: int) -> None:
        self.faults.append((device, fault, count))

    async def restart(self) -> None:
        raise AssertionError("not restarted here")

    async def close(self) -> None:
        self.closed = True


class LoopbackWorker(HostedWorker):
    """A host whose "other side" is an endpoint in this process; every message is encoded and
    decoded on the way, so the schema is exercised as it crosses."""

    def __init__(self, endpoint: WorkerEndpoint, devices: str = "sim:1") -> None:
        spec = WorkerSpec(model_name="m", source="sim", devices=tuple(parse_devices(devices)),
                          builtins=BuiltinOptions(), pipeline=PipelineConfig())
        super().__init__(spec, 1)
        self.endpoint = endpoint
        self.sent: list[msgspec.Struct] = []

    async def _exchange(self, sizes: list[int], inputs: list[np.ndarray]
                        ) -> tuple[BatchReply, list[np.ndarray]]:
        request = msg.to_worker.decode(msg.encoder.encode(
            msg.RunBatch(id=7, sizes=sizes, arrays=[])))
        assert isinstance(request, msg.RunBatch)
        self.sent.append(request)
        reply, outputs = await self.endpoint.run_batch(request, inputs)
        return msgspec.msgpack.decode(msg.encoder.encode(reply), type=BatchReply), outputs

    async def _send_control(self, request: msg.Control) -> msg.ControlDone:
        self.sent.append(request)
        done = await self.endpoint.control(request)
        return msgspec.msgpack.decode(msg.encoder.encode(done), type=msg.ControlDone)

    async def start(self) -> None:
        pass

    async def _kill(self) -> None:
        pass


def _jobs(*rows: int) -> list[Job]:
    loop = asyncio.get_running_loop()
    return [Job([np.full((n, 2), float(n), np.float32)], n, 0.0, math.inf, loop.create_future())
            for n in rows]


@pytest.fixture
def worker() -> DoublingWorker:
    return DoublingWorker()


async def test_a_batch_crosses_whole_and_comes_back_cut_per_job(worker: DoublingWorker) -> None:
    host = LoopbackWorker(WorkerEndpoint(worker))
    result = await host.run(_jobs(2, 1))
    assert worker.batches == [[3]]  # one job of all the rows on the worker's side
    assert [out[0].shape for out in result.outputs] == [(2, 2), (1, 2)]
    np.testing.assert_array_equal(result.outputs[0][0], np.full((2, 2), 4.0))
    np.testing.assert_array_equal(result.outputs[1][0], np.full((1, 2), 2.0))
    assert result.timing == BatchTiming(0.1, 0.2, 0.3) and result.cpu is None
    assert host.status() == WorkerStatus(({"device": "sim0", "layers": 3},), 2,
                                         activation_peak_bytes=12345)


async def test_errors_come_back_as_the_same_error(worker: DoublingWorker) -> None:
    endpoint = WorkerEndpoint(worker)
    host = LoopbackWorker(endpoint)
    worker.fail_with = [OutOfMemory("16 GiB"), RuntimeError("kaput")]
    with pytest.raises(OutOfMemory, match="16 GiB"):
        await host.run(_jobs(1))
    with pytest.raises(BatchFailed, match="RuntimeError: kaput"):
        await host.run(_jobs(1))
    assert not endpoint.device_lost


async def test_a_lost_device_is_answered_and_noted(worker: DoublingWorker) -> None:
    endpoint = WorkerEndpoint(worker)
    worker.fail_with = [DeviceLost("device-side assert")]
    with pytest.raises(DeviceLost, match="device-side assert"):
        await LoopbackWorker(endpoint).run(_jobs(1))
    assert endpoint.device_lost


async def test_controls_reach_the_worker_and_answer_its_value_or_error(
        worker: DoublingWorker) -> None:
    host = LoopbackWorker(WorkerEndpoint(worker))
    assert await host.set_device_speed("sim0", 0.5) == 0.5
    assert worker.speeds == {"sim0": 0.5}
    await host.set_device_fault("sim0", "crash", 2)
    assert worker.faults == [("sim0", "crash", 2)]
    with pytest.raises(KeyError):
        await host.set_device_speed("sim9", 1.0)  # not this worker's: nothing is sent
    assert len(host.sent) == 2
    worker.speeds.clear()
    with pytest.raises(KeyError, match="sim0"):
        await host.set_device_speed("sim0", 1.0)  # raised over there, by name


async def test_an_unknown_control_is_refused(worker: DoublingWorker) -> None:
    done = await WorkerEndpoint(worker).control(msg.Control(3, "melt", "sim0"))
    assert done.id == 3 and done.error is not None and done.error.kind == "ValueError"


async def test_ready_describes_the_built_worker_and_close_closes_it(
        worker: DoublingWorker) -> None:
    endpoint = WorkerEndpoint(worker)
    ready = endpoint.ready()
    assert (ready.name, ready.devices, ready.max_in_flight) == ("m@sim0", ["sim0"], 1)
    assert ready.status == msg.Status([{"device": "sim0", "layers": 3}], 2, 12345)
    await endpoint.close()
    assert worker.closed


async def test_a_closed_host_refuses_batches(worker: DoublingWorker) -> None:
    host = LoopbackWorker(WorkerEndpoint(worker))
    assert host._close_once()
    with pytest.raises(BatchFailed, match="closed"):
        await host.run(_jobs(1))
    assert worker.batches == []
