"""The memory ``--placement auto`` counts for replicas (``engine.placement``; a device's is in
``test_device_memory``) and how the model manager reserves it: parameters at the dtype served,
pins that cannot hold a replica, the reservation while a model's first replicas warm up, the
warning when nothing was measured, and an unload that the placer lets go of before the model
closes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from evenflow.balancer import BalancerConfig, WorkerStatus
from evenflow.balancer.capacity import DeviceCost
from evenflow.balancer.errors import ErrorCode
from evenflow.balancer.placement.inventory import ModelProfile
from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.placer import Placer
from evenflow.server.config.server_config import ModelConfig, ServerConfig
from evenflow.server.engine import model_control, placement
from evenflow.server.engine.model_control import ModelControlError, ModelManager
from evenflow.server.engine.served import ModelTable, ServedModel
from evenflow.server.models.spec import ModelDefinition, TensorSpec
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.worker_spec import WorkerSpec
from tests.fakes import FakeWorker

pytestmark = pytest.mark.timeout(30)

_MODULE = __name__
GIB = 2**30


class WithBuffers(torch.nn.Module):
    """10 float32 parameters, a float32 buffer of 6 and an int64 buffer of 3."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.scale: torch.Tensor
        self.register_buffer("scale", torch.ones(6))
        self.register_buffer("ids", torch.arange(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale[:2]


def with_buffers() -> ModelDefinition:
    return ModelDefinition(module=WithBuffers().eval(),
                           inputs=[TensorSpec("x", "FP32", (-1, 4))],
                           outputs=[TensorSpec("y", "FP32", (-1, 2))], traceable=False)


# -- what is counted ----------------------------------------------------------------------------


def test_parameters_count_in_the_dtype_each_device_serves_them_in() -> None:
    definition = with_buffers()
    floats, ints = 10 + 6, 3
    assert placement.parameter_bytes(definition, torch.float32) == floats * 4 + ints * 8
    assert placement.parameter_bytes(definition, torch.bfloat16) == floats * 2 + ints * 8
    assert placement.parameter_bytes(definition, torch.float16) == floats * 2 + ints * 8
    gpus, cpu = parse_devices("cuda:0,cuda:1"), parse_devices("cpu")
    assert placement.replica_parameter_bytes(definition, gpus, "bfloat16") == floats * 2 + ints * 8
    # A CPU replica computes in float32 whatever --dtype says; the footprint is one figure.
    assert placement.replica_parameter_bytes(definition, gpus + cpu, "bfloat16") == \
        floats * 4 + ints * 8
    assert next(definition.module.parameters()).dtype == torch.float32  # left as it was


def template(pinned: Sequence[str], memory_bytes: int) -> ModelProfile:
    return ModelProfile("a", memory_bytes, {d: DeviceCost(0.01, 0.001) for d in ("d0", "d1")},
                        8, 0.05, 0.0, 1, pinned=frozenset(pinned))


def test_a_pinned_device_must_have_room_for_a_replica() -> None:
    free = {"d0": 4 * GIB, "d1": 8 * GIB}
    assert placement.first_devices(template(["d1"], 6 * GIB), free) == ["d1"]
    with pytest.raises(placement.PlacementRefused) as refused:
        placement.first_devices(template(["d0"], 6 * GIB), free)
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    message = str(refused.value)
    assert "'a'" in message and "d0" in message
    assert str(4 * GIB) in message and str(6 * GIB) in message
    with pytest.raises(placement.PlacementRefused, match="'cuda:0', which is not one of"):
        placement.first_devices(template(["cuda:0"], GIB), free)


# -- the model manager, on fake workers ---------------------------------------------------------


@dataclass
class Peaked(FakeWorker):
    """A fake replica that, once it has run a batch, reports ``peak_bytes`` as its activation
    peak (what a GPU replica measures in its warm-up)."""

    peak_bytes: int | None = None

    def status(self) -> WorkerStatus:
        return WorkerStatus(activation_peak_bytes=self.peak_bytes if self.batches else None)


class Build:
    """Stands in for ``build_workers``: a ``Peaked`` fake per spec, recording each, and running
    ``before`` (if set) as each is built."""

    def __init__(self, peak_bytes: int | None) -> None:
        self.peak_bytes = peak_bytes
        self.built: list[Peaked] = []
        self.before: Callable[[str], Any] | None = None

    async def __call__(self, specs: Sequence[WorkerSpec], *args: object) -> list[Peaked]:
        made = []
        for spec in specs:
            device = spec.devices[0].name
            if self.before is not None:
                await self.before(device)
            worker = Peaked(f"{spec.model_name}@{device}", devices=(device,),
                            peak_bytes=self.peak_bytes)
            self.built.append(worker)
            made.append(worker)
        return made


@pytest.fixture
def placers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Placer]]:
    """Every placer a model manager makes."""
    made: list[Placer] = []
    real = placement.make_placer

    def make(*args: Any) -> Placer:
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(placement, "make_placer", make)
    yield made


