"""The server's live models: each name with its definition and its balancer."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from evenflow.balancer import ModelBalancer
from evenflow.balancer.stats import CpuParts
from evenflow.server.edge.model_names import find_model
from evenflow.server.models.spec import ModelDefinition


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    definition: ModelDefinition
    balancer: ModelBalancer

    @property
    def cpu_parts(self) -> CpuParts | None:
        return self.balancer.counters.cpu

    def submit(self, payload: Any, num_samples: int, deadline_s: float = math.inf,
               priority: int = 0, shape_key: Hashable = None) -> asyncio.Future[Any]:
        return self.balancer.submit(payload, num_samples, deadline_s, priority, shape_key)


class ModelTable:
    """Name -> served model, looked up once per request. Models come and go with model
    control; a request holds the ServedModel it looked up, so a swap never strands it."""

    def __init__(self, models: list[ServedModel] | None = None) -> None:
        self._models = {m.name: m for m in models or ()}
        self.on_change: Callable[[], None] | None = None  # after each put and pop

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(list(self._models.values()))

    def __contains__(self, name: str) -> bool:
        return name in self._models

    def get(self, name: str, version: str = "") -> ServedModel:
        return find_model(self._models, name, version)

    def put(self, model: ServedModel) -> ServedModel | None:
        """Serve ``model``; returns the one it replaces, if any."""
        previous = self._models.get(model.name)
        self._models[model.name] = model
        if self.on_change is not None:
            self.on_change()
        return previous

    def pop(self, name: str) -> ServedModel | None:
        model = self._models.pop(name, None)
        if model is not None and self.on_change is not None:
            self.on_change()
        return model
