"""``python -m benchmarks.gpu_check``: run every step, each in its own process under its own
time limit and within the run's budget, and write one report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.gpu_check.context import StepContext
from benchmarks.gpu_check.report import FAILED, NEEDS_CUDA, SKIPPED, StepResult, write_report
from benchmarks.gpu_check.run_step import ERROR_TAIL_CHARS, RESULT_FILE
from benchmarks.gpu_check.steps import STEPS, Step
from benchmarks.harness import REPO, machine

# A dry run's steps mostly start interpreters and import torch: two at a time halve its time on
# a 2-core CI machine.
DRY_RUN_JOBS = 2
# A step is not started with less than this left of the budget: it could not finish.
MIN_STEP_S = 20.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check_report"))
    parser.add_argument("--dry-run", action="store_true",
                        help="no CUDA needed: the server steps on cpu, the rest listed as "
                             "'needs CUDA'")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="the whole run's time limit; each step also has its own")
    parser.add_argument("--jobs", type=int, default=0,
                        help=f"steps run at once (default 1; {DRY_RUN_JOBS} in a dry run)")
    parser.add_argument("--steps", default=",".join(s.name for s in STEPS),
                        help="comma list of the steps to run (default: all)")
    args = parser.parse_args(argv)
    import torch

    gpus = torch.cuda.device_count()
    chosen = set(args.steps.split(","))
    deadline_s = time.monotonic() + args.budget_s

    def outcome(step: Step) -> StepResult:
        skip = _skip_reason(step, chosen, args.dry_run, gpus)
        if skip is not None:
            return StepResult(step.name, step.title, *skip)
        ctx = StepContext(out=args.out.resolve() / step.name, dry_run=args.dry_run, gpus=gpus)
        result = _run(step, ctx, deadline_s)
        print(f"gpu_check: {step.name}: {result.status} ({result.seconds:.1f} s)", flush=True)
        return result

    # On GPUs one step at a time: each measures the devices alone.
    jobs = args.jobs or (DRY_RUN_JOBS if args.dry_run else 1)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(outcome, STEPS))
    header = {"command": " ".join(["python -m benchmarks.gpu_check", *sys.argv[1:]]),
              "dry_run": args.dry_run, "gpus": gpus,
              "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
              "machine": machine()}
    write_report(args.out, header, results)
    print(f"gpu_check: wrote {args.out / 'report.md'} and {args.out / 'report.json'}")
    return 1 if any(r.status == FAILED for r in results) else 0


def _skip_reason(step: Step, chosen: set[str], dry_run: bool,
                 gpus: int) -> tuple[str, float, str] | None:
    if step.name not in chosen:
        return SKIPPED, 0.0, "not in --steps"
    if dry_run:
        return None if step.dry_run else (NEEDS_CUDA, 0.0, "dry run: no CUDA used")
    if gpus == 0:
        return NEEDS_CUDA, 0.0, "no CUDA device visible (try --dry-run)"
    if gpus < step.min_gpus:
        return SKIPPED, 0.0, f"needs {step.min_gpus} GPUs; {gpus} visible"
    return None


def _run(step: Step, ctx: StepContext, deadline_s: float) -> StepResult:
    timeout_s = min(step.timeout_s, deadline_s - time.monotonic())
    if timeout_s < MIN_STEP_S:
        return StepResult(step.name, step.title, SKIPPED, 0.0,
                          "out of the run's time budget (--budget-s)")
    ctx.out.mkdir(parents=True, exist_ok=True)
    log_path = ctx.out / "step.log"
    start_s = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.gpu_check.run_step", step.name, *ctx.to_argv()],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    seconds = time.monotonic() - start_s
    log_tail = log_path.read_text(errors="replace")[-ERROR_TAIL_CHARS:]
    result_path = ctx.out / RESULT_FILE
    if timed_out:
        return StepResult(step.name, step.title, FAILED, seconds,
                          f"{log_tail}\ntimed out after {timeout_s:.0f} s")
    if not result_path.exists():
        return StepResult(step.name, step.title, FAILED, seconds,
                          f"{log_tail}\nstep process exited with {proc.returncode}, no result")
    payload = json.loads(result_path.read_text())
    return StepResult(step.name, step.title, payload["status"], seconds,
                      payload.get("error", ""), payload.get("results", {}))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """The step and what it started (servers, a loader): its own session, so one signal."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


if __name__ == "__main__":
    sys.exit(main())
