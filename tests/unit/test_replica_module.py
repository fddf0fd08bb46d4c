"""Each replica owns its module: one definition, several devices or dtypes, no shared weights."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from evenflow.balancer import Job
from evenflow.server.config.server_config import ModelConfig, ServerConfig
from evenflow.server.engine.model_control import ModelManager
from evenflow.server.engine.served import ModelTable
from evenflow.server.models.exported import load_exported
from evenflow.server.models.repository import load_torchscript
from evenflow.server.models.spec import ModelDefinition, TensorSpec
from evenflow.server.workers import replica_module, torch_worker
from evenflow.server.workers.devices import DeviceSpec, parse_devices
from evenflow.server.workers.pipeline import layers
from evenflow.server.workers.replica_module import ProgramDtypeError, module_for
from evenflow.server.workers.torch_worker import TorchWorker
from tests.exported_programs import export_with_positions

pytestmark = pytest.mark.timeout(60)

CPU = torch.device("cpu")
META = torch.device("meta")


class Tied(torch.nn.Module):
    """A linear layer, a buffer and an output head tied to the input projection."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(4, 4, bias=False)
        self.out = torch.nn.Linear(4, 4, bias=False)
        self.out.weight = self.inp.weight
        self.scale: torch.Tensor
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inp(x)) * self.scale)


def definition() -> ModelDefinition:
    return ModelDefinition(module=Tied().eval(), inputs=[TensorSpec("x", "FP32", (-1, 4))],
                           outputs=[TensorSpec("y", "FP32", (-1, 4))])


def tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def storages(module: torch.nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors(module)}


def snapshot(module: torch.nn.Module) -> dict[str, tuple[torch.device, torch.dtype, int]]:
    return {name: (t.device, t.dtype, t.untyped_storage().data_ptr())
            for name, t in module.state_dict(keep_vars=True).items()}


def test_a_replica_on_another_device_owns_its_module_and_the_definition_is_untouched() -> None:
    model = definition()
    before = snapshot(model.module)
    placed = module_for(model, META, torch.float32)
    assert placed is not model.module
    assert all(t.device == META for t in tensors(placed))
    assert snapshot(model.module) == before
    assert not {id(t) for t in tensors(placed)} & {id(t) for t in tensors(model.module)}
    assert placed.out.weight is placed.inp.weight  # tied weights stay tied in the copy
    assert placed(torch.ones(2, 4, device=META)).device == META


def test_replicas_in_different_dtypes_share_no_storage() -> None:
    model = definition()
    before = snapshot(model.module)
    wide = module_for(model, CPU, torch.float64)
    narrow = module_for(model, CPU, torch.bfloat16)
    assert snapshot(model.module) == before
    assert {t.dtype for t in wide.parameters()} == {torch.float64}
    assert {t.dtype for t in narrow.parameters()} == {torch.bfloat16}
    assert wide.steps.dtype == narrow.steps.dtype == torch.int64  # only floats are cast
    assert not storages(wide) & storages(narrow)
    assert not (storages(wide) | storages(narrow)) & storages(model.module)


def test_cpu_float32_replicas_share_the_loaded_module() -> None:
    model = definition()
    assert module_for(model, CPU, torch.float32) is model.module
    assert module_for(model, CPU, torch.float32) is model.module


@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\.script.*deprecated:DeprecationWarning")
def test_a_scripted_module_is_copied_not_moved() -> None:
    model = ModelDefinition(module=torch.jit.script(Tied().eval()),
                            inputs=[TensorSpec("x", "FP32", (-1, 4))],
                            outputs=[TensorSpec("y", "FP32", (-1, 4))])
    before = snapshot(model.module)
    elsewhere = module_for(model, META, torch.float32)
    assert snapshot(model.module) == before
    assert elsewhere is not model.module
    assert {t.device for t in tensors(elsewhere)} == {META}


