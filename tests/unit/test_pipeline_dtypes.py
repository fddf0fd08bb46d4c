"""Each pipeline stage computes in its own dtype: the thread host gives a CUDA stage ``--dtype``
and a CPU stage float32, as it does single-device replicas (not the first device's dtype to
every stage), and a stage casts the floating activations it receives to its dtype. Two CPU
stages in different dtypes stand for a mixed CPU/GPU pipeline here."""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch

from evenflow.balancer import Job
from evenflow.server.config.server_config import PipelineConfig
from evenflow.server.models.repository import BuiltinOptions
from evenflow.server.models.spec import ModelDefinition, TensorSpec
from evenflow.server.workers import thread_host
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.pipeline.layers import split_into_layers
from evenflow.server.workers.pipeline.worker import PipelineWorker
from evenflow.server.workers.replica_module import copied_to
from evenflow.server.workers.worker_spec import WorkerSpec

pytestmark = pytest.mark.timeout(60)

WIDTH = 16


class ChecksDtype(torch.nn.Linear):
    """A linear layer that raises unless its input has its weight's dtype (a mismatch would
    otherwise fail or silently promote)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype:
            raise AssertionError(f"{x.dtype} input into a {self.weight.dtype} layer")
        return super().forward(x)


def chain(traceable: bool) -> ModelDefinition:
    torch.manual_seed(0)
    layers = [ChecksDtype(WIDTH, WIDTH), torch.nn.Tanh(), ChecksDtype(WIDTH, WIDTH),
              torch.nn.Tanh()]
    return ModelDefinition(module=torch.nn.Sequential(*layers).eval(),
                           inputs=[TensorSpec("x", "FP32", (-1, WIDTH))],
                           outputs=[TensorSpec("y", "FP32", (-1, WIDTH))], traceable=traceable)


def split_reference(definition: ModelDefinition, bounds: tuple[int, ...],
                    dtypes: list[torch.dtype], x: np.ndarray) -> np.ndarray:
    """The model cut at ``bounds``, each part run in its stage's dtype on the CPU."""
    layers = split_into_layers(definition.module)
    out = torch.from_numpy(x)
    with torch.inference_mode():
        for (first, end), dtype in zip(itertools.pairwise(bounds), dtypes, strict=True):
            part = copied_to(torch.nn.Sequential(*layers[first:end]), torch.device("cpu"), dtype)
            out = part(out.to(dtype))
    return out.to(torch.float32).numpy()


@pytest.mark.parametrize("traceable", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtypes", [[torch.float32, torch.bfloat16],
                                    [torch.bfloat16, torch.float32]], ids=["fp32-bf16",
                                                                            "bf16-fp32"])
async def test_each_stage_runs_in_its_own_dtype_and_casts_what_it_receives(
        dtypes: list[torch.dtype], traceable: bool) -> None:
    definition = chain(traceable)
    worker = PipelineWorker(model_name="chain", definition=definition,
                            devices=parse_devices("cpu:0,cpu:1"), dtype=dtypes,
                            partition="even")
    x = np.random.default_rng(0).standard_normal((3, WIDTH)).astype(np.float32)
    try:
        for stage, dtype in zip(worker.stage_modules, dtypes, strict=True):
            assert {p.dtype for p in stage.parameters()} == {dtype}
            # Traced, each stage on the activations the one before hands it, in its dtype.
            assert isinstance(stage, torch.jit.ScriptModule) is traceable
        result = await worker.run([Job([x], 3, 0.0, math.inf,
                                       asyncio.get_running_loop().create_future())])
    finally:
        await worker.close()
    want = split_reference(definition, worker.plan.bounds, dtypes, x)
    np.testing.assert_allclose(result.outputs[0][0], want, rtol=1e-6, atol=1e-6)


def test_one_dtype_per_stage_is_required() -> None:
    with pytest.raises(ValueError, match="1 dtypes for 2 stages"):
        PipelineWorker(model_name="chain", definition=chain(False),
                       devices=parse_devices("cpu:0,cpu:1"), dtype=[torch.bfloat16])


@pytest.mark.parametrize(("devices", "want"), [
    ("cpu,cuda:0", [torch.float32, torch.bfloat16]),
    ("cuda:0,cpu", [torch.bfloat16, torch.float32]),
    ("cuda:0,cuda:1", [torch.bfloat16, torch.bfloat16]),
])
def test_the_thread_host_gives_cuda_stages_the_dtype_and_cpu_stages_float32(
        monkeypatch: pytest.MonkeyPatch, devices: str, want: list[torch.dtype]) -> None:
    """Before, every stage got the first device's: a cpu,cuda:0 pipeline ran its GPU stage in
    float32 under --dtype bfloat16, and a cuda:0,cpu one its CPU stage in bfloat16."""
    built: list[dict[str, Any]] = []
    monkeypatch.setattr(thread_host, "PipelineWorker", lambda **kwargs: built.append(kwargs))
    group = tuple(parse_devices(devices))
    spec = WorkerSpec(model_name="chain", source="unused", devices=group,
                      builtins=BuiltinOptions(), pipeline=PipelineConfig(stages=len(group)),
                      dtype="bfloat16")
    thread_host.build_thread_worker(spec, chain(False))
    assert [kwargs["dtype"] for kwargs in built] == [want]
