"""The engine's side of ``--placement auto``: what the placer needs to know of each device and
model (speed, a replica's footprint, the batch cost before any is measured), and the placer
itself. How much memory each device offers is ``engine.device_memory``'s."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

import torch

from evenflow.balancer import EvenflowError, WorkerStatus
from evenflow.balancer.capacity import DeviceCost, rate_within_per_s
from evenflow.balancer.errors import ErrorCode
from evenflow.balancer.estimator import floored_prior
from evenflow.balancer.placement.auto import AutoStrategy
from evenflow.balancer.placement.inventory import ModelProfile
from evenflow.balancer.placement.placer import Placer, ReplicaLoader
from evenflow.balancer.timebase import LoopTime
from evenflow.server.config.server_config import ModelConfig, ServerConfig
from evenflow.server.engine.device_memory import CudaMemoryQuery, device_infos
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.workers.devices import DeviceSpec
from evenflow.server.workers.thread_host import TORCH_DTYPES

logger = logging.getLogger(__name__)

# Where a replica measures its activation peak (``workers.activation_peak``: CUDA's allocator
# statistics); elsewhere its footprint is its parameters and buffers unless declared.
MEASURED_KINDS = frozenset({"cuda"})


class PlacementRefused(EvenflowError):
    """A model's first replicas cannot be placed as configured (a pin to a device the server
    does not have, or one without room for a replica)."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code


def prior_cost(model: ModelConfig, definition: ModelDefinition) -> DeviceCost:
    """The batch cost at speed 1 before the model has run anywhere: a sim model's declared
    one, else the balancer's prior (floored, as the latency model floors it: the capacity
    arithmetic divides by it)."""
    profile = model.sim_profile or (definition.sim_profile if model.source == "sim" else None)
    if profile is not None:
        return DeviceCost(*floored_prior(profile.base_ms / 1000.0,
                                         profile.per_sample_ms / 1000.0))
    assert model.balancer is not None  # resolved
    return DeviceCost(*floored_prior(model.balancer.prior_base_s,
                                     model.balancer.prior_per_sample_s))


def served_dtype(device: DeviceSpec, dtype: str) -> torch.dtype:
    """The dtype a replica on ``device`` holds its floating parameters in: ``--dtype`` on a
    GPU, float32 elsewhere (as ``workers.thread_host`` builds them)."""
    return TORCH_DTYPES[dtype] if device.kind == "cuda" else torch.float32


def parameter_bytes(definition: ModelDefinition, dtype: torch.dtype) -> int:
    """Parameters and buffers as a replica holds them: floating ones in the served ``dtype``
    (``replica_module.module_for`` casts each replica to it, whatever the checkpoint's), the
    others (integer, bool) as they are; a tensor registered twice counts once."""
    module = definition.module
    unique = {id(t): t for t in [*module.parameters(), *module.buffers()]}.values()
    served_size = torch.empty((), dtype=dtype).element_size()
    return sum(t.numel() * (served_size if t.is_floating_point() else t.element_size())
               for t in unique)


def replica_parameter_bytes(definition: ModelDefinition, devices: Iterable[DeviceSpec],
                            dtype: str) -> int:
    """A replica's footprint where none is declared or measured: its parameters and buffers
    in the dtype it is served in on ``devices``, the largest where that differs (a CPU serves
    float32 beside GPUs in ``--dtype``): the footprint is one figure on every device."""
    dtypes = {served_dtype(device, dtype) for device in devices} or {TORCH_DTYPES[dtype]}
    return max(parameter_bytes(definition, each) for each in dtypes)


def peak_measured(statuses: Iterable[WorkerStatus]) -> bool:
    return any(status.activation_peak_bytes is not None for status in statuses)


def replica_memory_bytes(declared_bytes: int | None, parameters_bytes: int,
                         statuses: Iterable[WorkerStatus]) -> int:
    """What one replica needs: the declared figure, else its parameters and buffers plus the
    largest activation peak its warmed-up workers measured (CUDA; none elsewhere, nor where no
    warm-up batch ran: then the parameters alone, see ``UnmeasuredFootprints``)."""
    if declared_bytes:
        return declared_bytes
    peaks = [p for status in statuses if (p := status.activation_peak_bytes) is not None]
    return parameters_bytes + max(peaks, default=0)


