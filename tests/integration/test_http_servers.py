"""benchmarks.http_servers at tiny settings for one candidate: its server shares the loop with a
grpc.aio server, answers perf_analyzer over HTTP with binary and JSON inputs, and the run writes
its figures. Compatibility, not the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import REPO, perf_analyzer_binary

# slow: a server process and two perf_analyzer runs (about 10 s).
pytestmark = [pytest.mark.slow, pytest.mark.perf_analyzer, pytest.mark.timeout(60)]


def test_uvicorn_candidate_serves_perf_analyzer_over_http(tmp_path: Path) -> None:
    try:
        perf_analyzer_binary()
    except SystemExit:
        pytest.skip("perf_analyzer not found (set EVENFLOW_PERF_ANALYZER; see README)")
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.http_servers", "--servers", "uvicorn",
         "--concurrency", "1", "--repeats", "1", "--window-ms", "300", "--no-echo",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=50, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "http_servers.json").read_text())
    rows = report["rows"]
    # A point perf_analyzer found no stable window for (a loaded machine) is left out and
    # named; any other failure of perf_analyzer fails the run above.
    left_out = {point.split(" c=")[0] for point in report["failed_points"]}
    assert {row["server"] for row in rows} | left_out == {"uvicorn", "uvicorn+json-in"}
    for row in rows:
        assert row["infer_per_s"] > 0
        assert row["cpu_per_request_us"] > 0
