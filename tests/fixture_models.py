"""User-factory models for tests: ``--model NAME=tests.fixture_models:FACTORY``."""

from __future__ import annotations

import threading
from typing import Any

import torch

from evenflow.server.models.spec import ModelDefinition, TensorSpec


class RaisesOnMarker(torch.nn.Module):
    """Doubles its input, but raises when any row starts with 13.0 (a poisoned request)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x[:, 0] == 13.0).any()):
            raise ValueError("poisoned input: first feature is 13")
        return x * 2


def failing() -> ModelDefinition:
    return ModelDefinition(module=RaisesOnMarker(),
                           inputs=[TensorSpec("x", "FP32", (-1, 4))],
                           outputs=[TensorSpec("y", "FP32", (-1, 4))])


class AddAndCast(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sum": a.to(torch.int64) + b, "flag": (b > 0)}


def two_inputs() -> ModelDefinition:
    """Two inputs of different datatypes, two outputs returned as a dict."""
    return ModelDefinition(module=AddAndCast(),
                           inputs=[TensorSpec("a", "INT32", (-1, 3)),
                                   TensorSpec("b", "INT64", (-1, 3))],
                           outputs=[TensorSpec("sum", "INT64", (-1, 3)),
                                    TensorSpec("flag", "BOOL", (-1, 3))])


class Gate(torch.nn.Module):
    """Identity that blocks its worker thread until ``release`` (tests use it to hold a batch
    in flight without sleeping)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.proceed = threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        if not self.proceed.wait(timeout=30):
            raise TimeoutError("gate never released")
        return x.clone()


GATE = Gate()


def gated() -> ModelDefinition:
    return ModelDefinition(module=GATE, inputs=[TensorSpec("x", "FP32", (-1, 4))],
                           outputs=[TensorSpec("y", "FP32", (-1, 4))], traceable=False)


def failing_chain() -> ModelDefinition:
    """Two layers, so it can be pipelined; the second raises on a poisoned row."""
    return ModelDefinition(module=torch.nn.Sequential(torch.nn.Identity(), RaisesOnMarker()),
                           inputs=[TensorSpec("x", "FP32", (-1, 4))],
                           outputs=[TensorSpec("y", "FP32", (-1, 4))], traceable=False)


class FirstInput(torch.nn.Module):
    def forward(self, x: torch.Tensor, ids: torch.Tensor, text: object) -> torch.Tensor:
        return x


def three_inputs() -> ModelDefinition:
    """FP32, a variable-length INT64 and a BYTES input: a wide surface for malformed requests
    (the tests that use it send only bad requests; BYTES never reaches torch)."""
    return ModelDefinition(module=FirstInput(),
                           inputs=[TensorSpec("x", "FP32", (-1, 4)),
                                   TensorSpec("ids", "INT64", (-1, -1)),
                                   TensorSpec("text", "BYTES", (-1, 2))],
                           outputs=[TensorSpec("y", "FP32", (-1, 4))], traceable=False)


class CumSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.cumsum(1)


def cumsum() -> ModelDefinition:
    """FP32 ``[-1, -1]`` -> its running sum along dim 1: requests of different lengths."""
    return ModelDefinition(module=CumSum(), inputs=[TensorSpec("x", "FP32", (-1, -1))],
                           outputs=[TensorSpec("y", "FP32", (-1, -1))], traceable=False)


def cumsum_padded() -> ModelDefinition:
    """``cumsum`` padded with zeros to lengths 4, 8, 16, 32 (zeros at the end leave each
    request's own prefix sums unchanged)."""
    from evenflow.server.models.spec import Padding

    return ModelDefinition(module=CumSum(), inputs=[TensorSpec("x", "FP32", (-1, -1))],
                           outputs=[TensorSpec("y", "FP32", (-1, -1))], traceable=False,
                           padding=Padding(0.0, (4, 8, 16, 32)))


EVERY_TYPE = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
              "FP16", "BF16", "FP32", "FP64", "BYTES")


class EchoEach(torch.nn.Module):
    """Each input back as the output of the same datatype (BYTES as the numpy array it came
    in as: torch has no string type)."""

    def forward(self, *inputs: Any) -> tuple[Any, ...]:
        return tuple(inputs)


def every_type() -> ModelDefinition:
    """An input and an output of every KServe datatype, ``in_<TYPE>`` -> ``out_<TYPE>``, [-1, 3]:
    what a protocol's codec must carry bit for bit."""
    return ModelDefinition(module=EchoEach(),
                           inputs=[TensorSpec(f"in_{t}", t, (-1, 3)) for t in EVERY_TYPE],
                           outputs=[TensorSpec(f"out_{t}", t, (-1, 3)) for t in EVERY_TYPE],
                           traceable=False)
