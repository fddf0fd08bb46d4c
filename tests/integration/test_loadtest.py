"""A short sweep of ``evenflow loadtest`` against a real evenflow server."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

# slow, timing: load test runs for seconds against subprocess servers.
pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.timeout(120)]


def loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "evenflow.server.config.cli", "loadtest", *args],
                          check=False, capture_output=True, text=True, timeout=100)


def test_two_second_sweep_writes_sane_results(server_factory, tmp_path: Path) -> None:
    server = server_factory("--model", "sim", "--devices", "sim:1,sim:0.5", "--sim-base-ms", "2",
                            "--sim-per-sample-ms", "0.5")
    out = tmp_path / "sweep"
    run = loadtest("--url", server.url, "--model", "sim", "--concurrency", "2,8",
                   "--duration-s", "2", "--warmup-s", "0.5", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["environment"]["command"]
    points = results["points"]
    assert [p["value"] for p in points] == [2, 8]
    for point in points:
        assert point["status_counts"].get("OK", 0) > 0
        assert set(point["status_counts"]) == {"OK"}
        assert point["throughput_per_s"] > 0
        latency = point["latency_ms"]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"] < 5_000
        server_view = point["server"]
        assert server_view["is_evenflow"]
        assert {s["device"] for s in server_view["samples"]} == {"sim0", "sim1"}
        assert all(0.0 <= s["busy_fraction"] <= 1.0 for s in server_view["samples"])
        assert server_view["breakdown_ms"]["compute_infer"] > 0
        assert sum(server_view["batch_size_counts"].values()) > 0
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["value"]) for r in rows] == [2.0, 8.0]
    assert all(float(r["p99_ms"]) > 0 for r in rows)
    for name in ("latency_vs_throughput.png", "latency_cdf.png", "busy_over_time.png",
                 "batch_size_over_time.png"):
        assert (out / name).stat().st_size > 1000
    assert "latency_cdf.png" in (out / "report.md").read_text()

    compare = loadtest("compare", str(out), str(out), "--out", str(tmp_path))
    assert compare.returncode == 0, compare.stderr
    assert (tmp_path / "compare.png").exists()


def test_open_loop_scenario_with_admin_action(server_factory, tmp_path: Path) -> None:
    server = server_factory("--model", "sim", "--devices", "sim:1,sim:1", "--admin",
                            "--sim-base-ms", "2", "--sim-per-sample-ms", "0.5")
    scenario = tmp_path / "s.toml"
    scenario.write_text('duration_s = 2\n[[step]]\nat_s = 0\nrate = 100\n'
                        '[[step]]\nat_s = 1\naction = "set_device_speed"\ndevice = "sim1"\n'
                        'speed = 0.5\n[[step]]\nat_s = 1.5\nburst = 20\n')
    out = tmp_path / "scenario"
    run = loadtest("--url", server.url, "--model", "sim", "--scenario", str(scenario),
                   "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    point = json.loads((out / "results.json").read_text())["points"][0]
    events = [what for _, what in point["events"]]
    assert "sim1: speed 1 -> 0.5" in events and "burst of 20" in events
    assert point["status_counts"].get("OK", 0) > 0
    assert any(v is not None for v in point["p99_series_ms"])
    assert point["generator_cpu_fraction"] > 0.0  # measured, not left at 0
    report = (out / "report.md").read_text()
    assert "scenario: " in report and "0 req/s" not in report  # labelled by what it is
    assert (out / "over_time.png").stat().st_size > 1000


def test_slo_search_finds_a_rate_within_the_slo(server_factory, tmp_path: Path) -> None:
    # One sim device: 2 ms + 0.5 ms per sample and a 20 ms SLO; the search (short points, a
    # coarse bracket) must end with a rate that passed and say so (the rate itself is a
    # benchmark's figure, not asserted).
    server = server_factory("--model", "sim", "--devices", "sim:1", "--sim-base-ms", "2",
                            "--sim-per-sample-ms", "0.5", "--latency-target-ms", "20")
    out = tmp_path / "slo"
    run = loadtest("--url", server.url, "--model", "sim", "--slo-ms", "20", "--start-rate",
                   "100", "--duration-s", "0.6", "--warmup-s", "0.2", "--tolerance", "0.5",
                   "--repeats", "1", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    search = results["slo_search"]
    assert search["goodput_per_s"] > 0  # a rate that passed, not "none found"
    passing = [p for p in search["probes"] if p["rate_per_s"] == search["goodput_per_s"]]
    assert passing and all(p["p99_ms"] <= 20.0 for p in passing)
    assert len(results["points"]) == len(search["probes"])
    assert "SLO goodput" in run.stdout and "SLO goodput" in (out / "report.md").read_text()
    assert (out / "slo_search.png").stat().st_size > 1000
