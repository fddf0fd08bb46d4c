"""evenflow's Python client SDK for KServe v2 servers, over gRPC (the default) or HTTP/REST
(Triton's binary tensor data extension): ``Client`` (blocking) and ``AsyncClient`` (asyncio),
numpy arrays or torch tensors in, numpy arrays out."""

from evenflow.client._aio import AsyncClient
from evenflow.client._sync import Client
from evenflow.client._tensors import numpy_dtype
from evenflow.client._types import ChannelOptions, ModelMetadata, StreamResult, TensorInfo
from evenflow.client.credentials import Credentials
from evenflow.client.errors import (
    AuthenticationError,
    DeadlineExceededError,
    InferenceServerError,
    InvalidInputError,
    ModelNotFoundError,
    ServerInternalError,
    ServerOverloadedError,
    ServerUnavailableError,
)

__all__ = [
    "AsyncClient", "AuthenticationError", "ChannelOptions", "Client", "Credentials",
    "DeadlineExceededError", "InferenceServerError", "InvalidInputError", "ModelMetadata",
    "ModelNotFoundError", "ServerInternalError", "ServerOverloadedError",
    "ServerUnavailableError", "StreamResult", "TensorInfo", "numpy_dtype",
]
