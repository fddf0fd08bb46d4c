"""Loads and unloads against shutdown and their callers' cancellation: ``close`` abandons a load
still building and waits for an unload's drain, a caller that goes away does not cut an unload
off halfway, and a reload that fails leaves the model that serves READY."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from evenflow.balancer.errors import ErrorCode
from evenflow.server.config.server_config import ModelConfig, ServerConfig
from evenflow.server.engine import model_control
from evenflow.server.engine.model_control import ModelControlError, ModelManager, ModelState
from evenflow.server.engine.served import ModelTable, ServedModel
from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.thread_worker import ThreadWorker

pytestmark = pytest.mark.timeout(20)


def manager_of(*models: ModelConfig) -> tuple[ModelManager, ModelTable]:
    table = ModelTable()
    config = ServerConfig(models=models, devices="sim:1", warmup_batches=0)
    return ModelManager(config, table, parse_devices("sim:1")), table


def state(manager: ModelManager, name: str) -> tuple[ModelState, str]:
    entry = dict(manager.index())[name]
    return entry.state, entry.reason


async def test_close_abandons_a_load_still_building_and_nothing_is_left_serving(
        monkeypatch: pytest.MonkeyPatch) -> None:
    manager, table = manager_of(ModelConfig("m", "sim", load_at_start=False))
    await manager.start()
    building, cancelled = asyncio.Event(), asyncio.Event()

    async def endless_build(config: ModelConfig) -> Any:
        building.set()
        try:
            await asyncio.Event().wait()  # a load that would take minutes
        except asyncio.CancelledError:
            cancelled.set()
            raise

    monkeypatch.setattr(manager, "_build", endless_build)
    load = asyncio.ensure_future(manager.load("m"))
    await building.wait()
    await manager.close(grace_s=1.0)
    assert cancelled.is_set()
    with pytest.raises(ModelControlError) as refused:
        await load
    assert refused.value.code is ErrorCode.UNAVAILABLE
    assert list(table) == []
    assert state(manager, "m") == (ModelState.UNAVAILABLE,
                                   "load abandoned: the server is shutting down")
    with pytest.raises(ModelControlError) as late:
        await manager.load("m")
    assert late.value.code is ErrorCode.UNAVAILABLE


async def test_an_unload_whose_caller_goes_away_still_closes_its_model_and_close_waits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    manager, table = manager_of(ModelConfig("m", "sim"))
    await manager.start()
    (model,) = table
    draining, release = asyncio.Event(), asyncio.Event()
    real_close = model_control.close_model

    async def slow_close(served: ServedModel, grace_s: float,
                         abort: asyncio.Event | None = None) -> None:
        draining.set()
        await release.wait()  # admitted requests still finishing
        await real_close(served, grace_s, abort)

    monkeypatch.setattr(model_control, "close_model", slow_close)
    caller = asyncio.ensure_future(manager.unload("m"))
    await draining.wait()
    caller.cancel()  # the client, or gRPC's stop, cancels the handler mid-drain
    with pytest.raises(asyncio.CancelledError):
        await caller
    closing = asyncio.ensure_future(manager.close(grace_s=1.0))
    done, _ = await asyncio.wait({closing}, timeout=0.05)
    assert not done  # it waits for the unload's drain
    release.set()
    await closing
    workers = [replica.worker for replica in model.balancer.replicas]
    assert workers and all(isinstance(w, ThreadWorker) and w._closed for w in workers)
    assert state(manager, "m") == (ModelState.UNAVAILABLE, "unloaded")


async def test_a_failed_reload_leaves_the_serving_model_ready(
        monkeypatch: pytest.MonkeyPatch) -> None:
    manager, table = manager_of(ModelConfig("m", "sim"))
    await manager.start()
    (served,) = table

    async def failing_build(config: ModelConfig) -> Any:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(manager, "_build", failing_build)
    with pytest.raises(RuntimeError):
        await manager.load("m")
    assert list(table) == [served]
    assert state(manager, "m") == (ModelState.READY, "load failed: CUDA out of memory")
    await manager.close(grace_s=1.0)
