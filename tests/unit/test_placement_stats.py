"""What operators see of the placement: the stats RPC's message and the Prometheus families,
from a placer snapshot (and nothing of them under ``--placement all``)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from evenflow.balancer.placement.inventory import UNLIMITED_BYTES
from evenflow.balancer.placement.report import (
    DeviceMemory,
    ModelFootprint,
    MoveRecord,
    PlacementSnapshot,
)
from evenflow.server.engine.stats_service import placement_message
from evenflow.server.observability.metrics import collect
from evenflow.server.observability.prometheus import render

GIB = 2**30
SNAPSHOT = PlacementSnapshot(
    mode="auto",
    replicas=(("a", "sim0", "serving"), ("b", "sim1", "loading")),
    moves={"add/plan/done": 3, "drop/demand/skipped": 1},
    recent=(MoveRecord(105.0, "add", "a", "sim0", "plan", 2.1, "done"),),
    demand_per_s={"a": 120.5, "b": 0.0},
    requests_per_s={"a": 30.125, "b": 0.0},
    long_demand_per_s={"a": 96.25, "b": 1.5},
    long_requests_per_s={"a": 24.0625, "b": 0.5},
    devices=(DeviceMemory("sim0", 8 * GIB, 7 * GIB), DeviceMemory("sim1", UNLIMITED_BYTES, 0)),
    models=(ModelFootprint("a", 7 * GIB, 2.5), ModelFootprint("b", 3 * GIB, 0.25)))


def test_the_stats_message_holds_replicas_moves_and_demand() -> None:
    message = placement_message(SNAPSHOT, started_s=100.0)
    assert message.mode == "auto"
    assert [(r.model, r.device, r.state) for r in message.replicas] == list(SNAPSHOT.replicas)
    assert dict(message.moves) == {"add/plan/done": 3, "drop/demand/skipped": 1}
    (move,) = message.recent
    assert (move.at_s, move.kind, move.model, move.took_s) == (5.0, "add", "a", 2.1)
    assert dict(message.demand_per_s) == {"a": 120.5, "b": 0.0}
    assert dict(message.requests_per_s) == {"a": 30.125, "b": 0.0}
    assert dict(message.long_demand_per_s) == {"a": 96.25, "b": 1.5}
    assert dict(message.long_requests_per_s) == {"a": 24.0625, "b": 0.5}
    # A device that declares no memory says 0, not a sentinel.
    assert [(d.device, d.memory_bytes, d.reserved_bytes) for d in message.devices] == [
        ("sim0", 8 * GIB, 7 * GIB), ("sim1", 0, 0)]
    assert [(m.model, m.memory_bytes, m.load_s) for m in message.models] == [
        ("a", 7 * GIB, 2.5), ("b", 3 * GIB, 0.25)]


def test_without_a_placer_the_message_says_all_and_nothing_else() -> None:
    message = placement_message(None, started_s=0.0)
    assert message.mode == "all" and not message.replicas and not message.moves


def test_metrics_export_moves_replicas_and_demand() -> None:
    text = render(collect([], [], {}, (), SNAPSHOT)).decode()
    assert 'evenflow_placement_moves_total{kind="add",outcome="done",reason="plan"} 3.0' in text
    assert 'evenflow_placement_replicas{device="sim1",model="b",state="loading"} 1.0' in text
    assert 'evenflow_model_demand_samples_per_second{model="a"} 120.5' in text
    assert 'evenflow_model_demand_requests_per_second{model="a"} 30.125' in text
    assert 'evenflow_model_demand_long_samples_per_second{model="b"} 1.5' in text
    assert 'evenflow_model_demand_long_requests_per_second{model="a"} 24.0625' in text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    memory = {labels: value for (name, labels), value in samples.items()
              if name.startswith("evenflow_placement_device_memory")}
    assert memory == {(("device", "sim0"),): 8 * GIB}  # none for a device without a limit
    assert samples["evenflow_placement_device_reserved_bytes", (("device", "sim0"),)] == 7 * GIB
    assert samples["evenflow_placement_device_reserved_bytes", (("device", "sim1"),)] == 0
    assert samples["evenflow_model_replica_memory_bytes", (("model", "b"),)] == 3 * GIB
    assert samples["evenflow_model_replica_load_seconds", (("model", "a"),)] == 2.5
    assert "evenflow_placement" not in render(collect([], [], {})).decode()
