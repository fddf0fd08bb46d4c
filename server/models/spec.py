"""What a served model is: a torch module plus the names, datatypes and shapes of its tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from evenflow.server.datatypes import WIRE_TYPES


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output. ``shape`` includes the batch dimension first, as -1."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.datatype not in WIRE_TYPES:
            raise ValueError(f"tensor {self.name!r}: unknown datatype {self.datatype!r}")
        if not self.shape or self.shape[0] != -1:
            raise ValueError(f"tensor {self.name!r}: shape must start with the batch dim -1")


@dataclass(frozen=True, slots=True)
class SimProfile:
    """Cost of a batch on a simulated device of speed 1: ``base_ms + per_sample_ms * batch``."""

    base_ms: float = 10.0
    per_sample_ms: float = 2.0

    def cost_s(self, batch_size: int) -> float:
        return (self.base_ms + self.per_sample_ms * batch_size) / 1000.0


@dataclass(frozen=True, slots=True)
class ModelDefinition:
    """A model as a user factory returns it.

    ``module(*inputs)`` takes one tensor per input in ``inputs`` order (batch first) and returns a
    tensor, a tuple/list in ``outputs`` order, or a dict keyed by output name.
    """

    module: torch.nn.Module
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    platform: str = "pytorch_libtorch"
    sim_profile: SimProfile = field(default_factory=SimProfile)
    traceable: bool = True  # False when forward has effects a trace would drop (sleeps, I/O)

    def __post_init__(self) -> None:
        for group in (self.inputs, self.outputs):
            names = [t.name for t in group]
            if len(set(names)) != len(names) or not names:
                raise ValueError(f"tensor names must be unique and non-empty: {names}")
