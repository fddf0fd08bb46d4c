"""Model lifecycle: build a model's workers and balancer, serve it, drain and close it.

The server starts with the models its configuration loads at start; Triton's model-control RPCs
(``RepositoryModelLoad`` / ``Unload``) load and unload the others while it serves. Only models
named in the configuration may be loaded, unless the server was started with
``allow_any_model_source`` (loading a source runs its code). One load or unload at a time.

Every replica built (at a load, or on a device that joins) is warmed up first
(``server.warmup``: ``warmup_batches`` batches through its worker, outside the balancer's fit and
statistics); a model is published READY only after its replicas are warm.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from evenflow.balancer import ModelBalancer, Worker
from evenflow.balancer.errors import ErrorCode, EvenflowError
from evenflow.balancer.ledger import DeviceLedger
from evenflow.balancer.placement.placer import Placer
from evenflow.balancer.placement.report import PlacementSnapshot
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.server.config.server_config import ModelConfig, ServerConfig
from evenflow.server.engine import placement
from evenflow.server.engine.device_memory import DeviceMemoryUnknown, kept_cuda_memory_query
from evenflow.server.engine.served import ModelTable, ServedModel
from evenflow.server.engine.warmup import warm_up
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.observability import cpu_accounting
from evenflow.server.workers.devices import DeviceSpec
from evenflow.server.workers.hosts import build_workers
from evenflow.server.workers.ray_resources import RayPlacement
from evenflow.server.workers.thread_host import load_spec_definition
from evenflow.server.workers.worker_spec import WorkerSpec, device_groups

logger = logging.getLogger(__name__)

# A warm-up batch may take this many times the watchdog of a replica's first batch: it is the
# batch that pays for lazy initialisation, which the warm-up exists to keep out of serving.
_WARMUP_WATCHDOGS = 10.0

class ModelState(enum.Enum):
    """Triton's RepositoryIndex states."""

    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"


@dataclass(slots=True)
class ModelEntry:
    config: ModelConfig
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    warmup_s: float | None = None  # how long its replicas' warm-up took (None: none ran)
    generation: int = 0  # loads begun: a replica's figures count only for its own model's


