"""How a request names a model: a name and a version, looked up the same way in the engine's
model table and in a front-end's copy of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from evenflow.balancer import ModelNotFound

MODEL_VERSION = "1"  # every model has one version; an empty version in a request means it
T = TypeVar("T")


def find_model(models: Mapping[str, T], name: str, version: str) -> T:
    """``models[name]``, or ModelNotFound naming what is served (every model has one
    version, "1"; an empty version means it)."""
    model = models.get(name)
    if model is None:
        raise ModelNotFound(f"unknown model {name[:64]!r}; serving {sorted(models)}")
    if version and version != MODEL_VERSION:
        raise ModelNotFound(f"model {name!r} has no version {version[:16]!r}; "
                            f"versions: [{MODEL_VERSION!r}]")
    return model
