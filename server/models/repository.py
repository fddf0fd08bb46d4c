"""Model sources from ``--model``: built-in names, ``package.module:factory``, TorchScript and
``torch.export`` programs."""

from __future__ import annotations

import importlib
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from evenflow.server.models.builtin import (
    DEFAULT_SIM_LAYER_MS,
    ENCODER_SIZES,
    build_encoder,
    build_mlp,
    build_sim,
    build_sim_layers,
)
from evenflow.server.models.exported import EXPORTED_SUFFIX, load_exported
from evenflow.server.models.spec import ModelDefinition, SimProfile, TensorSpec

BUILTIN_MODELS = ("mlp", "encoder", "sim", "simlayers")
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts")


@dataclass(frozen=True, slots=True)
class BuiltinOptions:
    encoder_size: str = "small"
    sim_profile: SimProfile = field(default_factory=SimProfile)
    sim_layer_ms: tuple[float, ...] = DEFAULT_SIM_LAYER_MS


def parse_model_arg(arg: str) -> tuple[str, str]:
    """``NAME=SOURCE`` or a bare built-in ``NAME``; returns (name, source)."""
    name, sep, source = arg.partition("=")
    name = name.strip()
    if not name:
        raise ValueError(f"bad --model {arg!r}: expected NAME=SOURCE or a built-in name")
    if not sep:
        if name not in BUILTIN_MODELS:
            raise ValueError(f"unknown built-in model {name!r}; built-ins: {BUILTIN_MODELS}")
        return name, name
    return name, source.strip()


def load_definition(source: str, options: BuiltinOptions) -> ModelDefinition:
    """Build the model a ``--model`` source names."""
    if source in BUILTIN_MODELS:
        builders: dict[str, Callable[[], ModelDefinition]] = {
            "mlp": build_mlp,
            "encoder": lambda: build_encoder(ENCODER_SIZES[options.encoder_size]),
            "sim": lambda: build_sim(options.sim_profile),
            "simlayers": lambda: build_sim_layers(options.sim_layer_ms),
        }
        return builders[source]()
    if source.endswith(EXPORTED_SUFFIX):
        return load_exported(Path(source))
    if source.endswith(TORCHSCRIPT_SUFFIXES):
        return load_torchscript(Path(source))
    if ":" in source:
        return _load_factory(source)
    raise ValueError(f"model source {source!r} is neither a built-in {BUILTIN_MODELS}, "
                     "a package.module:factory, a TorchScript .pt file nor a torch.export "
                     ".pt2 program")


def _load_factory(source: str) -> ModelDefinition:
    module_name, _, attr = source.partition(":")
    factory = getattr(importlib.import_module(module_name), attr, None)
    if factory is None or not callable(factory):
        raise ValueError(f"{source!r}: {module_name} has no callable {attr!r}")
    definition = factory()
    if not isinstance(definition, ModelDefinition):
        raise TypeError(f"{source!r} returned {type(definition).__name__}; expected "
                        "evenflow.server.models.spec.ModelDefinition")
    return definition


def load_torchscript(path: Path) -> ModelDefinition:
    """A TorchScript file plus its tensor spec in ``<file>.json`` beside it::

        {"inputs":  [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}],
         "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}
    """
    spec_path = path.with_name(path.name + ".json")
    if not spec_path.exists():
        raise ValueError(f"{path}: TorchScript needs its tensor spec in {spec_path}")
    spec = json.loads(spec_path.read_text())

    def tensors(key: str) -> list[TensorSpec]:
        return [TensorSpec(t["name"], t["datatype"], tuple(t["shape"])) for t in spec[key]]

    return ModelDefinition(module=load_torchscript_module(path, torch.device("cpu")),
                           inputs=tensors("inputs"), outputs=tensors("outputs"),
                           platform="pytorch_torchscript",
                           place=lambda device: load_torchscript_module(path, device))


def load_torchscript_module(path: Path, device: torch.device) -> torch.nn.Module:
    """The TorchScript module in ``path`` with its tensors loaded straight onto ``device``
    (``map_location``: also the tensors its code holds, which moving parameters misses)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\..*deprecated")
        module: torch.nn.Module = torch.jit.load(str(path), map_location=device).eval()
    return module
