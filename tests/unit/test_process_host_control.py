"""Control calls (device speed and faults, the admin RPC's) to a worker process that has died
fail with WorkerLost, as a batch would, and never wait on a process that is gone."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from evenflow.balancer import WorkerLost
from evenflow.server.config.server_config import PipelineConfig
from evenflow.server.models.repository import BuiltinOptions
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.process_host import ProcessWorker
from evenflow.server.workers.worker_spec import WorkerSpec

# slow: starts a worker process (torch import).
pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]


async def test_control_calls_to_a_worker_process_killed_while_idle_fail_with_worker_lost() -> None:
    spec = WorkerSpec(model_name="m", source="sim", devices=tuple(parse_devices("sim:1")),
                      builtins=BuiltinOptions(), pipeline=PipelineConfig())
    worker = ProcessWorker(spec)
    await worker.start()
    try:
        process = worker._process
        assert process is not None
        await worker.set_device_speed("sim0", 0.5)  # answered while the process runs
        os.kill(process.pid, signal.SIGKILL)
        # Scheduled before the loop can see the exit, so it is sent to the dying process and
        # is still waiting for its answer when the process is found gone.
        pending = asyncio.ensure_future(worker.set_device_speed("sim0", 0.25))
        await process.wait()
        with pytest.raises(WorkerLost):
            await asyncio.wait_for(pending, 10)
        # Now the exit is known: a new call fails at once instead of queueing for no one.
        with pytest.raises(WorkerLost, match="not running"):
            await asyncio.wait_for(worker.set_device_fault("sim0", "hang", 1), 10)
    finally:
        await worker.close()
