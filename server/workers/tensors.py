"""Moving a batch between numpy (the wire side) and torch (the device side); joining and
splitting its rows is ``batch_rows``'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from evenflow.balancer.errors import BatchFailed
from evenflow.balancer.job import Job
from evenflow.server.models.spec import TensorSpec
from evenflow.server.workers.batch_rows import join_rows, split_rows

_FLOAT_WIRE = {"FP32": torch.float32, "FP16": torch.float16, "FP64": torch.float64}


def batch_inputs(jobs: Sequence[Job], specs: Sequence[TensorSpec], device: torch.device,
                 float_dtype: torch.dtype) -> list[Any]:
    """The jobs' inputs concatenated along the batch dimension, on ``device`` (BYTES inputs,
    which torch has no type for, as numpy arrays of ``bytes``)."""
    joined = join_rows([job.payload for job in jobs], writable=True)
    return [to_device(array, spec.datatype, device, float_dtype)
            for array, spec in zip(joined, specs, strict=False)]


def to_device(array: np.ndarray, datatype: str, device: torch.device,
              float_dtype: torch.dtype) -> Any:
    if datatype == "BYTES":
        return array
    if datatype == "BF16":
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array)
    tensor = tensor.to(device, non_blocking=True)
    if tensor.is_floating_point() and tensor.dtype != float_dtype:
        tensor = tensor.to(float_dtype)
    return tensor


def to_host(tensor: Any, datatype: str) -> np.ndarray:
    """A device tensor as the numpy array its wire datatype needs (BF16 as uint16 bits; a
    BYTES output, which a module returns as a numpy array or nested list, of ``bytes``)."""
    if datatype == "BYTES":
        return np.asarray(tensor, dtype=object)
    if datatype == "BF16":
        return tensor.to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16)
    wire_dtype = _FLOAT_WIRE.get(datatype)
    if wire_dtype is not None and tensor.dtype != wire_dtype:
        tensor = tensor.to(wire_dtype)
    return tensor.cpu().numpy()


def order_outputs(raw: Any, specs: Sequence[TensorSpec]) -> list[Any]:
    """A module's return value (tensor, tuple/list, or dict by name) in ``specs`` order."""
    if isinstance(raw, torch.Tensor | np.ndarray):
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
    return split_rows(outputs, [job.num_samples for job in jobs])

