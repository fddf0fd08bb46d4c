"""``evenflow demo``: serve the configured models on a free loopback port, call the first one
through the client SDK, check the answer against the model called directly, send a burst of
concurrent one-sample requests (checked too) and show how it was batched on each device, then
shut down."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter

import grpc
import numpy as np
import torch

from evenflow.client import AsyncClient, ServerOverloadedError
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc
from evenflow.server.config.server_config import ServerConfig
from evenflow.server.engine.app import App

TOLERANCE = 1e-4  # batched kernels may round differently from the direct call


async def run_demo(config: ServerConfig, *, num_requests: int) -> int:
    # Free ports: a demo must not fail because something else holds 8000 or 8001.
    app = App(dataclasses.replace(config, port=0,
                                  http_port=None if config.http_port is None else 0))
    port = await app.start()
    url = f"{config.host}:{port}"
    print(f"evenflow listening on {url}", flush=True)
    if app.http_port:
        print(f"evenflow http on http://{config.host}:{app.http_port} (the devices page: "
              f"http://{config.host}:{app.http_port}/)", flush=True)
    try:
        assert app.models is not None
        model = next(iter(app.models))
        spec = model.definition.inputs[0]
        output_name = model.definition.outputs[0].name
        shape = tuple(8 if d == -1 else d for d in spec.shape)
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        with torch.inference_mode():
            expected = model.definition.module(torch.from_numpy(x.copy())).numpy()
        async with AsyncClient(url) as client, grpc.aio.insecure_channel(url) as channel:
            stats = ef_grpc.EvenflowStatsStub(channel)
            ready = await client.server_ready()
            y = (await client.infer(model.name, {spec.name: x}, timeout_s=30.0))[output_name]
            max_diff = float(np.abs(y - expected).max())
            print(f"ready={ready} model={model.name} input {spec.name}{list(shape)} -> "
                  f"{output_name}{list(y.shape)}; equal to the model called directly: "
                  f"{bool(np.array_equal(y, expected))} (max |diff| {max_diff:.2e})")

            before = await _replicas(stats, model.name)
            one = {spec.name: x[:1]}
            start = time.perf_counter()
            answers = await asyncio.gather(*(client.infer(model.name, one, timeout_s=30.0)
                                             for _ in range(num_requests)),
                                           return_exceptions=True)
            elapsed_s = time.perf_counter() - start
            after = await _replicas(stats, model.name)
        refused = [a for a in answers if isinstance(a, ServerOverloadedError)]
        failed = [a for a in answers if isinstance(a, BaseException) and a not in refused]
        outputs = [a[output_name] for a in answers if not isinstance(a, BaseException)]
        burst_diff = max((float(np.abs(o - expected[:1]).max()) for o in outputs), default=0.0)
        print(f"burst of {num_requests} concurrent 1-sample requests in {elapsed_s:.3f} s: "
              f"{len(outputs)} answered ({len(outputs) / elapsed_s:.0f} req/s), each equal to "
              f"the direct call within {TOLERANCE:g} (max |diff| {burst_diff:.2e}); "
              f"{len(refused)} refused by admission"
              + (f" ({refused[0]})" if refused else "")
              + (f"; {len(failed)} failed: {failed[0]!r}" if failed else ""))
        for name, line in _device_lines(before, after, elapsed_s):
            print(f"  {name}: {line}")
        ok = max_diff < TOLERANCE and burst_diff < TOLERANCE and not failed
        return 0 if ok else 1
    finally:
        await app.stop(grace_s=5.0)


async def _replicas(stats: ef_grpc.EvenflowStatsStub, model: str) -> list[ef.ReplicaStats]:
    response = await stats.GetStats(ef.GetStatsRequest(model_name=model), timeout=10.0)
    return list(response.models[0].replicas)


def _device_lines(before: list[ef.ReplicaStats], after: list[ef.ReplicaStats],
                  elapsed_s: float) -> list[tuple[str, str]]:
    """Per replica, what the burst did there: requests (one sample each), batches by size, and
    the share of the burst's time its device was busy."""
    earlier = {replica.name: replica for replica in before}
    lines = []
    for replica in after:
        old = earlier.get(replica.name, ef.ReplicaStats())
        sizes = Counter(dict(replica.batch_size_counts))
        sizes.subtract(dict(old.batch_size_counts))
        ran = sorted(size for size, count in sizes.items() if count > 0)
        num_batches = replica.num_batches - old.num_batches
        num_samples = replica.num_samples - old.num_samples
        span = f"{ran[0]}-{ran[-1]}" if ran and ran[0] != ran[-1] else "".join(map(str, ran))
        shown = (f" of {span} samples (mean {num_samples / num_batches:.1f})"
                 if ran and num_batches else "")
        busy_s = replica.busy_s - old.busy_s
        lines.append((f"{replica.name} on {','.join(replica.devices)}",
                      f"{num_samples} requests in {num_batches} batches{shown}, "
                      f"busy {min(1.0, busy_s / elapsed_s):.0%} of the burst"))
    return lines
