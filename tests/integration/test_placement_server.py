"""``--placement auto`` in a real server: first replicas within each device's memory, the
placement in the stats RPC, a model with no replica loaded on its first request (which waits,
and is answered), and ``--placement all`` as before."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import grpc
import numpy as np
import pytest

from evenflow.client import AsyncClient
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc
from tests.integration.test_devices_page import CHROMIUM, VIRTUAL_TIME_MS, chromium, http_url
from tests.servers import ServerProcess, start_server

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[server]
placement = "auto"

[devices]
list = ["sim:1", "sim:0.5"]
memory = { sim0 = "8GiB", sim1 = "8GiB" }
warmup_batches = 1

[models.a]
source = "sim"
memory_gib = 7
sim_base_ms = 2
sim_per_sample_ms = 0.5
min_replicas = 1

[models.b]
source = "sim"
memory_gib = 7
sim_base_ms = 2
sim_per_sample_ms = 0.5
min_replicas = 0

[models.cold]
source = "sim"
memory_gib = 7
sim_base_ms = 2
sim_per_sample_ms = 0.5
sim_load_ms = 300
min_replicas = 0
"""
SAMPLE = {"x": np.ones((1, 256), np.float32)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("placement")
    config = folder / "evenflow.toml"
    config.write_text(CONFIG)
    proc = start_server(["--config", str(config)], folder / "server.log")
    yield proc
    assert proc.terminate() == 0, proc.log()[-3000:]


async def placement(url: str) -> ef.Placement:
    async with grpc.aio.insecure_channel(url) as channel:
        stats = await ef_grpc.EvenflowStatsStub(channel).GetStats(ef.GetStatsRequest())
    return stats.placement


def serving(found: ef.Placement) -> dict[str, list[str]]:
    by_device: dict[str, list[str]] = {}
    for replica in found.replicas:
        if replica.state == "serving":
            by_device.setdefault(replica.device, []).append(replica.model)
    return by_device


async def test_first_replicas_fit_memory_and_show_in_the_stats(server: ServerProcess) -> None:
    found = await placement(server.url)
    assert found.mode == "auto"
    by_device = serving(found)
    # 8 GiB devices, 7 GiB models: one replica each, a and b placed, cold waits for demand.
    assert sorted(m for models in by_device.values() for m in models) == ["a", "b"]
    assert all(len(models) == 1 for models in by_device.values())
    # Each device's memory, and what its replicas hold of it: their models' footprints.
    footprints = {m.model: m.memory_bytes for m in found.models}
    assert sorted(footprints) == ["a", "b", "cold"]
    assert all(memory_bytes >= 7 * 2**30 for memory_bytes in footprints.values())
    memory = {d.device: (d.memory_bytes, d.reserved_bytes) for d in found.devices}
    assert memory == {device: (8 * 2**30, sum(footprints[m] for m in models))
                      for device, models in by_device.items()}
    async with AsyncClient(server.url, retries=0) as client:
        for model in ("a", "b"):
            out = await client.infer(model, SAMPLE, timeout_s=10.0)
            np.testing.assert_array_equal(out["y"], SAMPLE["x"])


async def test_a_model_with_no_replica_is_loaded_for_its_first_request(
        server: ServerProcess) -> None:
    async with AsyncClient(server.url, retries=0) as client:
        await client.infer("b", SAMPLE, timeout_s=10.0)
        # cold has no replica and no memory: its requests wait until b has been idle long
        # enough to give up its device (a keeps its one replica: min_replicas = 1).
        answers = await asyncio.gather(*(client.infer("cold", SAMPLE, timeout_s=30.0)
                                         for _ in range(8)))
    assert all(np.array_equal(out["y"], SAMPLE["x"]) for out in answers)
    found = await placement(server.url)
    by_device = serving(found)
    assert sorted(m for models in by_device.values() for m in models) == ["a", "cold"]
    moves = [(m.kind, m.model, m.reason, m.outcome) for m in found.recent]
    assert ("drop", "b", "demand", "done") in moves
    assert ("add", "cold", "demand", "done") in moves
    assert found.moves["add/demand/done"] >= 1


async def test_placement_all_keeps_a_replica_of_every_model_on_every_device(
        tmp_path: Path) -> None:
    proc = start_server(["--model", "sim", "--devices", "sim:1,sim:0.5"],
                        tmp_path / "server.log")
    try:
        async with grpc.aio.insecure_channel(proc.url) as channel:
            stats = await ef_grpc.EvenflowStatsStub(channel).GetStats(ef.GetStatsRequest())
        assert stats.placement.mode == "all"
        assert not stats.placement.replicas
        assert sorted(d for r in stats.models[0].replicas for d in r.devices) == ["sim0", "sim1"]
    finally:
        assert proc.terminate() == 0


class PlacementRows(HTMLParser):
    """The devices page's placement rows: device -> the text of its replicas cell, and its
    (memory, reserved) bytes; model -> its replica memory in bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, str] = {}
        self.memory: dict[str, tuple[int, int]] = {}
        self.footprints: dict[str, int] = {}
        self._device: str | None = None
        self._cells = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "tr" and values.get("data-placement-device"):
            self._device, self._cells = values["data-placement-device"], 0
            self.rows[self._device] = ""
            self.memory[self._device] = (int(values.get("data-memory-bytes") or 0),
                                         int(values.get("data-reserved-bytes") or 0))
        elif tag == "tr" and values.get("data-placement-model"):
            self.footprints[values["data-placement-model"] or ""] = \
                int(values.get("data-memory-bytes") or 0)
        elif tag == "td" and self._device is not None:
            self._cells += 1

    def handle_data(self, data: str) -> None:
        if self._device is not None and self._cells == 3:
            self.rows[self._device] = self.rows.get(self._device, "") + data

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._device = None


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium on the PATH")
async def test_the_devices_page_shows_the_placement(server: ServerProcess,
                                                    tmp_path: Path) -> None:
    dom = await chromium(tmp_path / "profile", f"--virtual-time-budget={VIRTUAL_TIME_MS}",
                         "--dump-dom", f"{http_url(server)}/")
    parser = PlacementRows()
    parser.feed(dom.decode())
    stats = await placement(server.url)
    found = serving(stats)
    assert sorted(parser.rows) == ["sim0", "sim1"]
    for device, models in found.items():
        assert all(model in parser.rows[device] for model in models), parser.rows
    assert parser.memory == {d.device: (d.memory_bytes, d.reserved_bytes) for d in stats.devices}
    assert parser.footprints == {m.model: m.memory_bytes for m in stats.models}
