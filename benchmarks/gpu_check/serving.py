"""Servers for the checks, and the model called directly to compare their answers against.

Servers are ``evenflow serve`` processes started the benchmarks' way (``harness.start``), so the
check runs the command users run. The direct call uses the server's own casts to and from the
device (``to_device``/``to_host``) around a plain forward of a copy of the same model on the same
device in the same dtype, so any difference is the server's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.harness import Server, evenflow_argv, start
from evenflow.client import Client
from evenflow.server.models.builtin import ENCODER_SIZES, build_encoder, build_mlp
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.workers.replica_module import module_for
from evenflow.server.workers.tensors import to_device, to_host
from evenflow.server.workers.thread_host import TORCH_DTYPES

# Requests per model: their batch sizes. Sent one at a time, so each request is a batch alone
# and the direct call sees exactly the batch the server ran.
BATCH_SIZES = (1, 3, 8)
# The server's torch threads for CPU workers (--cpu-threads' default); the direct call on a CPU
# uses as many, so that its kernels split work the same way.
CPU_THREADS = 1


def definition(model: str, encoder_size: str) -> ModelDefinition:
    if model == "mlp":
        return build_mlp()
    if model == "encoder":
        return build_encoder(ENCODER_SIZES[encoder_size])
    raise ValueError(f"no reference for model {model!r}")


def inputs_for(model_definition: ModelDefinition, batch: int, seed: int) -> np.ndarray:
    spec = model_definition.inputs[0]
    shape = (batch, *spec.shape[1:])
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@contextlib.contextmanager
def serving(log_path: Path, *args: str, timeout_s: float = 240.0) -> Iterator[Server]:
    """``evenflow serve ARGS`` on a free port until the block ends; answers must come back."""
    server = start(evenflow_argv("--log-level", "INFO", *args), log_path, timeout_s=timeout_s)
    try:
        yield server
    finally:
        code = server.stop()
        if code != 0:
            raise RuntimeError(f"server exited with {code}; log: {log_path}")


def direct_outputs(model_definition: ModelDefinition, x: np.ndarray, device: str,
                   dtype: str) -> np.ndarray:
    """The model called directly on ``device`` in ``dtype`` (float32 on a CPU, as the server)."""
    torch_device = torch.device(device)
    float_dtype = TORCH_DTYPES[dtype] if torch_device.type == "cuda" else torch.float32
    torch.set_num_threads(CPU_THREADS)
    module = module_for(model_definition, torch_device, float_dtype)
    with torch.inference_mode():
        y = module(to_device(x, "FP32", torch_device, float_dtype))
        return to_host(y, model_definition.outputs[0].datatype)


def compare(got: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    same_shape = got.shape == want.shape
    diff = float(np.max(np.abs(got.astype(np.float64) - want))) if same_shape and got.size \
        else float("nan")
    return {"shape": list(got.shape), "bit_exact": same_shape and np.array_equal(got, want),
            "max_abs_diff": diff}


def answers(url: str, model: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Each input sent alone with evenflow's client, in turn."""
    with Client(url) as client:
        return [client.infer(model, {"x": x}, timeout_s=120.0)["y"] for x in inputs]


def pipeline_stages(url: str) -> list[dict[str, Any]]:
    """The first replica's stages (device and layers) as the server reports them."""
    from benchmarks.uneven_devices import get_stats

    stats = asyncio.run(get_stats(url))
    replica = stats.models[0].replicas[0]
    return [{"device": s.device, "first_layer": s.first_layer, "last_layer": s.last_layer}
            for s in replica.stages]
