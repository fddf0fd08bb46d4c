"""Metric families through prometheus_client: names kept exactly, labels escaped, types right."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from evenflow.server.observability.prometheus import MetricFamily, render


def parsed(page: bytes) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    """family name -> (type, [(sample name, labels, value)]), read by prometheus_client's own
    parser, so the page is valid exposition text."""
    return {f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples])
            for f in text_string_to_metric_families(page.decode())}


def test_triton_counters_keep_their_names_and_ours_are_counters() -> None:
    triton = MetricFamily("nv_inference_count", "counter", "Number of inferences")
    triton.add(12, model="mlp", version="1")
    triton.add(0.25, model="sim", version="1")
    ours = MetricFamily("evenflow_replica_batches_total", "counter", "Batches run")
    ours.add(3, model="mlp", replica="mlp@cpu0")
    page = render([triton, ours])
    assert b"nv_inference_count_total" not in page  # Triton's dashboards query the bare name
    families = parsed(page)
    assert families["nv_inference_count"] == ("unknown", [
        ("nv_inference_count", {"model": "mlp", "version": "1"}, 12.0),
        ("nv_inference_count", {"model": "sim", "version": "1"}, 0.25)])
    assert families["evenflow_replica_batches"] == ("counter", [
        ("evenflow_replica_batches_total", {"model": "mlp", "replica": "mlp@cpu0"}, 3.0)])


def test_label_values_and_help_are_escaped() -> None:
    family = MetricFamily("m", "gauge", "line one\nback\\slash")
    family.add(1, model='a"b\\c\nd')
    page = render([family])
    assert b"# HELP m line one\\nback\\\\slash" in page
    assert parsed(page)["m"] == ("gauge", [("m", {"model": 'a"b\\c\nd'}, 1.0)])


def test_families_without_samples_are_left_out() -> None:
    empty = MetricFamily("nv_gpu_utilization", "gauge", "GPU utilization")
    plain = MetricFamily("up", "gauge", "1 when serving")
    plain.add(1)
    assert set(parsed(render([empty, plain]))) == {"up"}
    assert render([empty]) == b""