def test_a_definition_that_places_itself_builds_each_device_its_own() -> None:
    built: list[torch.device] = []

    def place(device: torch.device) -> torch.nn.Module:
        built.append(device)
        return Tied().to(device)

    model = ModelDefinition(module=Tied().eval(), inputs=[TensorSpec("x", "FP32", (-1, 4))],
                            outputs=[TensorSpec("y", "FP32", (-1, 4))], place=place)
    placed = module_for(model, META, torch.bfloat16)
    assert built == [META]
    assert {t.dtype for t in placed.parameters()} == {torch.bfloat16}
    assert module_for(model, CPU, torch.float32) is model.module  # loaded on the CPU already
    assert built == [META]


class WithOffset(torch.nn.Module):
    """Holds a plain tensor attribute, which a trace records as a constant of its code."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.offset = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.offset


@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\..*deprecated:DeprecationWarning")
def test_a_torchscript_file_is_loaded_onto_each_replicas_device(tmp_path: Path) -> None:
    path = tmp_path / "offset.pt"
    torch.jit.trace(WithOffset().eval(), (torch.ones(2, 4),)).save(str(path))
    spec = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}
    path.with_name(path.name + ".json").write_text(json.dumps(spec))
    model = load_torchscript(path)
    before = snapshot(model.module)
    placed = module_for(model, META, torch.float32)
    assert {t.device for t in tensors(placed)} == {META}
    with torch.inference_mode():  # the traced constant is on the replica's device too
        assert placed(torch.ones(3, 4, device=META)).device == META
    assert snapshot(model.module) == before
    assert module_for(model, CPU, torch.float32) is model.module


def run_job(x: np.ndarray) -> list[Job]:
    return [Job([x], x.shape[0], 0.0, math.inf, asyncio.get_running_loop().create_future())]


async def test_workers_in_two_dtypes_from_one_definition_both_answer() -> None:
    """Before each replica owned its module, building the second cast the first one's weights
    (``nn.Module.to`` is in place), so the first failed every batch."""
    model = definition()
    reference = Tied().eval()
    before = snapshot(model.module)
    cpu = DeviceSpec("cpu", 0, "cpu:0")
    wide = TorchWorker(model_name="tied", definition=model, device=cpu, dtype=torch.float64)
    narrow = TorchWorker(model_name="tied", definition=model, device=cpu, dtype=torch.bfloat16)
    try:
        assert snapshot(model.module) == before
        assert not storages(wide._module) & storages(narrow._module)
        x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
        with torch.inference_mode():
            want = reference(torch.from_numpy(x)).numpy()
        got_wide = (await wide.run(run_job(x))).outputs[0][0]
        got_narrow = (await narrow.run(run_job(x))).outputs[0][0]
    finally:
        await wide.close()
        await narrow.close()
    np.testing.assert_allclose(got_wide, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_narrow, want, rtol=5e-2, atol=5e-2)


async def test_a_joining_device_gets_its_replica_through_module_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[ModelDefinition, torch.device, torch.dtype]] = []

    def recording(model: ModelDefinition, device: torch.device,
                  dtype: torch.dtype) -> torch.nn.Module:
        calls.append((model, device, dtype))
        return module_for(model, device, dtype)

    monkeypatch.setattr(torch_worker, "module_for", recording)
    config = ServerConfig(models=(ModelConfig("tied", "tests.unit.test_replica_module:"
                                              "definition"),), workers="thread")
    table = ModelTable()
    manager = ModelManager(config, table, parse_devices("cpu:0"))
    await manager.start()
    try:
        served = table.get("tied")
        assert [device for _, device, _ in calls] == [CPU]
        await manager.add_device(parse_devices("cpu:1")[0])
        assert [device for _, device, _ in calls] == [CPU, CPU]
        assert all(model is served.definition for model, _, _ in calls)
        assert len(served.balancer.replicas) == 2
    finally:
        await manager.close(grace_s=1.0)


class ConstantBetween(torch.nn.Module):
    """Linear, plus a plain tensor (a trace keeps it as a float32 constant of its graph), then
    Linear: cast to bfloat16 the parameters change, the constant does not."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(4, 4)
        self.offset = torch.arange(4, dtype=torch.float32)
        self.second = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x) + self.offset)


