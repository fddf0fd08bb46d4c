"""Step (a): ``pytest tests/gpu -m gpu`` in a subprocess, each test's outcome from its JUnit XML."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.gpu_check.context import StepContext
from benchmarks.harness import REPO

PYTEST_TIMEOUT_S = 240.0


def gpu_tests(ctx: StepContext) -> dict[str, Any]:
    junit = ctx.out / "junit.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-q", "-p", "no:cacheprovider",
         f"--junitxml={junit}"], cwd=REPO, capture_output=True, text=True,
        timeout=PYTEST_TIMEOUT_S, check=False)
    (ctx.out / "pytest.log").write_text(run.stdout + run.stderr)
    tests = outcomes(junit) if junit.exists() else []
    result = {"exit_code": run.returncode, "tests": tests,
              "counts": {o: sum(1 for t in tests if t["outcome"] == o)
                         for o in ("passed", "failed", "error", "skipped")}}
    # Exit code 5 (nothing collected) fails too: a GPU suite that exists must collect.
    if run.returncode != 0:
        raise RuntimeError(f"pytest exited with {run.returncode}: {result['counts']}\n"
                           f"{run.stdout[-2000:]}")
    return result


def outcomes(junit: Path) -> list[dict[str, Any]]:
    """Each testcase: its id, outcome (passed, failed, error, skipped), seconds and message."""
    cases = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or child.text or "")[:500]
                break
        cases.append({"id": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "time_s": float(case.get("time") or 0.0), "message": message})
    return cases
