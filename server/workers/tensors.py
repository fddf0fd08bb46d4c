"""Moving a batch between numpy (the wire side) and torch (the device side)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from evenflow.balancer.errors import BatchFailed
from evenflow.balancer.job import Job
from evenflow.server.models.spec import TensorSpec

_FLOAT_WIRE = {"FP32": torch.float32, "FP16": torch.float16, "FP64": torch.float64}


def batch_inputs(jobs: Sequence[Job], specs: Sequence[TensorSpec], device: torch.device,
                 float_dtype: torch.dtype) -> list[torch.Tensor]:
    """The jobs' inputs concatenated along the batch dimension, on ``device``."""
    return [to_device(_concat([job.payload[i] for job in jobs]), spec.datatype, device,
                      float_dtype) for i, spec in enumerate(specs)]


def to_device(array: np.ndarray, datatype: str, device: torch.device,
              float_dtype: torch.dtype) -> torch.Tensor:
    if datatype == "BF16":
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array)
    tensor = tensor.to(device, non_blocking=True)
    if tensor.is_floating_point() and tensor.dtype != float_dtype:
        tensor = tensor.to(float_dtype)
    return tensor


def to_host(tensor: torch.Tensor, datatype: str) -> np.ndarray:
    """A device tensor as the numpy array its wire datatype needs (BF16 as uint16 bits)."""
    if datatype == "BF16":
        return tensor.to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16)
    wire_dtype = _FLOAT_WIRE.get(datatype)
    if wire_dtype is not None and tensor.dtype != wire_dtype:
        tensor = tensor.to(wire_dtype)
    return tensor.cpu().numpy()


def order_outputs(raw: Any, specs: Sequence[TensorSpec]) -> list[torch.Tensor]:
    """A module's return value (tensor, tuple/list, or dict by name) in ``specs`` order."""
    if isinstance(raw, torch.Tensor):
        raw = (raw,)
    elif isinstance(raw, dict):
        missing = [s.name for s in specs if s.name not in raw]
        if missing:
            raise BatchFailed(f"model output dict lacks {missing}")
        raw = [raw[s.name] for s in specs]
    if len(raw) != len(specs):
        raise BatchFailed(f"model returned {len(raw)} outputs; spec lists {len(specs)}")
    return list(raw)


def outputs_per_job(raw: Any, specs: Sequence[TensorSpec],
                    jobs: Sequence[Job]) -> list[list[np.ndarray]]:
    outputs = [to_host(t, spec.datatype)
               for t, spec in zip(order_outputs(raw, specs), specs, strict=True)]
    return _split(outputs, [job.num_samples for job in jobs])


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    # Always a fresh, writable array: decoded inputs are read-only views of the request bytes.
    return np.concatenate(arrays) if len(arrays) > 1 else arrays[0].copy()


def _split(outputs: list[np.ndarray], sizes: list[int]) -> list[list[np.ndarray]]:
    """Each job's rows of each output, as views (slicing: np.split costs several times more)."""
    if len(sizes) == 1:
        return [outputs]
    per_job = []
    start = 0
    for size in sizes:
        end = start + size
        per_job.append([array[start:end] for array in outputs])
        start = end
    return per_job
