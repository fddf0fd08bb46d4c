"""Overload: 3x capacity offered open loop to sim devices; admission refuses the excess early,
as RESOURCE_EXHAUSTED well within the request's own deadline, and no request runs out its
deadline, with the latency target declared an SLO (``--slo-ms``) and with the server's default
admission (a queueing budget). Goodput and latency figures are not asserted here:
``python -m benchmarks.overload`` reports them.

The benchmark runs as its own process, as a user runs it: its load generator must not share an
event loop, or a garbage collector, with a test process that has already run hundreds of tests
(an open-loop generator's stalls are counted as the server's latency)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness import REPO
from benchmarks.overload import CAPACITY_PER_S, DEADLINE_S

# slow, timing: 5 s of overload per mode against a subprocess server.
pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.timeout(120)]


def overload(mode: str, out: Path) -> dict[str, Any]:
    """One mode of the benchmark at 3x capacity for 5 s: its result."""
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.overload", "--seconds", "5", "--factor", "3",
         "--modes", mode, "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=100, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    print(run.stdout)
    (result,) = json.loads((out / "overload.json").read_text())["results"].values()
    assert result["offered_per_s"] == 3 * CAPACITY_PER_S
    # Every request answered (the benchmark fails on a dropped one), as a success or a
    # refusal: none ran out its deadline.
    assert set(result["answers"]) == {"OK", "RESOURCE_EXHAUSTED"}
    # Refused early, not after queueing to its deadline: a generous bound, a fifth of it.
    assert result["refusal_p99_ms"] < DEADLINE_S * 1e3 / 5
    return dict(result)


def test_three_times_capacity_with_a_declared_slo_refuses_the_excess_early(
        tmp_path: Path) -> None:
    overload("slo", tmp_path)


def test_three_times_capacity_by_default_refuses_the_excess_early(tmp_path: Path) -> None:
    result = overload("default", tmp_path)
    # The excess (two thirds of what is offered) is refused, not queued.
    assert result["answers"]["RESOURCE_EXHAUSTED"] >= 0.5 * result["sent"]
