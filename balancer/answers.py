"""Answering a batch's requests, and counting what each answer says about the model: the
Triton-style statistics, the latency histogram, and how late each answer was against the
prediction admission made for it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from evenflow.balancer.job import BatchTiming, Job
from evenflow.balancer.stats import ModelCounters


def answer_batch(counters: ModelCounters, jobs: Sequence[Job], outputs: Sequence[Any], *,
                 timing: BatchTiming, num_samples: int, start_s: float, now_s: float) -> None:
    """Resolve each job's future with its output (a batch of ``num_samples`` that started at
    ``start_s`` and was answered at ``now_s``) and count the batch and its requests."""
    num_jobs = len(jobs)
    counters.record_batch(num_samples, timing)
    counters.last_inference_s = time.time()
    counters.compute_input.add(timing.copy_in_s * num_jobs, num_jobs)
    counters.compute_infer.add(timing.compute_s * num_jobs, num_jobs)
    counters.compute_output.add(timing.copy_out_s * num_jobs, num_jobs)
    arrivals_s = 0.0
    observe = counters.latency.observe
    for job, output in zip(jobs, outputs, strict=True):
        arrivals_s += job.arrival_s
        observe(now_s - job.arrival_s)
        if not job.future.done():  # else the caller went away while the batch ran
            job.future.set_result(output)
    counters.queue.add(start_s * num_jobs - arrivals_s, num_jobs)
    counters.success.add(now_s * num_jobs - arrivals_s, num_jobs)


def fail_jobs(counters: ModelCounters, jobs: Sequence[Job], error: BaseException,
              now_s: float) -> None:
    """Fail each job's future with ``error`` (unless its caller went away) and count it."""
    for job in jobs:
        counters.fail.add(now_s - job.arrival_s)
        if not job.future.done():
            job.future.set_exception(error)
