"""What one replica's worker is built from, wherever it runs (a thread of this process, a worker
process, a Ray actor); plain data, so that it travels msgpack-encoded to the worker's process.

A replica is one device, or with ``pipeline.stages`` S > 1 a pipeline over S devices."""

from __future__ import annotations

from dataclasses import dataclass

from evenflow.server.config.server_config import PipelineConfig
from evenflow.server.models.repository import BuiltinOptions
from evenflow.server.models.spec import TensorSpec
from evenflow.server.workers.devices import DeviceSpec


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything needed to build one replica's worker, in this process or another (it travels
    to a worker process msgpack-encoded)."""

    model_name: str
    source: str
    devices: tuple[DeviceSpec, ...]
    builtins: BuiltinOptions
    pipeline: PipelineConfig
    dtype: str = "float32"
    cpu_threads: int = 1
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    log_level: str = "INFO"
    log_format: str = "text"

    @property
    def name(self) -> str:
        return f"{self.model_name}@{'+'.join(d.name for d in self.devices)}"


def device_groups(devices: list[DeviceSpec], stages: int) -> list[tuple[DeviceSpec, ...]]:
    """One group per replica: each device alone, or consecutive runs of ``stages`` devices."""
    if stages > 1 and len(devices) % stages:
        raise ValueError(f"{len(devices)} devices cannot form pipelines of {stages} stages")
    size = max(1, stages)
    return [tuple(devices[i:i + size]) for i in range(0, len(devices), size)]