class UnmeasuredFootprints:
    """Warns, once per model, that a model on a GPU is placed by its parameters and buffers
    alone: none of its replicas measured an activation peak, because no warm-up batch ran
    (``--no-warmup``, or inputs that cannot be sampled), so the placer may put more on the GPU
    than its batches will fit beside."""

    def __init__(self) -> None:
        self._warned: set[str] = set()

    def note(self, model: ModelConfig, parameters_bytes: int,
             replicas: Iterable[tuple[DeviceSpec, WorkerStatus]]) -> None:
        """``replicas``: the model's warmed-up replicas' devices and statuses."""
        seen = list(replicas)
        if model.memory_bytes or model.name in self._warned \
                or peak_measured(status for _, status in seen) \
                or not any(device.kind in MEASURED_KINDS for device, _ in seen):
            return
        self._warned.add(model.name)
        logger.warning(
            "model %s: its replicas are placed by their parameters and buffers alone "
            "(%.2f GiB): no warm-up batch ran (--no-warmup, BYTES inputs, or variable dimensions "
            "without padding buckets), so their activation peak is unknown; memory_gib in its "
            "[models.%s] section sets the footprint", model.name, parameters_bytes / 2**30,
            model.name)


def profile(model: ModelConfig, memory_bytes: int, devices: Sequence[DeviceSpec],
            prior: DeviceCost, load_s: float) -> ModelProfile:
    assert model.balancer is not None  # resolved
    balancer = model.balancer
    return ModelProfile(
        name=model.name, memory_bytes=memory_bytes,
        costs={d.name: DeviceCost(prior.base_s, prior.per_sample_s, d.speed) for d in devices},
        max_batch=balancer.max_batch, slo_s=balancer.slo_s or balancer.latency_target_s,
        load_s=load_s, min_replicas=model.min_replicas, max_replicas=model.max_replicas,
        pinned=frozenset(model.pinned))


def first_devices(template: ModelProfile, free_bytes: Mapping[str, int]) -> list[str]:
    """Where a model's first replicas go: its pinned devices, then the devices it serves
    fastest on among those with room, up to its floor and at least one (a model loaded is
    ready to serve; one with ``min_replicas = 0`` may still start with none when memory is
    full). The planner moves them from there. Raises ``PlacementRefused`` for a pin to a
    device not in ``free_bytes`` or without room for a replica: a pinned replica is never
    given up, so one that does not fit would overcommit the device for good."""
    chosen = sorted(template.pinned)
    need = template.memory_bytes
    for device in chosen:
        if device not in free_bytes:
            raise PlacementRefused(
                f"model {template.name!r} is pinned to {device!r}, which is not one of the "
                f"server's devices ({', '.join(sorted(free_bytes))})", ErrorCode.INVALID_ARGUMENT)
        if free_bytes[device] < need:
            raise PlacementRefused(
                f"model {template.name!r} is pinned to {device}, which has {free_bytes[device]} "
                f"bytes ({free_bytes[device] / 2**30:.2f} GiB) free; a replica needs {need} bytes "
                f"({need / 2**30:.2f} GiB)", ErrorCode.RESOURCE_EXHAUSTED)
    wanted = max(template.min_replicas, len(chosen), 1)
    ranked = sorted((d for d in free_bytes if d not in chosen and free_bytes[d] >= need),
                    key=lambda d: -rate_within_per_s(template.costs[d], template.slo_s,
                                                     template.max_batch))
    return chosen + ranked[:max(0, wanted - len(chosen))]


def make_placer(devices: Sequence[DeviceSpec], config: ServerConfig, loader: ReplicaLoader,
                cuda_memory: CudaMemoryQuery | None = None) -> Placer:
    return Placer(devices=device_infos(devices, config, cuda_memory),
                  speeds={d.name: d.speed for d in devices}, loader=loader,
                  strategy=AutoStrategy(), time_source=LoopTime(), mode="auto")
