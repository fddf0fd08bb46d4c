"""What a served model is: a torch module plus the names, datatypes and shapes of its tensors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from evenflow.server.edge.datatypes import WIRE_TYPES

if TYPE_CHECKING:  # front-end processes read tensor specs and never import torch
    import torch


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
class Padding:
    """A model's promise that its variable dimensions may be padded: every input's variable
    (-1) non-batch dimension is padded with ``value`` up to the smallest of ``buckets`` that
    fits, so requests of nearby lengths share a batch; each output's variable dimensions are
    then cut back, in order, to the request's sizes of the first input's variable dimensions
    (a sequence model: outputs as long as its input)."""

    value: float = 0.0
    buckets: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)

    def __post_init__(self) -> None:
        if not self.buckets or list(self.buckets) != sorted(set(self.buckets)) or \
                self.buckets[0] < 1:
            raise ValueError(f"padding buckets must be increasing positive sizes: {self.buckets}")

    def bucket(self, size: int) -> int | None:
        return next((b for b in self.buckets if b >= size), None)


@dataclass(frozen=True, slots=True)
class ModelDefinition:
    """A model as a user factory returns it.

    ``module(*inputs)`` takes one tensor per input in ``inputs`` order (batch first) and returns a
    tensor, a tuple/list in ``outputs`` order, or a dict keyed by output name.

    ``module`` is shared by every replica and never changed: a replica on another device or in
    another dtype runs a copy of its own (``evenflow.server.workers.replica_module``). Where
    moving parameters is not enough to run elsewhere (a ``torch.export`` graph records devices
    in its nodes; a TorchScript file decides at load where its tensors go), ``place(device)``
    builds a fresh module for ``device``, and ``module`` is then the one placed on the CPU.
    """

    module: torch.nn.Module
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    platform: str = "pytorch_libtorch"
    sim_profile: SimProfile = field(default_factory=SimProfile)
    traceable: bool = True  # False when forward has effects a trace would drop (sleeps, I/O)
    padding: Padding | None = None  # variable dims may be padded to buckets (see Padding)
    place: Callable[[torch.device], torch.nn.Module] | None = None  # see the class docstring
    # Whether requests can differ in non-batch shape (then they batch by shape); set from inputs.
    variable_shapes: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        for group in (self.inputs, self.outputs):
            names = [t.name for t in group]
            if len(set(names)) != len(names) or not names:
                raise ValueError(f"tensor names must be unique and non-empty: {names}")
        object.__setattr__(self, "variable_shapes",
                           any(-1 in t.shape[1:] for t in self.inputs))
