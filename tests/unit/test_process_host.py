"""A worker process that dies while it builds its worker: start fails with WorkerLost naming
the exit code and the end of what the process wrote to stderr, and leaves nothing running."""

from __future__ import annotations

import os
import sys

import pytest

from evenflow.balancer import WorkerLost
from evenflow.server.config.server_config import PipelineConfig
from evenflow.server.models.repository import BuiltinOptions
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.process_host import ProcessWorker
from evenflow.server.workers.worker_spec import WorkerSpec

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]


def dies_while_loading() -> ModelDefinition:
    """Loaded in the worker process: says why on stderr, then exits as a crash would."""
    sys.stderr.write("loading failed: the weights file is truncated\n")
    sys.stderr.flush()
    os._exit(7)


async def test_a_process_that_exits_while_starting_says_its_code_and_last_words() -> None:
    spec = WorkerSpec(model_name="m", source=f"{__name__}:dies_while_loading",
                      devices=tuple(parse_devices("cpu:0")), builtins=BuiltinOptions(),
                      pipeline=PipelineConfig())
    worker = ProcessWorker(spec)
    with pytest.raises(WorkerLost) as failed:
        await worker.start()
    message = str(failed.value)
    assert "worker m@cpu0: its process exited with code 7 while starting" in message
    assert "the weights file is truncated" in message
    assert worker.pid is None
    await worker.close()