def saved_trace(path: Path) -> ModelDefinition:
    torch.jit.trace(ConstantBetween().eval(), (torch.ones(2, 4),)).save(str(path))
    spec = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}
    path.with_name(path.name + ".json").write_text(json.dumps(spec))
    return load_torchscript(path)


@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\..*deprecated:DeprecationWarning")
async def test_a_torchscript_file_is_refused_a_dtype_other_than_its_own(tmp_path: Path) -> None:
    """Cast, its bfloat16 first layer's output met the float32 constant and came out float32,
    and the second layer failed every batch ("mat1 and mat2 must have the same dtype")."""
    model = saved_trace(tmp_path / "between.pt")
    cpu = DeviceSpec("cpu", 0, "cpu:0")
    with pytest.raises(ProgramDtypeError, match="a TorchScript module cannot be recast: its "
                       "floating parameters and buffers are float32, and this replica would "
                       "compute in bfloat16") as info:
        TorchWorker(model_name="between", definition=model, device=cpu, dtype=torch.bfloat16)
    assert "--dtype float32" in str(info.value) and "save it in bfloat16" in str(info.value)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    with torch.inference_mode():
        want = ConstantBetween().eval()(torch.from_numpy(x)).numpy()
    own = TorchWorker(model_name="between", definition=model, device=cpu)  # its own dtype
    try:
        got = (await own.run(run_job(x))).outputs[0][0]
    finally:
        await own.close()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_an_exported_program_is_refused_a_dtype_other_than_its_own(tmp_path: Path) -> None:
    """Its graph makes an ``arange(..., dtype=torch.float32)``, which no cast reaches."""
    path = tmp_path / "positions.pt2"
    export_with_positions(path)
    model = load_exported(path)
    with pytest.raises(ProgramDtypeError, match="an exported program cannot be recast"):
        module_for(model, META, torch.bfloat16)
    assert module_for(model, CPU, torch.float32) is model.module


@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\.script.*deprecated:DeprecationWarning")
def test_a_scripted_module_from_a_factory_is_refused_another_dtype_too() -> None:
    model = ModelDefinition(module=torch.jit.script(Tied().eval()),
                            inputs=[TensorSpec("x", "FP32", (-1, 4))],
                            outputs=[TensorSpec("y", "FP32", (-1, 4))])
    with pytest.raises(ProgramDtypeError, match=r"float32.*float64"):
        module_for(model, CPU, torch.float64)


class Waits:
    """Stands for ``cuda_sync.wait_for_stream`` and ``torch.cuda.current_stream``: records
    which device's current stream the builder waited for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.devices: list[torch.device] = []
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device: ("stream", device))
        monkeypatch.setattr(replica_module, "wait_for_stream",
                            lambda stream: self.devices.append(stream[1]))


def test_a_replica_on_cuda_waits_for_its_weights_to_land(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its copies and casts run on the building thread's default stream; the worker reads the
    weights on a non-blocking stream of its own, which nothing orders after them."""
    waits = Waits(monkeypatch)
    cuda1 = torch.device("cuda", 1)
    model = ModelDefinition(module=Tied().eval(), inputs=[TensorSpec("x", "FP32", (-1, 4))],
                            outputs=[TensorSpec("y", "FP32", (-1, 4))],
                            place=lambda device: Tied().eval())  # stands for a load onto it
    module_for(model, cuda1, torch.float32)
    assert waits.devices == [cuda1]
    module_for(model, META, torch.float32)
    module_for(model, CPU, torch.float32)
    assert waits.devices == [cuda1]  # nothing to wait for off CUDA


def test_a_stage_on_cuda_waits_for_its_layer_to_land(monkeypatch: pytest.MonkeyPatch) -> None:
    waits = Waits(monkeypatch)
    monkeypatch.setattr(layers, "copied_to", lambda layer, device, dtype: layer)
    cuda0 = torch.device("cuda", 0)
    layers.placed(torch.nn.Linear(4, 4).eval(), cuda0, torch.float32)
    assert waits.devices == [cuda0]
    layers.placed(torch.nn.Linear(4, 4).eval(), META, torch.float32)
    assert waits.devices == [cuda0]
