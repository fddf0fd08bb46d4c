"""A reload under ``--placement auto``: the new replicas load beside the old ones, and the old
ones' memory stays held until they have drained and closed, so nothing else is placed into
memory they still use."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenflow.balancer.errors import ErrorCode
from evenflow.server.config.deployment_file import load
from evenflow.server.engine import model_control
from evenflow.server.engine.model_control import ModelControlError, ModelManager
from evenflow.server.engine.served import ModelTable, ServedModel
from evenflow.server.workers.devices import parse_devices

pytestmark = pytest.mark.timeout(60)

CONFIG = """
[server]
placement = "auto"
[devices]
list = ["sim:1", "sim:0.5"]
memory = { sim0 = "8GiB", sim1 = "8GiB" }
warmup_batches = 0
[models.a]
source = "sim"
memory_gib = 7
[models.b]
source = "sim"
memory_gib = 7
load = false
"""


def serving(manager: ModelManager) -> list[tuple[str, str]]:
    snapshot = manager.placement_snapshot()
    assert snapshot is not None
    return sorted((m, d) for m, d, state in snapshot.replicas if state == "serving")


async def test_a_reloaded_models_old_replicas_hold_their_memory_until_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "evenflow.toml"
    path.write_text(CONFIG)
    manager = ModelManager(load(path, {}), ModelTable(), parse_devices("sim:1,sim:0.5"))
    await manager.start()
    assert serving(manager) == [("a", "sim0")]
    real_close = model_control.close_model
    refused: list[ErrorCode] = []

    async def close_while_b_loads(model: ServedModel, grace_s: float) -> None:
        # The old replica of a, on sim0, is still draining: b (7 GiB) fits on neither device.
        with pytest.raises(ModelControlError) as failed:
            await manager.load("b")
        refused.append(failed.value.code)
        await real_close(model, grace_s)

    monkeypatch.setattr(model_control, "close_model", close_while_b_loads)
    await manager.load("a")  # the new replica goes where there is room: sim1
    monkeypatch.setattr(model_control, "close_model", real_close)
    assert refused == [ErrorCode.RESOURCE_EXHAUSTED]
    assert serving(manager) == [("a", "sim1")]
    await manager.load("b")  # the old replica has closed: sim0 is free again
    assert serving(manager) == [("a", "sim1"), ("b", "sim0")]
    await manager.close(grace_s=5.0)