def fake_build(monkeypatch: pytest.MonkeyPatch, peak_bytes: int | None) -> Build:
    build = Build(peak_bytes)
    monkeypatch.setattr(model_control, "build_workers", build)
    return build


def manager(devices: str, memory: dict[str, int], *models: ModelConfig,
            warmup_batches: int = 1) -> ModelManager:
    config = ServerConfig(models=models, placement="auto", device_memory_bytes=memory,
                          warmup_batches=warmup_batches,
                          balancer=BalancerConfig(max_batch=4, max_wait_s=0.0))
    return ModelManager(config, ModelTable(), parse_devices(devices))


def model(name: str = "a", **kwargs: Any) -> ModelConfig:
    return ModelConfig(name, f"{_MODULE}:with_buffers", **kwargs)


PARAMETERS = 16 * 4 + 3 * 8  # with_buffers' in float32 (sim devices compute in float32)


async def test_first_replicas_keep_what_they_measured_reserved_while_the_next_ones_build(
        monkeypatch: pytest.MonkeyPatch, placers: list[Placer]) -> None:
    """A warmed-up replica holds its activation peak; the placer, which may load other models
    meanwhile, must see that memory as taken while the model's later replicas build."""
    build = fake_build(monkeypatch, peak_bytes=1000)
    free_seen: list[dict[str, int]] = []

    async def before(device: str) -> None:
        free_seen.append(placers[0].free_bytes())

    build.before = before
    served = manager("sim:1,sim:1", {"sim0": 10_000, "sim1": 10_000}, model(min_replicas=2))
    await served.start()
    try:
        first = build.built[0].devices[0]
        assert len(free_seen) == 2
        assert free_seen[1][first] == 10_000 - (PARAMETERS + 1000)
        assert placers[0].profiles()["a"].memory_bytes == PARAMETERS + 1000
        assert placers[0].free_bytes() == {"sim0": 10_000 - PARAMETERS - 1000,
                                           "sim1": 10_000 - PARAMETERS - 1000}
    finally:
        await served.close(grace_s=1.0)


