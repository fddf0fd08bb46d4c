"""Request inputs: generated from the model's metadata (seeded), or read from a ``.npz`` file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evenflow.client import Client, ModelMetadata, numpy_dtype
from evenflow.client._endpoint import Protocol
from evenflow.client.credentials import Credentials
from evenflow.proto import grpc_service_pb2 as pb


def fetch_metadata(url: str, model: str, timeout_s: float = 10.0,
                   credentials: Credentials | None = None,
                   protocol: Protocol | None = None) -> ModelMetadata:
    with Client(url, protocol=protocol, credentials=credentials, retries=0) as client:
        return client.model_metadata(model, timeout_s=timeout_s)


def generated_arrays(metadata: ModelMetadata, batch: int, seed: int,
                     variable_dim: int = 1) -> dict[str, tuple[np.ndarray, str]]:
    """Random inputs of the model's datatypes; the batch dim (first -1) set to ``batch`` and any
    other -1 to ``variable_dim``."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for tensor in metadata.inputs:
        shape = [batch if i == 0 and d == -1 else (variable_dim if d == -1 else d)
                 for i, d in enumerate(tensor.shape)]
        try:
            dtype = numpy_dtype(tensor.datatype)
        except TypeError:
            raise ValueError(f"input {tensor.name}: cannot generate {tensor.datatype}; "
                             "use --inputs FILE.npz") from None
        array: np.ndarray
        if np.issubdtype(dtype, np.floating) and tensor.datatype != "BF16":
            array = rng.standard_normal(shape).astype(dtype)
        else:
            array = rng.integers(0, 2, size=shape).astype(dtype)
        arrays[tensor.name] = (array, tensor.datatype)
    return arrays


def npz_arrays(path: Path, metadata: ModelMetadata) -> dict[str, tuple[np.ndarray, str]]:
    data = np.load(path)
    arrays = {}
    for tensor in metadata.inputs:
        if tensor.name not in data:
            raise ValueError(f"{path} has no array named {tensor.name!r}")
        arrays[tensor.name] = (np.ascontiguousarray(data[tensor.name]), tensor.datatype)
    return arrays


def build_request(model: str, arrays: dict[str, tuple[np.ndarray, str]]) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype,
                                                      shape=array.shape)
                for name, (array, datatype) in arrays.items()],
        raw_input_contents=[array.tobytes() for array, _ in arrays.values()])
