"""``evenflow demo``: serve the configured models on a free loopback port, call the first one
through the client SDK, check the answer against the model called directly, then shut down."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np
import torch

from evenflow.client import AsyncClient, ServerOverloadedError
from evenflow.server.app import App
from evenflow.server.config import ServerConfig


async def run_demo(config: ServerConfig, *, num_requests: int) -> int:
    app = App(dataclasses.replace(config, port=0))
    port = await app.start()
    url = f"{config.host}:{port}"
    print(f"evenflow listening on {url}", flush=True)
    try:
        assert app.models is not None
        model = next(iter(app.models))
        spec = model.definition.inputs[0]
        shape = tuple(8 if d == -1 else d for d in spec.shape)
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        async with AsyncClient(url) as client:
            ready = await client.server_ready()
            y = (await client.infer(model.name, {spec.name: x}, timeout_s=30.0))
            output_name = model.definition.outputs[0].name
            with torch.inference_mode():
                expected = model.definition.module(torch.from_numpy(x.copy()))
            exact = bool(np.array_equal(y[output_name], expected.numpy()))
            max_diff = float(np.abs(y[output_name] - expected.numpy()).max())
            print(f"ready={ready} model={model.name} input {spec.name}{list(shape)} -> "
                  f"{output_name}{list(y[output_name].shape)}; equal to the model called "
                  f"directly: {exact} (max |diff| {max_diff:.2e})")
            one = {spec.name: x[:1]}
            start = time.perf_counter()
            answers = await asyncio.gather(*(client.infer(model.name, one, timeout_s=30.0)
                                             for _ in range(num_requests)),
                                           return_exceptions=True)
            elapsed = time.perf_counter() - start
            refused = [a for a in answers if isinstance(a, ServerOverloadedError)]
            failed = [a for a in answers if isinstance(a, BaseException) and a not in refused]
            print(f"{num_requests} concurrent 1-sample requests in {elapsed:.3f} s: "
                  f"{num_requests - len(refused) - len(failed)} answered "
                  f"({(num_requests - len(refused)) / elapsed:.0f} req/s), {len(refused)} "
                  "refused at once by admission (predicted past the latency target)"
                  + (f", {len(failed)} failed: {failed[0]!r}" if failed else ""))
            return 0 if max_diff < 1e-4 and not failed else 1
    finally:
        await app.stop(grace_s=5.0)
