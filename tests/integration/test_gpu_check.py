"""``python -m benchmarks.gpu_check --dry-run`` keeps working on a machine without CUDA: every
step is listed, the ones that need no CUDA ran and succeeded, the rest say "needs CUDA"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_check.__main__ import _skip_reason
from benchmarks.gpu_check.gpu_tests import outcomes
from benchmarks.gpu_check.steps import STEPS
from benchmarks.harness import REPO


@pytest.mark.slow  # runs the whole check as a subprocess
@pytest.mark.timeout(150)  # < 60 s on an idle 2-core machine; CI shares its cores
def test_dry_run_lists_every_step_and_the_ones_it_ran_succeeded(tmp_path: Path) -> None:
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--dry-run",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=140, check=False)
    report = json.loads((out / "report.json").read_text())
    statuses = {s["name"]: s["status"] for s in report["steps"]}
    assert list(statuses) == [s.name for s in STEPS]
    assert statuses == {s.name: "ran" if s.dry_run else "needs CUDA" for s in STEPS}, \
        run.stdout + "\n".join(s["reason"] for s in report["steps"])
    assert run.returncode == 0
    steps = {s["name"]: s for s in report["steps"]}
    assert all(r["bit_exact"] for r in steps["serve"]["results"]["runs"])
    assert {(r["workers"], r["model"]) for r in steps["serve"]["results"]["runs"]} == {
        (w, m) for w in ("thread", "process") for m in ("mlp", "encoder")}
    assert [r["devices"] for r in steps["pipeline"]["results"]["runs"]] == ["cpu:0,cpu:1"]
    assert set(steps["warmup"]["results"]["models"]) == {"mlp", "encoder"}
    assert {t["outcome"] for t in steps["gpu_tests"]["results"]["tests"]} == {"skipped"}
    markdown = (out / "report.md").read_text()
    assert all(f"| {s.name} | {statuses[s.name]} |" in markdown for s in STEPS)


def test_junit_outcomes_are_read_per_test(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.gpu.t" name="ok" time="0.5"/>'
        '<testcase classname="tests.gpu.t" name="bad" time="1.0">'
        '<failure message="assert 1 == 2">trace</failure></testcase>'
        '<testcase classname="tests.gpu.t" name="broken" time="0"><error message="boom"/>'
        '</testcase>'
        '<testcase classname="tests.gpu.t" name="later" time="0">'
        '<skipped message="needs a CUDA device"/></testcase>'
        '</testsuite></testsuites>')
    assert [(t["id"], t["outcome"], t["message"]) for t in outcomes(junit)] == [
        ("tests.gpu.t::ok", "passed", ""), ("tests.gpu.t::bad", "failed", "assert 1 == 2"),
        ("tests.gpu.t::broken", "error", "boom"),
        ("tests.gpu.t::later", "skipped", "needs a CUDA device")]


def test_steps_that_cannot_run_say_why() -> None:
    uneven = next(s for s in STEPS if s.name == "uneven")
    serve = next(s for s in STEPS if s.name == "serve")
    everything = {s.name for s in STEPS}
    assert _skip_reason(uneven, everything, dry_run=False, gpus=1) == (
        "skipped", 0.0, "needs 2 GPUs; 1 visible")
    assert _skip_reason(uneven, everything, dry_run=False, gpus=2) is None
    assert _skip_reason(serve, everything, dry_run=False, gpus=0) == (
        "needs CUDA", 0.0, "no CUDA device visible (try --dry-run)")
    assert _skip_reason(serve, everything, dry_run=True, gpus=0) is None
    assert _skip_reason(uneven, everything, dry_run=True, gpus=4) == (
        "needs CUDA", 0.0, "dry run: no CUDA used")
    assert _skip_reason(serve, {"uneven"}, dry_run=False, gpus=1) == (
        "skipped", 0.0, "not in --steps")
