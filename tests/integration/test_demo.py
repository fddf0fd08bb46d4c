"""``evenflow demo`` as a user runs it: the answer checked against the model called directly,
a burst of concurrent requests batched and checked, a line per device, and no refusal."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.servers import TESTS_DIR

# slow: runs `evenflow demo` as a subprocess.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

DEVICE_LINE = re.compile(r"^  (\S+) on (\S+): (\d+) requests in (\d+) batches of [\d-]+ "
                         r"samples \(mean [\d.]+\), busy \d+% of the burst$", re.MULTILINE)


def demo(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR.parent))
    run = subprocess.run([sys.executable, "-m", "evenflow.server.config.cli", "demo", "--log-level",
                          "WARNING", *args], capture_output=True, text=True, timeout=100,
                         check=False, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    print(run.stdout)
    return run.stdout


def test_the_demo_checks_the_answer_batches_a_burst_and_shows_each_device() -> None:
    out = demo()
    assert "model=mlp input x[8, 256] -> y[8, 256]; equal to the model called directly: True" \
        in out
    assert re.search(r"burst of 200 concurrent 1-sample requests in [\d.]+ s: 200 answered "
                     r"\(\d+ req/s\), each equal to the direct call within 0.0001 .*; "
                     r"0 refused by admission$", out, re.MULTILINE)
    ((replica, device, requests, batches),) = DEVICE_LINE.findall(out)
    assert (replica, device, requests) == ("mlp@cpu0", "cpu0", "200")
    assert int(batches) < 200  # batched, not one by one


def test_the_demo_on_uneven_devices_shows_a_line_for_each() -> None:
    out = demo("--model", "sim", "--devices", "sim:1,sim:1,sim:0.5,sim:0.25")
    assert "0 refused by admission" in out
    lines = DEVICE_LINE.findall(out)
    assert [device for _, device, _, _ in lines] == ["sim0", "sim1", "sim2", "sim3"]
    assert sum(int(requests) for _, _, requests, _ in lines) == 200
    fast = int(lines[0][2]) + int(lines[1][2])
    assert fast > 200 / 2  # least-work sends most of the burst to the full-speed devices
