"""The server's live models: each name with its definition and its balancer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from evenflow.balancer import ModelBalancer, ModelNotFound
from evenflow.server.models.spec import ModelDefinition

MODEL_VERSION = "1"


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    definition: ModelDefinition
    balancer: ModelBalancer


class ModelTable:
    """Name -> served model, looked up once per request."""

    def __init__(self, models: list[ServedModel]) -> None:
        self._models = {m.name: m for m in models}

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models.values())

    def get(self, name: str, version: str = "") -> ServedModel:
        model = self._models.get(name)
        if model is None:
            raise ModelNotFound(f"unknown model {name!r}; serving {sorted(self._models)}")
        if version and version != MODEL_VERSION:
            raise ModelNotFound(f"model {name!r} has no version {version!r}; "
                                f"versions: [{MODEL_VERSION!r}]")
        return model