async def test_a_gpu_model_placed_by_its_parameters_alone_warns_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        placers: list[Placer]) -> None:
    fake_build(monkeypatch, peak_bytes=None)  # nothing measured: as with --no-warmup
    caplog.set_level(logging.WARNING, logger="evenflow.server.engine.placement")
    served = manager("cuda:0,cuda:1", {"cuda0": GIB, "cuda1": GIB},
                     model(min_replicas=2), model("b"), model("c", memory_bytes=GIB // 2),
                     warmup_batches=0)
    await served.start()
    try:
        await served.load("a")  # a reload: no second warning
        placers[0].carry_out([(Move("add", "b", "cuda1"), "test")], budgeted=False)
        for task in asyncio.all_tasks():
            if task.get_name() == "evenflow-add":
                await task
        assert sorted(d for m, d, _ in placers[0].snapshot().replicas if m == "b") == \
            ["cuda0", "cuda1"]
    finally:
        await served.close(grace_s=1.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    a, b = sorted(warnings)
    assert a.startswith("model a: its replicas are placed by their parameters and buffers")
    assert "memory_gib" in a and "[models.a]" in a
    assert b.startswith("model b:")  # c declares its footprint


async def test_models_on_cpus_and_sim_devices_are_not_warned_about(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        placers: list[Placer]) -> None:
    fake_build(monkeypatch, peak_bytes=None)
    caplog.set_level(logging.WARNING, logger="evenflow.server.engine.placement")
    served = manager("sim:1,cpu:0", {"cpu0": GIB}, model(min_replicas=2))
    await served.start()
    await served.close(grace_s=1.0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_pinned_device_without_room_fails_the_load_naming_it(
        monkeypatch: pytest.MonkeyPatch, placers: list[Placer]) -> None:
    build = fake_build(monkeypatch, peak_bytes=None)
    served = manager("sim:1,sim:1", {"sim0": 8 * GIB, "sim1": 4 * GIB},
                     model(pinned=("sim1",), memory_bytes=6 * GIB))
    with pytest.raises(ModelControlError) as failed:
        await served.start()
    assert failed.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "model 'a' is pinned to sim1" in str(failed.value)
    assert str(4 * GIB) in str(failed.value) and str(6 * GIB) in str(failed.value)
    assert build.built == []  # nothing was loaded into memory it does not have
    assert placers[0].free_bytes() == {"sim0": 8 * GIB, "sim1": 4 * GIB}
    await served.close(grace_s=1.0)


@pytest.mark.parametrize("load", [True, False])
async def test_a_pin_to_a_device_the_server_lacks_fails_the_start_clearly(
        monkeypatch: pytest.MonkeyPatch, placers: list[Placer], load: bool) -> None:
    """With no ``devices.list`` in the file the devices are found at start: that is where an
    unknown pin is caught, before anything loads (not as a StopIteration mid-load)."""
    build = fake_build(monkeypatch, peak_bytes=None)
    served = manager("sim:1,sim:1", {}, model("first"),
                     model("a", pinned=("sim1", "cuda:0"), load_at_start=load))
    with pytest.raises(ModelControlError, match=r"model 'a' is pinned to 'cuda:0', which is "
                                                r"not among the server's devices \(sim0, sim1\)"
                       ) as failed:
        await served.start()
    assert failed.value.code is ErrorCode.INVALID_ARGUMENT
    assert build.built == []
    await served.close(grace_s=1.0)


async def test_an_unload_lets_the_placer_go_before_the_model_closes(
        monkeypatch: pytest.MonkeyPatch, placers: list[Placer]) -> None:
    """A replica the placer was loading when the unload came is closed when it is ready, not
    put in the closing balancer; the unloaded replicas' memory stays reserved until they have
    closed."""
    build = fake_build(monkeypatch, peak_bytes=None)
    served = manager("sim:1,sim:1", {"sim0": 8 * GIB, "sim1": 8 * GIB},
                     model(memory_bytes=3 * GIB), warmup_batches=0)
    await served.start()
    placer = placers[0]
    (home,) = [d for _, d, _ in placer.snapshot().replicas]
    other = "sim1" if home == "sim0" else "sim0"
    loading, finish = asyncio.Event(), asyncio.Event()

    async def gate(device: str) -> None:
        loading.set()
        await finish.wait()

    build.before = gate
    placer.carry_out([(Move("add", "a", other), "test")], budgeted=False)
    await loading.wait()
    (add,) = [t for t in asyncio.all_tasks() if t.get_name() == "evenflow-add"]
    real_close = model_control.close_model
    during: list[tuple[dict[str, int], int]] = []

    async def close_after_the_load(closing: ServedModel, grace_s: float) -> None:
        finish.set()  # the load ends while the model drains and closes
        await asyncio.wait([add])
        during.append((placer.free_bytes(), len(closing.balancer.snapshot().replicas)))
        await real_close(closing, grace_s)

    monkeypatch.setattr(model_control, "close_model", close_after_the_load)
    await served.unload("a")
    (free, replicas), = during
    assert replicas == 1  # the loaded replica never joined the closing balancer
    assert free[home] == 5 * GIB  # still held by the replica draining there
    assert all(w.closed for w in build.built)
    assert placer.snapshot().replicas == ()
    assert placer.free_bytes() == {"sim0": 8 * GIB, "sim1": 8 * GIB}
    await served.close(grace_s=1.0)
