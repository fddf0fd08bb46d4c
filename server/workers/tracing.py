"""Trace a model into TorchScript so a batch runs without taking the GIL between layers.

An eager forward returns to Python after every layer and must win the GIL back each time; on a
busy server the event loop holds it, so each layer waits (measured: a 1.5 ms ``mlp`` batch took
6 ms under load). A traced module runs the whole graph in C++ with the GIL released. Tracing is
checked, not trusted: the traced module must give bit-identical outputs to the eager one on a
batch size other than the one traced, without tracer warnings; otherwise the eager module is used.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

import torch

from evenflow.server.models.spec import TensorSpec

logger = logging.getLogger(__name__)

_EXAMPLE_DTYPES = {"FP32": torch.float32, "FP16": torch.float16, "FP64": torch.float64,
                   "BF16": torch.bfloat16, "INT8": torch.int8, "INT16": torch.int16,
                   "INT32": torch.int32, "INT64": torch.int64, "UINT8": torch.uint8,
                   "BOOL": torch.bool}


def example_inputs(specs: Sequence[TensorSpec], batch: int, device: torch.device,
             float_dtype: torch.dtype) -> list[torch.Tensor] | None:
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for spec in specs:
        dtype = _EXAMPLE_DTYPES.get(spec.datatype)
        if dtype is None or any(d == -1 for d in spec.shape[1:]):
            return None  # variable non-batch dims or BYTES: no single example shape
        shape = (batch, *spec.shape[1:])
        if dtype.is_floating_point:
            tensor = torch.randn(shape, generator=generator).to(float_dtype)
        else:
            tensor = torch.randint(0, 2, shape, generator=generator).to(dtype)
        tensors.append(tensor.to(device))
    return tensors


def _as_tuple(output: object) -> tuple[torch.Tensor, ...]:
    if isinstance(output, torch.Tensor):
        return (output,)
    if isinstance(output, dict):
        return tuple(output[k] for k in sorted(output))
    return tuple(output)  # type: ignore[arg-type]


def trace_or_keep(module: torch.nn.Module, inputs: Sequence[TensorSpec], *, name: str,
                  device: torch.device, float_dtype: torch.dtype) -> torch.nn.Module:
    """The traced module when it is exactly equivalent, else ``module`` unchanged."""
    if isinstance(module, torch.jit.ScriptModule):
        return module
    traced_example = example_inputs(inputs, 2, device, float_dtype)
    check_example = example_inputs(inputs, 3, device, float_dtype)
    if traced_example is None or check_example is None:
        return module
    return trace_checked(module, traced_example, check_example, name=name)


def trace_checked(module: torch.nn.Module, traced_example: Sequence[torch.Tensor],
                  check_example: Sequence[torch.Tensor], *, name: str) -> torch.nn.Module:
    """Trace on one example; keep the trace only if it equals eager, bit for bit, on another."""
    try:
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            # A tracer warning means the trace may be wrong. torch.jit is deprecated in favour of
            # torch.compile / torch.export, but neither runs a graph without holding the GIL
            # (export) or without a long compile (compile); TorchScript still does.
            warnings.simplefilter("error", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message=r".*torch\.jit\..*deprecated")
            traced = torch.jit.trace(module, tuple(traced_example), check_trace=False,
                                     strict=False)
            expected = _as_tuple(module(*check_example))
            got = _as_tuple(traced(*check_example))
            got_again = _as_tuple(traced(*check_example))  # after the profiling run, too
    except Exception as exc:
        logger.info("%s: running eagerly (tracing failed: %s)", name, exc)
        return module
    same = all(torch.equal(e, g) and torch.equal(e, g2)
               for e, g, g2 in zip(expected, got, got_again, strict=True))
    if not same:
        logger.info("%s: running eagerly (traced outputs differ from eager)", name)
        return module
    logger.info("%s: running a traced graph", name)
    return traced
