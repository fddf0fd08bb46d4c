"""A device-side assert on cuda:0 (an embedding index out of range) takes that replica out and
the next request is answered on the other device (skipped without a GPU).

The assert poisons the CUDA context of the whole process that hit it, so the thread-worker
scenario runs in a subprocess of its own (``python -m tests.gpu.test_device_errors``), and the
process-worker scenario keeps CUDA in the worker processes: this test process never touches it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

from evenflow.balancer import BalancerConfig, EvenflowError, ModelBalancer, Policy, Worker

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]

_ROWS = 10
_OUT_OF_RANGE = np.array([[50]], np.int64)
_IN_RANGE = np.array([[3]], np.int64)


class _Lookup(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(_ROWS, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids).sum(dim=1)


def embedding() -> Any:
    from evenflow.server.models.spec import ModelDefinition, TensorSpec

    torch.manual_seed(0)
    return ModelDefinition(module=_Lookup().eval(), inputs=[TensorSpec("ids", "INT64", (-1, 1))],
                           outputs=[TensorSpec("y", "FP32", (-1, 4))], traceable=False)


def _balancer(workers: list[Worker]) -> ModelBalancer:
    # Round-robin: the first request goes to the first replica, cuda:0.
    balancer = ModelBalancer(model_name="emb", workers=workers,
                             config=BalancerConfig(policy=Policy.ROUND_ROBIN, max_wait_s=0.0))
    balancer.start()
    return balancer


async def _outcome(balancer: ModelBalancer, ids: np.ndarray) -> str:
    try:
        await balancer.submit([ids], 1)
    except EvenflowError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "answered"


async def _thread_scenario() -> dict[str, Any]:
    from evenflow.server.workers.devices import parse_devices
    from evenflow.server.workers.torch_worker import TorchWorker

    workers: list[Worker] = [
        TorchWorker(model_name="emb", definition=embedding(), device=device)
        for device in parse_devices("cuda:0,cpu:0")]
    balancer = _balancer(workers)
    first = await _outcome(balancer, _OUT_OF_RANGE)
    after = [await _outcome(balancer, _IN_RANGE) for _ in range(4)]
    snapshot = balancer.snapshot()
    return {"first": first, "after": after, "serving": balancer.serving,
            "replicas": [{"devices": list(r.devices), "healthy": r.healthy,
                          "unusable_reason": r.unusable_reason, "num_batches": r.num_batches,
                          "restarts": r.restarts} for r in snapshot.replicas]}


def test_a_device_side_assert_takes_a_thread_replica_out_for_good() -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    run = subprocess.run([sys.executable, "-m", "tests.gpu.test_device_errors"],
                         check=False, capture_output=True, text=True, timeout=150,
                         env=env)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result (exit {run.returncode}):\n{run.stdout}\n{run.stderr[-4000:]}"
    result = json.loads(lines[-1])
    # cuda:0 asserted; the batch was re-run once on the CPU, where the same index is an
    # ordinary IndexError: that request fails, as it should.
    assert result["first"].startswith("BatchFailed") and "index out of range" in result["first"]
    assert result["after"] == ["answered"] * 4  # every later request, on the CPU
    cuda, cpu = result["replicas"]
    assert cuda["devices"] == ["cuda0"] and not cuda["healthy"] and cuda["restarts"] == 0
    assert "device-side assert" in cuda["unusable_reason"]
    assert cuda["num_batches"] == 0  # nothing more was routed to it
    assert cpu["healthy"] and cpu["num_batches"] == 4 and result["serving"]


async def test_a_device_side_assert_restarts_a_process_replica_into_a_fresh_context() -> None:
    from evenflow.server.config.server_config import PipelineConfig
    from evenflow.server.models.repository import BuiltinOptions
    from evenflow.server.workers.devices import parse_devices
    from evenflow.server.workers.process_host import ProcessWorker
    from evenflow.server.workers.worker_spec import WorkerSpec

    specs = [WorkerSpec(model_name="emb", source=f"{__name__}:embedding", devices=(device,),
                        builtins=BuiltinOptions(), pipeline=PipelineConfig())
             for device in parse_devices("cuda:0,cpu:0")]
    workers = [ProcessWorker(spec) for spec in specs]
    await asyncio.gather(*(w.start() for w in workers))
    balancer = _balancer(list[Worker](workers))
    back = asyncio.Event()
    balancer._on_health = lambda: back.set() if all(r.healthy for r in balancer.replicas) \
        else None
    try:
        first_pid = workers[0].pid
        first = await _outcome(balancer, _OUT_OF_RANGE)
        assert first.startswith("BatchFailed") and "index out of range" in first
        await asyncio.wait_for(back.wait(), 120)  # restarted in a new process
        cuda = balancer.replicas[0]
        assert cuda.restarts == 1 and cuda.unusable_reason == ""
        assert workers[0].pid not in (None, first_pid)
        after = [await _outcome(balancer, _IN_RANGE) for _ in range(4)]
        assert after == ["answered"] * 4
        assert cuda.stats.num_batches >= 1  # the fresh context on cuda:0 answers again
    finally:
        await balancer.drain()
        await balancer.close()
        await asyncio.gather(*(w.close() for w in workers))


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_thread_scenario())), flush=True)
    os._exit(0)  # skip tearing down a poisoned CUDA context
