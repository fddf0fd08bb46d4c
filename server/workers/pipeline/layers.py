"""A model as a chain of layers, each stage's own copy of its layers, and what each layer costs
(time per device, memory)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from evenflow.server.models.spec import ModelDefinition, SimProfile
from evenflow.server.workers.cuda_sync import blocking_event, wait_for_stream
from evenflow.server.workers.replica_module import copied_to, runs_unchanged, settled
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


def placed(layer: torch.nn.Module, device: torch.device,
           float_dtype: torch.dtype) -> torch.nn.Module:
    """``layer`` as a stage on ``device`` computing floats in ``float_dtype`` runs it.

    ``Module.to`` moves and casts in place, so moving the definition's layers would move them
    under every other replica built from the same definition. The definition's own layer is
    shared only where that is provably safe: it already has that device and dtype (so nothing
    would change) and no part of it is in training mode (whose forward writes buffers, e.g.
    batch-norm statistics); otherwise the stage gets a copy of its own, made straight on the
    device.
    """
    if runs_unchanged(layer, device, float_dtype) and not any(m.training
                                                             for m in layer.modules()):
        return layer
    # Settled: the stage's own stream must not read the weights before the copy has landed.
    return settled(copied_to(layer, device, float_dtype), device)


def layer_memory_bytes(layer: torch.nn.Module, float_dtype: torch.dtype | None = None) -> int:
    """Bytes of the layer's parameters and buffers, with floating ones in ``float_dtype``."""
    float_size = None if float_dtype is None else torch.empty((), dtype=float_dtype).element_size()

    def size(t: torch.Tensor) -> int:
        floating = t.is_floating_point() or t.is_complex()
        element = float_size if float_size is not None and floating else t.element_size()
        return t.numel() * element

    return sum(size(t) for t in (*layer.parameters(), *layer.buffers()))


def layer_costs_s(definition: ModelDefinition, layers: Sequence[torch.nn.Module],
                  devices: Sequence[torch.device], float_dtypes: Sequence[torch.dtype],
                  batch: int, repeats: int = 3) -> list[list[float]]:
    """Seconds per layer at ``batch`` on each of ``devices``: ``[device][layer]``.

    From the layers' ``sim_profile`` when every layer has one (the same on every device), else
    measured: each layer runs placed on the device and dtype it would run on (``float_dtypes``:
    one per device; best of ``repeats`` after one warm-up run), fed
    the activations of the layers before it on that device. Each distinct device and dtype
    is measured once; ``layers`` themselves are never moved.
    """
    profiles = [getattr(layer, "sim_profile", None) for layer in layers]
    if all(isinstance(p, SimProfile) for p in profiles):
        costs = [p.cost_s(batch) for p in profiles]  # type: ignore[union-attr]
        return [list(costs) for _ in devices]
    measured: dict[tuple[torch.device, torch.dtype], list[float]] = {}
    for device, dtype in zip(devices, float_dtypes, strict=True):
        if (device, dtype) not in measured:
            measured[device, dtype] = _measure_on(definition, layers, device, dtype, batch,
                                                  repeats)
    return [list(measured[key]) for key in zip(devices, float_dtypes, strict=True)]


def _measure_on(definition: ModelDefinition, layers: Sequence[torch.nn.Module],
                device: torch.device, float_dtype: torch.dtype, batch: int,
                repeats: int) -> list[float]:
    example = example_inputs(definition.inputs, batch, device, float_dtype)
    if example is None:
        raise ValueError("cannot profile layers: inputs have variable non-batch dimensions")
    costs = []
    # Each run is waited for on this thread's stream alone: a device-wide synchronize would
    # also wait for other replicas' batches queued on the device (their streams are from
    # torch's pool, non-blocking, so this stream's kernels are not ordered after theirs).
    done = blocking_event() if device.type == "cuda" else None
    with torch.inference_mode():
        activations: tuple[torch.Tensor, ...] = tuple(example)
        for layer in layers:
            # One layer at a time: a model too big for the device still profiles on it.
            here = placed(layer, device, float_dtype)
            best = float("inf")
            for _ in range(repeats + 1):
                start = time.perf_counter()
                out = here(*activations)
                if done is not None:
                    wait_for_stream(torch.cuda.current_stream(device), done)
                best = min(best, time.perf_counter() - start)
            costs.append(best)
            activations = out if isinstance(out, tuple) else (out,)
            del here
    return costs