class ModelControlError(EvenflowError):
    """A load or unload that cannot be done; ``code`` says which gRPC status fits."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code


async def close_model(model: ServedModel, grace_s: float,
                      abort: asyncio.Event | None = None) -> None:
    """Let the model's admitted requests finish (up to ``grace_s``, or until ``abort`` is set),
    then stop its replicas and workers; whatever is still queued or running then fails with
    UNAVAILABLE, so every admitted request is answered."""
    drain = asyncio.ensure_future(model.balancer.drain())
    waits: set[asyncio.Future[Any]] = {drain}
    if abort is not None:
        waits.add(asyncio.ensure_future(abort.wait()))
    done, pending = await asyncio.wait(waits, timeout=grace_s,
                                       return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if drain not in done:
        left = model.balancer.admitted_requests
        logger.warning("model %s: %s; failing %d requests with UNAVAILABLE", model.name,
                       "shutdown forced" if abort is not None and abort.is_set()
                       else f"not drained within {grace_s:.1f} s", left)
    await model.balancer.close()  # closes its workers too


def _operation_ended(task: asyncio.Task[None]) -> None:
    """A load or unload ended: its error was its caller's to hear, and a caller that went away
    did not; retrieved here so that it is not reported again as never retrieved."""
    if not task.cancelled():
        task.exception()


class ModelManager:
    """Owns every served model: loads them into ``table`` and closes them."""

    def __init__(self, config: ServerConfig, table: ModelTable, devices: list[DeviceSpec],
                 on_health: Callable[[], None] | None = None) -> None:
        self._config = config
        self._on_health = on_health
        self._table = table
        self._devices = list(devices)
        self._entries = {m.name: ModelEntry(m) for m in config.model_configs()}
        self._lock = asyncio.Lock()
        # Loads and unloads run as the manager's own tasks (``_owned``), which ``close`` waits
        # for; the loads still building, which it abandons.
        self._closing = False
        self._operations: set[asyncio.Task[None]] = set()
        self._building: set[asyncio.Task[Any]] = set()
        self._ledger = DeviceLedger()  # models on the same device see each other's work
        self._definitions: dict[str, ModelDefinition] = {}
        # Under --placement auto, the memory a reloaded model's old replicas hold while they
        # drain, by model: (device, bytes) held in the placer until they close.
        self._draining: collections.defaultdict[str, list[tuple[str, int]]] = \
            collections.defaultdict(list)
        self._cuda_memory = kept_cuda_memory_query(config)  # at start and as GPUs join
        self._placer = placement.make_placer(self._devices, config, self, self._cuda_memory) \
            if config.placement == "auto" else None
        self._unmeasured = placement.UnmeasuredFootprints()

    def placement_snapshot(self) -> PlacementSnapshot | None:
        """Where every model's replicas are and what moved (None under ``--placement all``)."""
        return None if self._placer is None else self._placer.snapshot()

    def index(self) -> list[tuple[str, ModelEntry]]:
        return sorted(self._entries.items())

    async def start(self) -> None:
        if self._placer is not None:  # before any load: a bad pin fails the start whole
            for entry in self._entries.values():
                self._check_pins(entry.config)
        for name, entry in list(self._entries.items()):
            if entry.config.load_at_start:  # in the start's task: cancelling the start ends it
                await self._load(name, None)
        if self._placer is not None:
            self._placer.start()

    async def load(self, name: str, source: str | None = None) -> None:
        """Load ``name`` (again, if it serves: the new one takes over, then the old drains).
        ``source`` replaces the configured one only where any source is allowed."""
        await self._owned(self._load(name, source))

    async def unload(self, name: str) -> None:
        """Stop routing to ``name``, let its admitted requests finish, then close it."""
        await self._owned(self._unload(name))

    async def _owned(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a load or unload as the manager's own task. Its caller may be cancelled (a
        client gone, the gRPC server stopping) while it is halfway, between a model out of the
        table and its workers closed: the task goes on, and ``close`` waits for it."""
        if self._closing:
            work.close()
            raise ModelControlError("the server is shutting down", ErrorCode.UNAVAILABLE)
        task = asyncio.get_running_loop().create_task(work)
        self._operations.add(task)
        task.add_done_callback(_operation_ended)
        task.add_done_callback(self._operations.discard)
        caller = asyncio.current_task()
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and caller is not None and not caller.cancelling():
                # ``close`` abandoned the load; the caller itself was not cancelled.
                raise ModelControlError("the load was abandoned: the server is shutting down",
                                        ErrorCode.UNAVAILABLE) from None
            raise

    async def _load(self, name: str, source: str | None) -> None:
        async with self._lock:
            if self._closing:
                raise ModelControlError("the server is shutting down", ErrorCode.UNAVAILABLE)
            entry = self._entry_for_load(name, source)
            config = entry.config if source is None else dataclasses.replace(entry.config,
                                                                             source=source)
            serving = name in self._table
            entry.state, entry.reason = ModelState.LOADING, ""
            entry.generation += 1
            building = asyncio.current_task()
            assert building is not None
            self._building.add(building)
            try:
                model, warmup_s = await self._build(config)
            except BaseException as exc:
                # A reload that failed leaves the model that served serving, and says so.
                entry.state = ModelState.READY if serving else ModelState.UNAVAILABLE
                entry.reason = ("load abandoned: the server is shutting down"
                                if isinstance(exc, asyncio.CancelledError)
                                else f"load failed: {exc}")
                raise
            finally:
                self._building.discard(building)
            draining = self._draining.pop(name, [])  # this load's: loads take turns
            entry.config, entry.warmup_s = config, warmup_s
            entry.state = ModelState.READY
            previous = self._table.put(model)
            logger.info("model %s loaded from %s on %s", name, config.source,
                        ", ".join(r.name for r in model.balancer.snapshot().replicas)
                        or "no device yet (it loads on its first request)")
        if previous is not None:
            try:
                await close_model(previous, self._config.shutdown_grace_s)
            finally:
                if self._placer is not None:
                    for device, memory_bytes in draining:
                        self._placer.release(device, memory_bytes)

    async def _unload(self, name: str) -> None:
        async with self._lock:
            if self._closing:  # ``close`` closes every model in the table
                raise ModelControlError("the server is shutting down", ErrorCode.UNAVAILABLE)
            entry = self._entries.get(name)
            model = self._table.pop(name) if entry is not None else None
            if entry is None or model is None:
                raise ModelControlError(f"model {name!r} is not loaded",
                                        ErrorCode.INVALID_ARGUMENT)
            entry.state, entry.reason = ModelState.UNLOADING, ""
            if self._placer is None:
                await close_model(model, self._config.shutdown_grace_s)
            else:
                await self._close_placed(model, self._placer)
            entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"
            logger.info("model %s unloaded", name)

    async def _close_placed(self, model: ServedModel, placer: Placer) -> None:
        """Close an unloaded model under ``--placement auto``. The placer lets go of it first,
        so that none of its moves lands in a balancer that is closing (a replica that finishes
        loading meanwhile is closed, not added, and no new move starts); the memory its
        replicas hold stays reserved until they have drained and closed."""
        draining = placer.forget_model(model.name)
        for device, memory_bytes in draining:
            placer.hold(device, memory_bytes)
        try:
            await close_model(model, self._config.shutdown_grace_s)
        finally:
            for device, memory_bytes in draining:
                placer.release(device, memory_bytes)

    async def close(self, grace_s: float, abort: asyncio.Event | None = None) -> None:
        """Drain and close every model (server shutdown); see ``close_model``. The models stay
        in the table meanwhile, so a late request hears UNAVAILABLE, not NOT_FOUND. A load
        still building is abandoned (it closes what it built); loads and unloads past that
        finish their drains, beside the table's."""
        self._closing = True
        for task in self._building:
            task.cancel()
        if self._placer is not None:
            await self._placer.close()  # its moves in flight finish before the models close
        models = list(self._table)
        operations = set(self._operations)
        await asyncio.gather(*(close_model(m, grace_s, abort) for m in models),
                             *([asyncio.wait(operations)] if operations else []))
        for model in models:
            self._table.pop(model.name)

    def _entry_for_load(self, name: str, source: str | None) -> ModelEntry:
        entry = self._entries.get(name)
        allowed = self._config.allow_any_model_source
        if entry is None:
            if source is None or not allowed:
                raise ModelControlError(
                    f"model {name!r} is not in the configuration"
                    + ("; give its source in the load request's config"
                       if allowed else "; the server loads only configured models"),
                    ErrorCode.NOT_FOUND if not allowed else ErrorCode.INVALID_ARGUMENT)
            entry = self._entries[name] = ModelEntry(
                self._config.resolve(ModelConfig(name, source)))
        elif source is not None and source != entry.config.source and not allowed:
            raise ModelControlError(
                f"model {name!r}: loading source {source!r} instead of the configured "
                f"{entry.config.source!r} needs a server started with "
                "--allow-any-model-source", ErrorCode.INVALID_ARGUMENT)
        return entry

    @property
    def devices(self) -> list[DeviceSpec]:
        return list(self._devices)

    def _check_pins(self, model: ModelConfig) -> None:
        """Pins name devices as the server does (``cuda0``, ``sim1``); the file can check them
        only where it lists the devices."""
        names = {d.name for d in self._devices}
        unknown = [device for device in model.pinned if device not in names]
        if unknown:
            raise ModelControlError(
                f"model {model.name!r} is pinned to {', '.join(map(repr, unknown))}, which "
                f"{'is' if len(unknown) == 1 else 'are'} not among the server's devices "
                f"({', '.join(sorted(names))})", ErrorCode.INVALID_ARGUMENT)

    def _spec(self, model: ModelConfig, group: tuple[DeviceSpec, ...]) -> WorkerSpec:
        config = self._config
        assert model.pipeline is not None  # resolved
        builtins = config.builtins if model.sim_profile is None else \
            dataclasses.replace(config.builtins, sim_profile=model.sim_profile)
        return WorkerSpec(model_name=model.name, source=model.source, devices=group,
                          builtins=builtins, pipeline=model.pipeline,
                          dtype=config.dtype, cpu_threads=config.cpu_threads,
                          inputs=model.inputs, outputs=model.outputs,
                          log_level=config.log_level, log_format=config.log_format)

    def _placement(self) -> RayPlacement:
        return RayPlacement(self._config.ray_placement_timeout_s)

    async def _build_replica(self, config: ModelConfig, definition: ModelDefinition,
                             device: DeviceSpec) -> Worker:
        """One warmed-up single-device replica of ``config`` on ``device``, after the load
        time a sim model simulates."""
        if config.sim_load_s:
            await asyncio.sleep(config.sim_load_s)
        (worker,) = await build_workers([self._spec(config, (device,))], definition,
                                        self._config.workers, self._config.ray_address,
                                        self._placement())
        await self._warm_up(config, definition, [worker])
        return worker

    async def load_replica(self, model: str, device: str) -> Worker:
        """The placer's ``ReplicaLoader.load``: a replica of ``model`` on ``device``."""
        spec = next(d for d in self._devices if d.name == device)
        entry = self._entries[model]
        generation = entry.generation
        started_s = time.monotonic()
        definition = self._definitions[model]
        worker = await self._build_replica(entry.config, definition, spec)
        if self._placer is not None and entry.generation == generation:
            # (A replica of a model reloaded meanwhile is closed, unrouted: its figures would
            # be another model's.)
            self._placer.set_load_s(model, time.monotonic() - started_s)
            parameters = placement.replica_parameter_bytes(definition, [spec],
                                                           self._config.dtype)
            status = worker.status()
            measured = placement.replica_memory_bytes(entry.config.memory_bytes, parameters,
                                                      [status])
            self._placer.raise_memory_bytes(model, measured)
            self._unmeasured.note(entry.config, parameters, [(spec, status)])
        return worker

    async def add_device(self, device: DeviceSpec) -> None:
        """A device joined (a cluster node came up): every loaded model gets a replica on it
        (single-device replicas only; pipelines keep the devices they were cut for). Under
        ``--placement auto`` the placer may use it instead."""
        async with self._lock:
            # Listed even where the placer cannot take it: a follower counts what joined, and
            # asks again for nothing it already counts.
            self._devices.append(device)
            if self._placer is not None:
                try:
                    (info,) = placement.device_infos([device], self._config,
                                                     self._cuda_memory)
                except DeviceMemoryUnknown as exc:
                    logger.error("device %s joined, but no replica is placed on it: %s",
                                 device.name, exc)
                    return
                self._placer.add_device(info, device.speed)
                return
            for model in list(self._table):
                config = self._entries[model.name].config
                assert config.pipeline is not None
                if config.pipeline.stages > 1:
                    logger.warning("model %s: a pipeline gets no replica on joining device %s",
                                   model.name, device.name)
                    continue
                worker = await self._build_replica(config, model.definition, device)
                model.balancer.add_replica(worker)
                logger.info("model %s: replica on %s joined", model.name, device.name)

    async def remove_device(self, name: str) -> None:
        """A device left: its replicas leave routing, their queued work moves to the others,
        their running batches finish (or, if the device is gone, re-run elsewhere). The placer
        forgets the device first: a drain may take a while, and a load it finished there
        meanwhile would join routing on a device that is leaving."""
        async with self._lock:
            self._devices = [d for d in self._devices if d.name != name]
            if self._placer is not None:
                self._placer.remove_device(name)
            for model in list(self._table):
                if await model.balancer.remove_device(name):
                    logger.info("model %s: replica on %s left", model.name, name)

    def lost_devices(self) -> set[str]:
        """Devices whose replicas are out of routing (a lost worker that has not come back)."""
        return {device for model in self._table for replica in model.balancer.snapshot().replicas
                if not replica.healthy for device in replica.devices}

    async def _warm_up(self, model: ModelConfig, definition: ModelDefinition,
                       workers: list[Worker]) -> float | None:
        """Warm ``workers`` up (``server.warmup``); on failure they are closed again."""
        assert model.balancer is not None  # resolved
        try:
            return await warm_up(workers, definition, model_name=model.name,
                                 max_batch=model.balancer.max_batch,
                                 batches=self._config.warmup_batches,
                                 batch_timeout_s=_WARMUP_WATCHDOGS * model.balancer.watchdog_s)
        except BaseException:
            await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)
            raise

    async def _build(self, model: ModelConfig) -> tuple[ServedModel, float | None]:
        """The model's workers, warmed up, and its balancer; and the warm-up's seconds."""
        if self._placer is not None:
            return await self._build_placed(model, self._placer)
        config = self._config
        assert model.pipeline is not None and model.balancer is not None  # resolved
        specs = [self._spec(model, group)
                 for group in device_groups(self._devices, model.pipeline.stages)]
        definition = await asyncio.to_thread(load_spec_definition, specs[0])
        workers = await build_workers(specs, definition, config.workers, config.ray_address,
                                      self._placement())
        warmup_s = await self._warm_up(model, definition, workers)
        balancer = ModelBalancer(model_name=model.name, workers=workers, config=model.balancer,
                                 on_health=self._on_health, ledger=self._ledger,
                                 count_cpu=cpu_accounting.enabled())
        balancer.start()
        return ServedModel(model.name, definition, balancer), warmup_s


    async def _build_placed(self, model: ModelConfig,
                            placer: Placer) -> tuple[ServedModel, float | None]:
        """Under ``--placement auto``: the model's first replicas where it serves fastest within
        the free memory (its floor; the placer moves them from there), and its balancer, which
        the placer manages from then on."""
        assert model.pipeline is not None and model.balancer is not None  # resolved
        if model.pipeline.stages > 1:
            raise ModelControlError(f"model {model.name!r}: --placement auto places "
                                    "single-device replicas; pipelines need --placement all",
                                    ErrorCode.INVALID_ARGUMENT)
        self._check_pins(model)
        spec = self._spec(model, (self._devices[0],))
        definition = await asyncio.to_thread(load_spec_definition, spec)
        # Until its replicas have measured theirs; the parameters counted in the widest dtype
        # any device serves, as the devices are not chosen yet (the same figure unless CPUs
        # serve beside GPUs).
        memory = model.memory_bytes or placement.replica_parameter_bytes(
            definition, self._devices, self._config.dtype)
        prior = placement.prior_cost(model, definition)
        template = placement.profile(model, memory, self._devices, prior, model.sim_load_s)
        free = placer.free_bytes()
        try:
            chosen = placement.first_devices(template, free)
        except placement.PlacementRefused as exc:
            raise ModelControlError(str(exc), exc.code) from None
        wanted = max(model.min_replicas, len(model.pinned))
        if len(chosen) < wanted:
            raise ModelControlError(
                f"model {model.name!r} needs {wanted} replicas of {memory / 2**30:.2f} GiB and "
                f"only {len(chosen)} fit now (free: " + ", ".join(
                    f"{d} {b / 2**30:.2f} GiB" for d, b in sorted(free.items())) + "); "
                "min_replicas = 0 loads it on demand instead", ErrorCode.RESOURCE_EXHAUSTED)
        devices = {d.name: d for d in self._devices}
        parameters = placement.replica_parameter_bytes(
            definition, [devices[d] for d in chosen], self._config.dtype)
        # Held for each chosen device until ``add_model`` counts the replicas: the parameters
        # at first, then what the warmed-up replicas measured. A warmed-up replica keeps its
        # activation peak (the caching allocator holds on to it), and the placer may load
        # other models meanwhile, while this model's later replicas build.
        held = memory
        for device in chosen:
            placer.hold(device, held)
        workers: dict[str, Worker] = {}
        started_s = time.monotonic()
        try:
            for device in chosen:
                workers[device] = await self._build_replica(model, definition, devices[device])
                needed = placement.replica_memory_bytes(model.memory_bytes, parameters,
                                                        [w.status() for w in workers.values()])
                if needed > held:
                    for each in chosen:
                        placer.hold(each, needed - held)
                    held = needed
        except BaseException:
            await asyncio.gather(*(w.close() for w in workers.values()), return_exceptions=True)
            raise
        finally:
            for device in chosen:
                placer.release(device, held)
        load_s = (time.monotonic() - started_s) / len(chosen) if chosen else model.sim_load_s
        statuses = {device: worker.status() for device, worker in workers.items()}
        measured = placement.replica_memory_bytes(model.memory_bytes, parameters,
                                                  statuses.values())
        if measured != memory:
            logger.info("model %s: %.2f GiB per replica (parameters and buffers %.2f GiB, the "
                        "rest its activation peak at batch %d)", model.name, measured / 2**30,
                        parameters / 2**30, model.balancer.max_batch)
        self._unmeasured.note(model, parameters,
                              [(devices[device], status) for device, status in statuses.items()])
        balancer = ModelBalancer(
            model_name=model.name, workers=list(workers.values()), config=model.balancer,
            on_health=self._on_health, ledger=self._ledger,
            count_cpu=cpu_accounting.enabled(),
            on_no_replica=placer.no_replica_callback(model.name))
        # A reload: the new balancer takes over; the old replicas' memory stays held until
        # they have drained and closed (``load``).
        for device, memory_bytes in placer.forget_model(model.name):
            placer.hold(device, memory_bytes)
            self._draining[model.name].append((device, memory_bytes))
        placer.add_model(dataclasses.replace(template, load_s=load_s, memory_bytes=measured),
                         prior, balancer, workers)
        self._definitions[model.name] = definition
        balancer.start()
        return ServedModel(model.name, definition, balancer), None


def source_from_load_parameters(parameters: Mapping[str, pb.ModelRepositoryParameter]
                                ) -> str | None:
    """The ``source`` a RepositoryModelLoad asks for in its ``config`` parameter (a JSON
    object), or None; anything else in the request is refused."""
    unknown = sorted(set(parameters) - {"config"})
    if unknown:
        raise ModelControlError(f"unsupported load parameters {unknown}: evenflow loads model "
                                "sources by name or path, not uploaded files",
                                ErrorCode.INVALID_ARGUMENT)
    if "config" not in parameters:
        return None
    try:
        config = json.loads(parameters["config"].string_param)
    except json.JSONDecodeError as exc:
        raise ModelControlError(f"load parameter 'config' is not JSON: {exc}",
                                ErrorCode.INVALID_ARGUMENT) from exc
    if not isinstance(config, dict) or set(config) - {"source"} or \
            not isinstance(config.get("source", ""), str):
        raise ModelControlError("load parameter 'config' must be a JSON object with at most a "
                                "string 'source'", ErrorCode.INVALID_ARGUMENT)
    return config.get("source")
