"""Step (g), two or more GPUs: least-work against round-robin (the policies and their flags of
``benchmarks.uneven_devices``) serving the encoder on every GPU while another process loads the
last one, each policy measured under the same load."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

from benchmarks.gpu_check.context import StepContext
from benchmarks.gpu_check.serving import serving
from benchmarks.harness import REPO, closed_loop_run, wait_for_line
from benchmarks.uneven_devices import POLICIES, get_stats
from evenflow.loadtest.runner import mlp_like_request
from evenflow.server.models.builtin import ENCODER_SIZES

POLICY_PAIR = ("least-work", "round-robin")
SECONDS = 10.0
CONCURRENCY = 64
REQUEST_SAMPLES = 8


def uneven(ctx: StepContext) -> dict[str, Any]:
    devices = ",".join(f"cuda:{i}" for i in range(ctx.gpus))
    slowed = ctx.gpus - 1
    loader = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu_check.loader", str(slowed)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line, _ = wait_for_line(loader, "loading", 120.0)
        if line is None:
            raise RuntimeError("the loader process did not start")
        results = {policy: _measure(ctx, devices, policy) for policy in POLICY_PAIR}
    finally:
        loader.kill()
        loader.wait()
        if loader.stdout is not None:
            loader.stdout.close()
    lw, rr = (results[p]["samples_per_s"] for p in POLICY_PAIR)
    return {"devices": devices, "loaded_device": f"cuda:{slowed}", "policies": results,
            "least_work_over_round_robin": lw / rr}


def _measure(ctx: StepContext, devices: str, policy: str) -> dict[str, Any]:
    size = ENCODER_SIZES["bert-base"]
    request = mlp_like_request("encoder", "x", [REQUEST_SAMPLES, size.seq, size.width])
    with serving(ctx.out / f"uneven_{policy}.log", "--model", "encoder", "--encoder-size",
                 "bert-base", "--devices", devices, "--dtype", "bfloat16",
                 *POLICIES[policy]) as server:
        run = asyncio.run(closed_loop_run(server.url, request, concurrency=CONCURRENCY,
                                          seconds=SECONDS, warmup_s=3.0))
        stats = asyncio.run(get_stats(server.url))
    replicas = stats.models[0].replicas
    return {"samples_per_s": REQUEST_SAMPLES * run.ok_per_s,
            "errors": len(run.records) - run.ok,
            "samples_per_replica": {r.devices[0]: r.num_samples for r in replicas}}
