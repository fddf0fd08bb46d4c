"""A model as a chain of layers, and what each layer costs (time and memory)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from evenflow.server.models.spec import ModelDefinition, SimProfile
from evenflow.server.workers.tracing import example_inputs


def split_into_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The module's chain of layers: a ``Sequential``'s children, a ``TransformerEncoder``'s
    layers (then its norm), or a module's own ``evenflow_layers()``."""
    custom = getattr(module, "evenflow_layers", None)
    if callable(custom):
        return list(custom())
    if isinstance(module, torch.nn.Sequential):
        return list(module.children())
    if isinstance(module, torch.nn.TransformerEncoder):
        layers: list[torch.nn.Module] = list(module.layers)
        if module.norm is not None:
            layers.append(module.norm)
        return layers
    raise ValueError(f"{type(module).__name__} is not a chain of layers: give a Sequential, a "
                     "TransformerEncoder, or a module with evenflow_layers()")


def layer_memory_bytes(layer: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size()
               for t in (*layer.parameters(), *layer.buffers()))


def layer_costs_s(definition: ModelDefinition, layers: Sequence[torch.nn.Module],
                  device: torch.device, float_dtype: torch.dtype, batch: int,
                  repeats: int = 3) -> list[float]:
    """Seconds per layer at ``batch``: from a layer's ``sim_profile`` when it has one, else
    measured on ``device`` (best of ``repeats`` after one warm-up run)."""
    profiles = [getattr(layer, "sim_profile", None) for layer in layers]
    if all(isinstance(p, SimProfile) for p in profiles):
        return [p.cost_s(batch) for p in profiles]  # type: ignore[union-attr]
    example = example_inputs(definition.inputs, batch, device, float_dtype)
    if example is None:
        raise ValueError("cannot profile layers: inputs have variable non-batch dimensions")
    costs = []
    with torch.inference_mode():
        activations: tuple[torch.Tensor, ...] = tuple(example)
        for layer in layers:
            best = float("inf")
            for _ in range(repeats + 1):
                start = time.perf_counter()
                out = layer(*activations)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                best = min(best, time.perf_counter() - start)
            costs.append(best)
            activations = out if isinstance(out, tuple) else (out,)
    return costs
