"""GPU check (one prepared script, a few minutes): BERT-base-size ``encoder`` in bfloat16 on
cuda:0, the bare model's samples/s at its best batch size vs evenflow's under load with 8-sample
requests, measured in one run.

    python -m benchmarks.gpu_encoder [--seconds 20]

Prints both and their ratio; writes .bench/gpu_encoder.json. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import REPO, closed_loop_run, evenflow_argv, start, write_json
from evenflow.loadtest.runner import mlp_like_request
from evenflow.server.models.builtin import ENCODER_SIZES, build_encoder


def bare_model(seconds_per_batch: float) -> dict[int, float]:
    size = ENCODER_SIZES["bert-base"]
    module = build_encoder(size).module.to("cuda").to(torch.bfloat16)
    rates = {}
    with torch.inference_mode():
        for batch in (32, 64, 128, 256, 512):
            x = torch.randn(batch, size.seq, size.width, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                module(x)
            torch.cuda.synchronize()
            count, start_s = 0, time.perf_counter()
            while time.perf_counter() - start_s < seconds_per_batch:
                module(x)
                count += 1
            torch.cuda.synchronize()
            rates[batch] = count * batch / (time.perf_counter() - start_s)
            print(f"bare batch {batch}: {rates[batch]:.0f} samples/s", flush=True)
    return rates


async def served(url: str, seconds: float, concurrency: int) -> float:
    size = ENCODER_SIZES["bert-base"]
    run = await closed_loop_run(url, mlp_like_request("encoder", "x", [8, size.seq, size.width]),
                                concurrency=concurrency, seconds=seconds, warmup_s=5.0)
    return 8 * run.ok_per_s


def measure(seconds: float, concurrency: int, out: Path,
            on_phase: Callable[[str], None] = lambda phase: None) -> dict[str, Any]:
    """Both measurements; ``on_phase("bare" | "served" | "done")`` marks where each begins (the
    GPU check samples utilization by phase). The served phase starts once the server is up."""
    on_phase("bare")
    rates = bare_model(3.0)
    best_batch = max(rates, key=rates.__getitem__)
    torch.cuda.empty_cache()
    server = start(evenflow_argv("--model", "encoder", "--encoder-size", "bert-base",
                                 "--devices", "cuda:0", "--dtype", "bfloat16",
                                 "--max-batch", "256", "--latency-target-ms", "200"),
                   out / "gpu_encoder.log", timeout_s=300)
    try:
        on_phase("served")
        evenflow_rate = asyncio.run(served(server.url, seconds, concurrency))
    finally:
        on_phase("done")
        server.stop()
    ratio = evenflow_rate / rates[best_batch]
    print(f"bare model best: {rates[best_batch]:.0f} samples/s at batch {best_batch}; evenflow "
          f"with 8-sample requests: {evenflow_rate:.0f} samples/s; ratio {ratio:.3f}")
    return {"bare_per_batch": rates, "best_batch": best_batch,
            "evenflow_samples_per_s": evenflow_rate, "ratio": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "gpu_encoder.json", measure(args.seconds, args.concurrency, args.out))


if __name__ == "__main__":
    main()
