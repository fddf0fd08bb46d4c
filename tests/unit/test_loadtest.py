"""The harness's own logic: arrival schedules, percentiles, summaries and report files."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from evenflow.loadtest.arrivals import Arrival, send_times_s
from evenflow.loadtest.histogram import LatencyHistogram
from evenflow.loadtest.report import write_results
from evenflow.loadtest.scenario import load_scenario
from evenflow.loadtest.sweep import RECORD_DTYPE, GeneratorShare, LoadSpec, summarize

SCENARIOS = Path(__file__).resolve().parents[2] / "loadtest" / "scenarios"


def cv(gaps: list[float]) -> float:
    return statistics.pstdev(gaps) / statistics.fmean(gaps)


@pytest.mark.parametrize(("text", "expected_cv"), [
    ("constant", 0.0), ("poisson", 1.0), ("gamma:2", 2.0), ("gamma:0.5", 0.5)])
def test_arrivals_have_the_rate_and_burstiness_asked_for(text: str, expected_cv: float) -> None:
    gaps = Arrival.parse(text).gaps_s(500.0, 40_000, random.Random(3))
    assert statistics.fmean(gaps) == pytest.approx(1 / 500, rel=0.03)
    assert cv(gaps) == pytest.approx(expected_cv, abs=0.06)


def test_schedules_are_seeded_and_bounded() -> None:
    first = send_times_s(Arrival.parse("poisson"), 200.0, 5.0, seed=7)
    assert first == send_times_s(Arrival.parse("poisson"), 200.0, 5.0, seed=7)
    assert first != send_times_s(Arrival.parse("poisson"), 200.0, 5.0, seed=8)
    assert all(0 < t < 5.0 for t in first)
    assert first == sorted(first)
    assert len(first) == pytest.approx(1000, rel=0.1)


@pytest.mark.parametrize("text", ["uniform", "gamma:0", "poisson:3"])
def test_bad_arrivals_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Arrival.parse(text)


def test_histogram_percentiles_match_exact_ones() -> None:
    latencies = np.random.default_rng(0).lognormal(mean=-4.0, sigma=0.7, size=50_000)
    hist = LatencyHistogram()
    hist.record_all_s(latencies.tolist())
    for p in (50, 90, 99, 99.9):
        exact_ms = float(np.percentile(latencies, p)) * 1000
        assert hist.percentile_ms(p) == pytest.approx(exact_ms, rel=0.01)
    assert hist.count == 50_000


def recorded_point(start_s: float = 100.0) -> GeneratorShare:
    """4 s of 1 request/ms, 10 ms each, every 100th failing; the first second is warm-up."""
    rows = []
    for i in range(4000):
        intended = start_s + i / 1000
        status = "UNAVAILABLE" if i % 100 == 0 else "OK"
        rows.append((intended, intended + 0.0001, intended + 0.010, status))
    return GeneratorShare(np.array(rows, dtype=RECORD_DTYPE), cpu_s=0.4, wall_s=4.0, dropped=0)


def test_summary_excludes_warmup_and_counts_statuses() -> None:
    spec = LoadSpec("x", b"", "rate", 1000.0, 4.0)
    result = summarize(spec, [recorded_point()], start_s=100.0, warmup_s=1.0)
    assert result.status_counts == {"OK": 2970, "UNAVAILABLE": 30}
    assert result.latency_ms["p50"] == pytest.approx(10.0, rel=0.01)
    assert result.throughput_per_s == pytest.approx(990, rel=0.02)
    assert result.generator_cpu_fraction == pytest.approx(0.1)
    assert result.schedule_lag_p99_ms == pytest.approx(0.1, rel=0.01)
    assert not result.warnings


def test_summary_warns_about_a_saturated_generator() -> None:
    share = recorded_point()
    share.cpu_s = 3.9
    result = summarize(LoadSpec("x", b"", "concurrency", 8, 4.0), [share], 100.0, 1.0)
    assert any("measuring" in w for w in result.warnings)


def test_report_files_from_a_recorded_result(tmp_path: Path) -> None:
    spec = LoadSpec("x", b"", "rate", 1000.0, 4.0)
    point = summarize(spec, [recorded_point()], 100.0, 1.0).as_dict() | {"warmup_s": 1.0}
    point["server"] = {"samples": [
        {"t_s": t / 4, "replica": r, "device": r, "busy_fraction": 0.5, "batch_size": 4,
         "queued_requests": 0} for t in range(8) for r in ("m@sim0", "m@sim1")],
        "breakdown_ms": {"queue": 1.0, "compute_infer": 5.0}}
    write_results(tmp_path, {"url": "u", "model": "m", "label": "", "points": [point],
                             "environment": {"command": "evenflow loadtest ..."}})
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["points"][0]["latency_ms"]["p50"] == pytest.approx(10.0, rel=0.01)
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("mode,value,throughput_per_s")
    assert csv_lines[1].startswith("rate,1000.0,")
    for name in ("latency_vs_throughput.png", "latency_cdf.png", "busy_over_time.png",
                 "batch_size_over_time.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
        assert f"({name})" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("name", ["uneven_devices", "burst", "device_slowdown"])
def test_shipped_scenarios_parse(name: str) -> None:
    scenario = load_scenario(SCENARIOS / f"{name}.toml")
    assert scenario.load_steps[0].at_s == 0
    assert scenario.duration_s > max(s.at_s for s in scenario.steps)


def test_scenario_must_start_with_a_load(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('duration_s = 3\n[[step]]\nat_s = 1\nrate = 5\n')
    with pytest.raises(ValueError, match="first step"):
        load_scenario(path)
