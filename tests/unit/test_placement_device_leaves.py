"""A device leaving under ``--placement auto``: the placer forgets it before any replica there
drains, so a load it finishes meanwhile is not put in routing on the leaving device, and the
models there keep serving from the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenflow.server.config.deployment_file import load
from evenflow.server.engine.model_control import ModelManager
from evenflow.server.engine.served import ModelTable
from evenflow.server.workers.devices import parse_devices

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


async def test_the_placer_forgets_a_leaving_device_before_its_replicas_drain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "evenflow.toml"
    path.write_text(CONFIG)
    table = ModelTable()
    manager = ModelManager(load(path, {}), table, parse_devices("sim:1,sim:1"))
    await manager.start()
    try:
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
    finally:
        await manager.close(grace_s=5.0)
