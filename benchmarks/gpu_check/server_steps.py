"""Steps (b) to (d): the server's answers, bit for bit, per worker kind, precision and pipeline
direction; and how long each model takes to become ready."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import torch

from benchmarks.gpu_check.context import StepContext
from benchmarks.gpu_check.serving import (
    BATCH_SIZES,
    CPU_THREADS,
    answers,
    compare,
    definition,
    direct_outputs,
    inputs_for,
    pipeline_stages,
    serving,
)
from evenflow.client import Client
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.workers.pipeline.layers import split_into_layers
from evenflow.server.workers.replica_module import copied_to
from evenflow.server.workers.tensors import to_device, to_host

MODELS = ("mlp", "encoder")


class CheckFailed(AssertionError):
    """A step ran and its answers were wrong: the step fails, with the evidence in its result."""


def serve(ctx: StepContext) -> dict[str, Any]:
    """(b) Both models served by thread and by process workers; every answer equal, bit for
    bit, to the model called directly on the same device in the same dtype."""
    runs = []
    for workers in ("thread", "process"):
        for dtype in ctx.dtypes:
            tag = f"serve_{workers}_{dtype}"
            with serving(ctx.out / f"{tag}.log", *_models_args(ctx), "--devices", ctx.device,
                         "--dtype", dtype, "--workers", workers) as server:
                for model in MODELS:
                    model_definition = definition(model, ctx.encoder_size)
                    inputs = [inputs_for(model_definition, b, seed) for seed, b in
                              enumerate(BATCH_SIZES)]
                    got = answers(server.url, model, inputs)
                    checks = [compare(g, direct_outputs(model_definition, x, ctx.device, dtype))
                              for g, x in zip(got, inputs, strict=True)]
                    runs.append({"workers": workers, "dtype": dtype, "model": model,
                                 "device": ctx.device, "requests": checks,
                                 "bit_exact": all(c["bit_exact"] for c in checks)})
    _require_bit_exact(runs)
    return {"runs": runs}


def pipeline(ctx: StepContext) -> dict[str, Any]:
    """(c) mlp as a two-stage pipeline in each direction between a CPU and a GPU; answers
    equal, bit for bit, to the same layers run directly on the devices the server reports for
    each stage, and close to the whole model on a CPU."""
    directions = ("cpu:0,cpu:1",) if ctx.dry_run else ("cpu,cuda:0", "cuda:0,cpu")
    model_definition = definition("mlp", ctx.encoder_size)
    inputs = [inputs_for(model_definition, b, seed) for seed, b in enumerate(BATCH_SIZES)]
    runs = []
    for devices in directions:
        tag = "pipeline_" + devices.replace(",", "_").replace(":", "")
        # Repartitioning while serving would move the cut between the answers and the stats.
        with serving(ctx.out / f"{tag}.log", "--model", "mlp", "--devices", devices,
                     "--pipeline-stages", "2", "--no-repartition") as server:
            got = answers(server.url, "mlp", inputs)
            stages = pipeline_stages(server.url)
        checks = []
        for g, x in zip(got, inputs, strict=True):
            check = compare(g, _staged_outputs(model_definition, x, stages))
            whole = direct_outputs(model_definition, x, "cpu", "float32")
            check["max_abs_diff_to_cpu"] = float(np.max(np.abs(g - whole)))
            check["close_to_cpu"] = bool(np.allclose(g, whole, rtol=1e-4, atol=1e-4))
            checks.append(check)
        runs.append({"devices": devices, "stages": stages, "requests": checks,
                     "bit_exact": all(c["bit_exact"] for c in checks),
                     "close_to_cpu": all(c["close_to_cpu"] for c in checks)})
    _require_bit_exact(runs)
    if not all(run["close_to_cpu"] for run in runs):
        raise CheckFailed(f"pipeline answers far from the CPU's: {runs}")
    return {"runs": runs}


def warmup(ctx: StepContext) -> dict[str, Any]:
    """(d) Per model: the time its load takes (RepositoryModelLoad on a running server: build,
    move, trace, warm up), then its first answer and the median of the next ones. The server
    logs its warm-up batches' time (kept as ``server_warmup_s``), which the load includes;
    the process's own start (interpreter, torch, gRPC, no model) is reported apart."""
    config = ctx.out / "warmup.toml"
    config.write_text("".join(f'[models.{m}]\nsource = "{m}"\nload = false\n\n' for m in MODELS))
    models: dict[str, dict[str, Any]] = {}
    start_s = time.monotonic()
    with serving(ctx.out / "warmup.log", "--config", str(config), "--devices", ctx.device,
                 "--encoder-size", ctx.encoder_size, "--dtype", ctx.dtypes[-1]) as server:
        listening_s = _seconds_since(start_s)
        with Client(server.url) as client:
            for model in MODELS:
                load_s = _timed_load(server.url, model)
                if not client.model_ready(model):
                    raise CheckFailed(f"{model} loaded but not ready")
                x = inputs_for(definition(model, ctx.encoder_size), 8, 0)
                first_s, later_s = _infer_times(client, model, x, repeats=20)
                models[model] = {"load_s": load_s, "first_infer_ms": first_s * 1e3,
                                 "median_infer_ms": float(np.median(later_s)) * 1e3}
    logged = _logged_warmups_s((ctx.out / "warmup.log").read_text(errors="replace"))
    for model, figures in models.items():
        figures["server_warmup_s"] = logged.get(model, "not logged")
    return {"device": ctx.device, "dtype": ctx.dtypes[-1], "encoder_size": ctx.encoder_size,
            "server_listening_after_start_s": listening_s, "models": models}


