"""A device leaving under ``--placement auto``: the placer forgets it before any replica there
drains, so a load it finishes meanwhile is not put in routing on the leaving device, and the
models there keep serving from the others. A device joining whose memory cannot be known is
counted as joined and left out of the placement, said so in the log."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evenflow.server.config.deployment_file import load
from evenflow.server.engine import placement
from evenflow.server.engine.device_memory import DeviceMemoryUnknown
from evenflow.server.engine.model_control import ModelManager
from evenflow.server.engine.served import ModelTable
from evenflow.server.workers.devices import DeviceSpec, parse_devices

pytestmark = pytest.mark.timeout(60)

CONFIG = """
[server]
placement = "auto"
[devices]
list = ["sim:1", "sim:1"]
memory = { sim0 = "8GiB", sim1 = "8GiB" }
warmup_batches = 0
[models.a]
source = "sim"
memory_gib = 3
min_replicas = 2
"""


@pytest.fixture
async def placed(tmp_path: Path) -> AsyncIterator[tuple[ModelManager, ModelTable]]:
    """A started manager placing model ``a`` on two sim devices; closed after the test."""
    path = tmp_path / "evenflow.toml"
    path.write_text(CONFIG)
    table = ModelTable()
    manager = ModelManager(load(path, {}), table, parse_devices("sim:1,sim:1"))
    await manager.start()
    try:
        yield manager, table
    finally:
        await manager.close(grace_s=5.0)


async def test_the_placer_forgets_a_leaving_device_before_its_replicas_drain(
        placed: tuple[ModelManager, ModelTable], monkeypatch: pytest.MonkeyPatch) -> None:
    manager, table = placed
    balancer = table.get("a").balancer
    real_remove = balancer.remove_device
    placer_devices_at_drain: list[list[str]] = []

    async def remove_device(name: str) -> bool:
        snapshot = manager.placement_snapshot()
        assert snapshot is not None
        placer_devices_at_drain.append([d.device for d in snapshot.devices])
        return await real_remove(name)

    monkeypatch.setattr(balancer, "remove_device", remove_device)
    await manager.remove_device("sim1")
    assert placer_devices_at_drain == [["sim0"]]
    snapshot = manager.placement_snapshot()
    assert snapshot is not None
    assert [(m, d) for m, d, _ in snapshot.replicas] == [("a", "sim0")]
    assert [r.devices for r in balancer.snapshot().replicas] == [("sim0",)]
    assert balancer.serving


async def test_a_joining_device_of_unknown_memory_is_counted_and_left_out_of_the_placement(
        placed: tuple[ModelManager, ModelTable], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # A GPU joining a Ray cluster whose head has no GPU of that ordinal: its memory cannot be
    # asked. The manager must list it (the cluster follower would otherwise take the next
    # poll for a new join) and the placer must not be handed a device with no figure.
    manager, table = placed

    def unknown(*_: object) -> list[object]:
        raise DeviceMemoryUnknown("cuda2's memory is unknown")

    monkeypatch.setattr(placement, "device_infos", unknown)
    caplog.set_level(logging.ERROR)
    await manager.add_device(DeviceSpec("cuda", 2, "cuda2"))
    assert [d.name for d in manager.devices] == ["sim0", "sim1", "cuda2"]
    snapshot = manager.placement_snapshot()
    assert snapshot is not None
    assert [d.device for d in snapshot.devices] == ["sim0", "sim1"]
    assert any("cuda2 joined, but no replica is placed on it" in r.getMessage()
               for r in caplog.records)
    assert table.get("a").balancer.serving
