"""What operators see of the placement: the stats RPC's message and the Prometheus families,
from a placer snapshot (and nothing of them under ``--placement all``)."""

from __future__ import annotations

from evenflow.balancer.placement.report import MoveRecord, PlacementSnapshot
from evenflow.server.engine.stats_service import placement_message
from evenflow.server.observability.metrics import collect
from evenflow.server.observability.prometheus import render

SNAPSHOT = PlacementSnapshot(
    mode="auto",
    replicas=(("a", "sim0", "serving"), ("b", "sim1", "loading")),
    moves={"add/plan/done": 3, "drop/demand/skipped": 1},
    recent=(MoveRecord(105.0, "add", "a", "sim0", "plan", 2.1, "done"),),
    demand_per_s={"a": 120.5, "b": 0.0},
    requests_per_s={"a": 30.125, "b": 0.0})


def test_the_stats_message_holds_replicas_moves_and_demand() -> None:
    message = placement_message(SNAPSHOT, started_s=100.0)
    assert message.mode == "auto"
    assert [(r.model, r.device, r.state) for r in message.replicas] == list(SNAPSHOT.replicas)
    assert dict(message.moves) == {"add/plan/done": 3, "drop/demand/skipped": 1}
    (move,) = message.recent
    assert (move.at_s, move.kind, move.model, move.took_s) == (5.0, "add", "a", 2.1)
    assert dict(message.demand_per_s) == {"a": 120.5, "b": 0.0}
    assert dict(message.requests_per_s) == {"a": 30.125, "b": 0.0}


def test_without_a_placer_the_message_says_all_and_nothing_else() -> None:
    message = placement_message(None, started_s=0.0)
    assert message.mode == "all" and not message.replicas and not message.moves


def test_metrics_export_moves_replicas_and_demand() -> None:
    text = render(collect([], [], {}, (), SNAPSHOT)).decode()
    assert 'evenflow_placement_moves_total{kind="add",outcome="done",reason="plan"} 3.0' in text
    assert 'evenflow_placement_replicas{device="sim1",model="b",state="loading"} 1.0' in text
    assert 'evenflow_model_demand_samples_per_second{model="a"} 120.5' in text
    assert 'evenflow_model_demand_requests_per_second{model="a"} 30.125' in text
    assert "evenflow_placement" not in render(collect([], [], {})).decode()