_WARMED_UP = re.compile(r"model (\S+): warmed up \d+ replica\(s\) .* in ([\d.]+) s")


def _logged_warmups_s(log: str) -> dict[str, float | str]:
    """The warm-up time the server logs per model (its warm-up batches, part of the load)."""
    return {m.group(1): float(m.group(2)) for m in _WARMED_UP.finditer(log)}


def _models_args(ctx: StepContext) -> list[str]:
    return [*(arg for m in MODELS for arg in ("--model", m)), "--encoder-size", ctx.encoder_size]


def _require_bit_exact(runs: list[dict[str, Any]]) -> None:
    wrong = [{k: v for k, v in run.items() if k != "requests"} for run in runs
             if not run["bit_exact"]]
    if wrong:
        raise CheckFailed(f"answers differ from the direct call: {wrong}")


def _staged_outputs(model_definition: Any, x: np.ndarray, stages: list[dict[str, Any]]
                    ) -> np.ndarray:
    """The layers of each stage run directly on that stage's device, in float32 (a pipeline
    that starts on a CPU computes in float32; only float32 is served here)."""
    torch.set_num_threads(CPU_THREADS)
    layers = split_into_layers(model_definition.module)
    with torch.inference_mode():
        activation: torch.Tensor | None = None
        for stage in stages:
            device = _torch_device(stage["device"])
            chain = [copied_to(layer, device, torch.float32)
                     for layer in layers[stage["first_layer"]:stage["last_layer"] + 1]]
            activation = to_device(x, "FP32", device, torch.float32) if activation is None \
                else activation.to(device)
            for layer in chain:
                activation = layer(activation)
        assert activation is not None
        return to_host(activation, "FP32")


def _torch_device(name: str) -> torch.device:
    """A device as the server names it (``cuda0``, ``cpu1``) as torch's."""
    if name.startswith("cuda"):
        return torch.device("cuda", int(name[4:]))
    return torch.device("cpu")


def _timed_load(url: str, model: str) -> float:
    import grpc

    with grpc.insecure_channel(url) as channel:
        start_s = time.monotonic()
        pb_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
            pb.RepositoryModelLoadRequest(model_name=model), timeout=300)
        return _seconds_since(start_s)


def _infer_times(client: Client, model: str, x: np.ndarray,
                 repeats: int) -> tuple[float, list[float]]:
    times_s = []
    for _ in range(repeats + 1):
        start_s = time.monotonic()
        client.infer(model, {"x": x}, timeout_s=120.0)
        times_s.append(_seconds_since(start_s))
    return times_s[0], times_s[1:]


def _seconds_since(start_s: float) -> float:
    return time.monotonic() - start_s
