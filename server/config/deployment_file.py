"""The deployment file (``evenflow serve --config evenflow.toml``): its schema, the merge with
command-line flags, and the checks that run before anything is loaded.

Every key is optional: a key left out takes the default stated once in ``server.config`` (and
``balancer.BalancerConfig``); the schema only says what each key may hold. Invalid files fail
with the key, the value and the reason, all problems at once (``ConfigError``).

    [server]     host, port, max_message_bytes, max_tensor_elements, shutdown_grace_s,
                 gil_switch_interval_us, http_port, metrics_port, log_level, log_format,
                 frontends, workers, ray_address, ray_placement_timeout_s, placement
    [devices]    list, cpu_threads, dtype, warmup_batches, memory (device name -> "16GiB")
    [security]   admin, allow_any_model_source, tls_cert, tls_key, tls_client_ca,
                 auth_token_file, auth_groups
    [builtins]   encoder_size, sim_base_ms, sim_per_sample_ms, sim_layer_ms
    [balancing]  the defaults of every model: policy, batch_policy, max_batch, max_wait_ms,
                 latency_target_ms, slo_ms, max_queued_requests, max_queued_samples,
                 max_queue_delay_ms, work_stealing, late_binding, watchdog_s, watchdog_floor_s,
                 priority_levels,
                 default_priority_level, pipeline_stages, pipeline_partition, repartition
    [models.NAME] source (required), load, inputs, outputs, min_replicas, max_replicas,
                 pinned, memory_gib, sim_base_ms, sim_per_sample_ms, sim_load_ms, and any
                 [balancing] key
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from evenflow.balancer import BalancerConfig, Policy
from evenflow.server.config.server_config import (
    DTYPES,
    PARTITIONS,
    PLACEMENTS,
    WORKER_HOSTS,
    ModelConfig,
    PipelineConfig,
    ServerConfig,
)
from evenflow.server.edge.datatypes import WIRE_TYPES
from evenflow.server.models.builtin import ENCODER_SIZES
from evenflow.server.models.exported import EXPORTED_SUFFIX
from evenflow.server.models.repository import BUILTIN_MODELS, TORCHSCRIPT_SUFFIXES
from evenflow.server.models.spec import SimProfile, TensorSpec
from evenflow.server.workers.devices import parse_devices

Port = Annotated[int, Field(ge=0, le=65535)]
Positive = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
NonNegative = Annotated[int, Field(ge=0)]
# gRPC keeps message sizes in a signed 32-bit int: a larger bound raises OverflowError when the
# server is built, after the models have loaded.
MAX_MESSAGE_BYTES = 2**31 - 1
# Python keeps its switch interval in whole microseconds (under 1 it silently becomes 0); past
# a second the event loop would hold the GIL through whole batches.
GIL_SWITCH_INTERVAL_US = (1.0, 1e6)


def _message_bytes(value: int) -> int:
    if value > MAX_MESSAGE_BYTES:
        raise ValueError(f"at most {MAX_MESSAGE_BYTES} (2**31 - 1): gRPC keeps message sizes in "
                         "a signed 32-bit integer")
    return value


def _switch_interval_us(value: float) -> float:
    low, high = GIL_SWITCH_INTERVAL_US
    if not low <= value <= high:  # also refuses nan
        raise ValueError(f"must be from {low:g} us to {high:g} us (1 s): Python keeps the "
                         "interval in whole microseconds")
    return value


def _size(text: str) -> str:
    parse_size_bytes(text)
    return text


def _memory_gib(value: float) -> float:
    _bytes_of(value, 2**30)
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ServerSection(_Section):
    host: str | None = None
    port: Port | None = None
    max_message_bytes: Annotated[int, Field(ge=1024), AfterValidator(_message_bytes)] \
        | None = None
    max_tensor_elements: Positive | None = None
    shutdown_grace_s: NonNegativeFloat | None = None
    gil_switch_interval_us: Annotated[float, AfterValidator(_switch_interval_us)] | None = None
    http_port: Port | Literal["off"] | None = None
    metrics_port: Port | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] | None = None
    log_format: Literal["text", "json"] | None = None
    frontends: Positive | None = None
    workers: Literal[WORKER_HOSTS] | None = None  # type: ignore[valid-type]
    ray_address: str | None = None
    ray_placement_timeout_s: PositiveFloat | None = None
    placement: Literal[PLACEMENTS] | None = None  # type: ignore[valid-type]


class DevicesSection(_Section):
    model_config = ConfigDict(populate_by_name=True)
    names: Annotated[list[str], Field(min_length=1)] | None = Field(None, alias="list")
    cpu_threads: Positive | None = None
    dtype: Literal[DTYPES] | None = None  # type: ignore[valid-type]
    warmup_batches: NonNegative | None = None
    memory: dict[str, Annotated[str, AfterValidator(_size)]] | None = None

    @field_validator("names")
    @classmethod
    def _known_devices(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            parse_devices(",".join(value))
        return value


class SecuritySection(_Section):
    admin: bool | None = None
    allow_any_model_source: bool | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    auth_token_file: str | None = None
    auth_groups: list[Literal["inference", "statistics", "model-control", "admin"]] | None = None

    @field_validator("auth_groups")
    @classmethod
    def _some_groups(cls, value: list[str] | None) -> list[str] | None:
        if value == []:
            raise ValueError("name at least one group (leave the key out for all of them); to "
                             "guard nothing, leave out auth_token_file")
        return value

    @field_validator("tls_cert", "tls_key", "tls_client_ca", "auth_token_file")
    @classmethod
    def _file_exists(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_file():
            raise ValueError("no such file")
        return value


class BuiltinsSection(_Section):
    encoder_size: Literal[tuple(ENCODER_SIZES)] | None = None  # type: ignore[valid-type]
    sim_base_ms: NonNegativeFloat | None = None
    sim_per_sample_ms: NonNegativeFloat | None = None
    sim_layer_ms: Annotated[list[PositiveFloat], Field(min_length=1)] | None = None


class BalancingSection(_Section):
    policy: Literal[tuple(p.value for p in Policy)] | None = None  # type: ignore[valid-type]
    batch_policy: Literal["adaptive", "fixed"] | None = None
    max_batch: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    max_wait_ms: NonNegativeFloat | None = None
    latency_target_ms: PositiveFloat | None = None
    slo_ms: PositiveFloat | None = None
    max_queued_requests: Positive | None = None
    max_queued_samples: Positive | None = None
    max_queue_delay_ms: NonNegativeFloat | None = None
    work_stealing: bool | None = None
    late_binding: bool | None = None
    watchdog_s: PositiveFloat | None = None
    watchdog_floor_s: PositiveFloat | None = None
    priority_levels: Annotated[int, Field(ge=1, le=64)] | None = None
    default_priority_level: Positive | None = None
    pipeline_stages: Positive | None = None
    pipeline_partition: Literal[PARTITIONS] | None = None  # type: ignore[valid-type]
    repartition: bool | None = None


class TensorSection(_Section):
    name: Annotated[str, Field(min_length=1)]
    datatype: Literal[tuple(WIRE_TYPES)]  # type: ignore[valid-type]
    shape: Annotated[list[int], Field(min_length=1)]

    @field_validator("shape")
    @classmethod
    def _batch_first(cls, value: list[int]) -> list[int]:
        if value[0] != -1:
            raise ValueError("must start with the batch dimension, -1")
        if any(d < 1 and d != -1 for d in value[1:]):
            raise ValueError("dimensions are positive or -1 (variable)")
        return value

    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.datatype, tuple(self.shape))


class ModelSection(BalancingSection):
    source: Annotated[str, Field(min_length=1)]
    load: bool | None = None
    min_replicas: NonNegative | None = None
    max_replicas: Positive | None = None
    pinned: list[str] | None = None
    memory_gib: Annotated[float, AfterValidator(_memory_gib)] | None = None
    sim_base_ms: NonNegativeFloat | None = None
    sim_per_sample_ms: NonNegativeFloat | None = None
    sim_load_ms: NonNegativeFloat | None = None
    inputs: list[TensorSection] | None = None
    outputs: list[TensorSection] | None = None


class Settings(_Section):
    server: ServerSection = ServerSection()
    devices: DevicesSection = DevicesSection.model_validate({})
    security: SecuritySection = SecuritySection()
    builtins: BuiltinsSection = BuiltinsSection()
    balancing: BalancingSection = BalancingSection()
    models: dict[str, ModelSection] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    key: str
    value: Any
    reason: str

    def __str__(self) -> str:
        value = "" if self.value is _MISSING else f" = {self.value!r}"
        return f"{self.key}{value}: {self.reason}"


_MISSING = object()


class ConfigError(ValueError):
    """Every problem of one configuration, each naming its key, value and reason."""

    def __init__(self, origin: str, problems: list[Problem]) -> None:
        self.origin = origin
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"invalid configuration ({origin}):\n{lines}")


def read_file(path: Path) -> dict[str, Any]:
    """The file as a TOML table; a syntax error becomes a ConfigError with its position."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(path), [Problem("--config", str(path), "no such file")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [Problem("(file)", _MISSING, f"not TOML: {exc}")]) from None


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` (nested tables) laid over ``base``; a key set in both takes the override."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def validate(table: Mapping[str, Any], origin: str) -> Settings:
    """Check the types and ranges of every key, then what depends on several keys and on the
    machine (devices, pipelines, batch bounds, model sources)."""
    try:
        settings = Settings.model_validate(table)
    except ValidationError as exc:
        raise ConfigError(origin, [_problem(error) for error in exc.errors()]) from None
    problems = list(_cross_checks(settings))
    if problems:
        raise ConfigError(origin, problems)
    return settings


def _problem(error: Mapping[str, Any]) -> Problem:
    key = ".".join(str(part) for part in error["loc"])
    reason = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return Problem(key, _MISSING, "unknown key")
    if error["type"] == "missing":
        return Problem(key, _MISSING, "required")
    return Problem(key, error.get("input", _MISSING), reason)


def _cross_checks(settings: Settings) -> list[Problem]:
    """Checks over several keys. Each problem is reported once, at the key that set the value
    (a model's own, else ``balancing``'s)."""
    problems: dict[str, Problem] = {}
    security = settings.security
    if (security.tls_cert is None) != (security.tls_key is None):
        key = "security.tls_key" if security.tls_key is None else "security.tls_cert"
        problems[key] = Problem(key, _MISSING, "TLS needs both tls_cert and tls_key")
    if security.tls_client_ca is not None and security.tls_cert is None:
        problems["security.tls_client_ca"] = Problem(
            "security.tls_client_ca", security.tls_client_ca,
            "mutual TLS needs the server's own tls_cert and tls_key")
    devices = settings.devices.names
    known = {d.name for d in parse_devices(",".join(devices))} if devices else None

    def unknown(device: str, reason: str) -> str | None:
        """``reason`` if ``device`` is not in ``devices.list``; without one, why it cannot name
        a device, if it cannot."""
        if known is None:
            return _not_a_device_name(device)
        return None if device in known else f"{reason} ({', '.join(sorted(known))})"

    for device in settings.devices.memory or {}:
        reason = unknown(device, "no such device in devices.list")
        if reason:
            problems[f"devices.memory.{device}"] = Problem(f"devices.memory.{device}", _MISSING,
                                                           reason)
    for name, section in settings.models.items():
        pins = section.pinned or []
        reason = next(filter(None, (unknown(d, f"no device {d!r} in devices.list")
                                    for d in pins)), None)
        if reason:
            problems[f"models.{name}.pinned"] = Problem(f"models.{name}.pinned", pins, reason)
        if section.max_replicas is not None and len(set(pins)) > section.max_replicas:
            problems[f"models.{name}.max_replicas"] = Problem(
                f"models.{name}.max_replicas", section.max_replicas,
                f"below the {len(set(pins))} devices in pinned: each pinned device always "
                "has a replica")
        if section.min_replicas is not None and section.max_replicas is not None and \
                section.min_replicas > section.max_replicas:
            problems[f"models.{name}.min_replicas"] = Problem(
                f"models.{name}.min_replicas", section.min_replicas,
                f"must not exceed max_replicas ({section.max_replicas})")
    defaults = settings.balancing
    for name, model in [("balancing", defaults),
                        *((f"models.{n}", m) for n, m in settings.models.items())]:
        def pick(key: str, model: BalancingSection = model, name: str = name) -> tuple[Any, str]:
            if getattr(model, key) is not None:
                return getattr(model, key), f"{name}.{key}"
            if getattr(defaults, key) is not None:
                return getattr(defaults, key), f"balancing.{key}"
            return file_defaults()["balancing"][key], f"balancing.{key}"

        def report(key: str, value: Any, reason: str) -> None:
            problems.setdefault(key, Problem(key, value, reason))

        (stages, stages_key) = pick("pipeline_stages")
        if devices is not None and len(devices) % stages:
            report(stages_key, stages,
                   f"{len(devices)} devices cannot form pipelines of {stages} stages")
        (max_batch, batch_key) = pick("max_batch")
        if reason := _batch_past_bounds(max_batch, pick("max_queued_requests")[0],
                                        *pick("max_queued_samples")):
            report(batch_key, max_batch, reason)
        (wait_ms, wait_key), (target_ms, target_key) = (pick("max_wait_ms"),
                                                        _latency_target(name, model, defaults))
        if wait_ms >= target_ms:
            report(wait_key, wait_ms, f"must be below latency_target_ms ({target_ms}): no "
                                      "batch could meet the target")
        (slo_ms, slo_key) = pick("slo_ms")
        if slo_ms is not None and target_ms > slo_ms:
            report(target_key, target_ms, f"must not exceed slo_ms ({slo_ms}, {slo_key}): "
                                          "batch sizes would aim past the SLO")
        (levels, _), (default_level, default_key) = (pick("priority_levels"),
                                                     pick("default_priority_level"))
        if default_level is not None and default_level > levels:
            report(default_key, default_level,
                   f"must be one of the priority levels 1..{levels}")
        if isinstance(model, ModelSection):
            reason = source_problem(model.source)
            if reason:
                report(f"{name}.source", model.source, reason)
    return list(problems.values())


def _batch_past_bounds(max_batch: int, queued: int, samples: int | None,
                       samples_key: str) -> str | None:
    """Why a full batch cannot pass admission's count bounds, if it cannot. A request may
    carry ``max_batch`` samples: above ``max_queued_samples`` it would be refused even idle."""
    if max_batch > queued:
        return f"a full batch cannot fit in the admission bound (max_queued_requests = {queued})"
    if samples is not None and max_batch > samples:
        return ("a full batch cannot fit in the admission bound "
                f"(max_queued_samples = {samples}, {samples_key})")
    return None


# What the server names its devices (``workers.devices``): kind and index, no colon.
_DEVICE_NAME = re.compile(r"(cpu|cuda|sim)\d+")


def _not_a_device_name(device: str) -> str | None:
    """Why ``device`` cannot name a device of any server, if it cannot: where the file has no
    ``devices.list``, the devices are found at start, and only the name's form is checked
    here (the server checks the names against its devices then)."""
    if _DEVICE_NAME.fullmatch(device):
        return None
    hint = device.replace(":", "")
    return (f"{device!r} is not a device name: devices are named cpuN, cudaN or simN"
            + (f" ({hint!r} here)" if _DEVICE_NAME.fullmatch(hint) else ""))


def _latency_target(name: str, model: BalancingSection,
                    defaults: BalancingSection) -> tuple[float, str]:
    """A model's latency target and the key that set it: the section's own
    ``latency_target_ms``, else its own ``slo_ms`` (a declared SLO is also what batch sizes aim
    for), else the same two of ``[balancing]``, else the default."""
    for prefix, section in ((name, model), ("balancing", defaults)):
        for key in ("latency_target_ms", "slo_ms"):
            value = getattr(section, key)
            if value is not None:
                return value, f"{prefix}.{key}"
    return file_defaults()["balancing"]["latency_target_ms"], "balancing.latency_target_ms"


def file_defaults() -> dict[str, dict[str, Any]]:
    """Every key's default in the file's units, read from the configuration classes (where the
    defaults are stated); None where a key is off or chosen at start (``devices.list``)."""
    config = ServerConfig()
    balancer, pipeline, builtins = config.balancer, config.pipeline, config.builtins
    return {
        "server": {"host": config.host, "port": config.port,
                   "max_message_bytes": config.max_message_bytes,
                   "max_tensor_elements": config.max_tensor_elements,
                   "shutdown_grace_s": config.shutdown_grace_s,
                   "gil_switch_interval_us": round(config.gil_switch_interval_s * 1e6, 3),
                   "http_port": config.http_port, "metrics_port": config.metrics_port,
                   "log_level": config.log_level,
                   "log_format": config.log_format, "frontends": config.frontends,
                   "workers": config.workers, "ray_address": config.ray_address,
                   "ray_placement_timeout_s": config.ray_placement_timeout_s,
                   "placement": config.placement},
        "devices": {"list": None, "cpu_threads": config.cpu_threads, "dtype": config.dtype,
                    "warmup_batches": config.warmup_batches, "memory": None},
        "security": {"admin": config.admin,
                     "allow_any_model_source": config.allow_any_model_source,
                     "tls_cert": None, "tls_key": None, "tls_client_ca": None,
                     "auth_token_file": None, "auth_groups": list(config.auth_groups)},
        "builtins": {"encoder_size": builtins.encoder_size,
                     "sim_base_ms": builtins.sim_profile.base_ms,
                     "sim_per_sample_ms": builtins.sim_profile.per_sample_ms,
                     "sim_layer_ms": list(builtins.sim_layer_ms)},
        "balancing": {"policy": balancer.policy.value,
                      "batch_policy": "adaptive" if balancer.adaptive_batching else "fixed",
                      "max_batch": balancer.max_batch,
                      "max_wait_ms": round(balancer.max_wait_s * 1000.0, 6),
                      "latency_target_ms": round(balancer.latency_target_s * 1000.0, 6),
                      "slo_ms": None if balancer.slo_s is None
                      else round(balancer.slo_s * 1000.0, 6),
                      "max_queued_requests": balancer.max_queued_requests,
                      "max_queued_samples": balancer.max_queued_samples,
                      "max_queue_delay_ms": None if balancer.max_queue_delay_s is None
                      else balancer.max_queue_delay_s * 1000.0,
                      "work_stealing": balancer.work_stealing,
                      "late_binding": balancer.late_binding,
                      "watchdog_s": balancer.watchdog_s,
                      "watchdog_floor_s": balancer.watchdog_floor_s,
                      "priority_levels": balancer.priority_levels,
                      "default_priority_level": balancer.default_priority_level,
                      "pipeline_stages": pipeline.stages,
                      "pipeline_partition": pipeline.partition,
                      "repartition": pipeline.repartition},
    }


def source_problem(source: str) -> str | None:
    """Why ``source`` cannot be a model, checked without loading it; None when it may be."""
    if source in BUILTIN_MODELS:
        return None
    if source.endswith((EXPORTED_SUFFIX, *TORCHSCRIPT_SUFFIXES)):
        return None if Path(source).is_file() else "no such file"
    module, sep, attr = source.partition(":")
    if not sep:
        return (f"neither a built-in {list(BUILTIN_MODELS)}, a package.module:factory, a "
                f"TorchScript file ({', '.join(TORCHSCRIPT_SUFFIXES)}) nor an exported program "
                f"({EXPORTED_SUFFIX})")
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found or not attr.isidentifier():
        return f"no module {module!r} to import" if not found else f"bad factory name {attr!r}"
    return None


def to_server_config(settings: Settings) -> ServerConfig:
    """The validated settings as the server's frozen configuration; unset keys keep the
    defaults of ``ServerConfig``, ``BalancerConfig`` and friends."""
    server, devices, security, builtins = (settings.server, settings.devices,
                                           settings.security, settings.builtins)
    balancer = _balancer(settings.balancing, BalancerConfig())
    pipeline = _pipeline(settings.balancing, PipelineConfig())
    models = tuple(
        ModelConfig(name=name, source=model.source, balancer=_balancer(model, balancer),
                    pipeline=_pipeline(model, pipeline),
                    inputs=tuple(t.spec() for t in model.inputs) if model.inputs else None,
                    outputs=tuple(t.spec() for t in model.outputs) if model.outputs else None,
                    pinned=tuple(model.pinned or ()),
                    sim_profile=_sim_profile(model),
                    **_set(load_at_start=model.load, min_replicas=model.min_replicas,
                           max_replicas=model.max_replicas,
                           memory_bytes=_bytes_of(model.memory_gib, 2**30)
                           if model.memory_gib is not None else None,
                           sim_load_s=model.sim_load_ms / 1000.0
                           if model.sim_load_ms is not None else None))
        for name, model in settings.models.items())
    defaults = ServerConfig()
    sim_profile = dataclasses.replace(
        defaults.builtins.sim_profile,
        **_set(base_ms=builtins.sim_base_ms, per_sample_ms=builtins.sim_per_sample_ms))
    config = dataclasses.replace(
        defaults, balancer=balancer, pipeline=pipeline,
        builtins=dataclasses.replace(
            defaults.builtins, sim_profile=sim_profile,
            **_set(encoder_size=builtins.encoder_size,
                   sim_layer_ms=tuple(builtins.sim_layer_ms) if builtins.sim_layer_ms else None)),
        **_set(host=server.host, port=server.port, max_message_bytes=server.max_message_bytes,
               max_tensor_elements=server.max_tensor_elements,
               shutdown_grace_s=server.shutdown_grace_s, metrics_port=server.metrics_port,
               http_port=server.http_port if server.http_port != "off" else None,
               log_level=server.log_level, log_format=server.log_format,
               frontends=server.frontends, workers=server.workers,
               ray_address=server.ray_address,
               ray_placement_timeout_s=server.ray_placement_timeout_s,
               placement=server.placement,
               device_memory_bytes={d: parse_size_bytes(v) for d, v in devices.memory.items()}
               if devices.memory else None,
               gil_switch_interval_s=server.gil_switch_interval_us / 1e6
               if server.gil_switch_interval_us is not None else None,
               cpu_threads=devices.cpu_threads, dtype=devices.dtype,
               warmup_batches=devices.warmup_batches,
               devices=",".join(devices.names) if devices.names else None,
               admin=security.admin, allow_any_model_source=security.allow_any_model_source,
               tls_cert=_path(security.tls_cert), tls_key=_path(security.tls_key),
               tls_client_ca=_path(security.tls_client_ca),
               auth_token_file=_path(security.auth_token_file),
               auth_groups=tuple(security.auth_groups) if security.auth_groups else None,
               models=models or None))
    # "off" is the one key whose value turns something off rather than leaving it unset.
    return dataclasses.replace(config, http_port=None) if server.http_port == "off" else config


def _sim_profile(model: ModelSection) -> SimProfile | None:
    if model.sim_base_ms is None and model.sim_per_sample_ms is None:
        return None
    return dataclasses.replace(SimProfile(), **_set(base_ms=model.sim_base_ms,
                                                    per_sample_ms=model.sim_per_sample_ms))


_UNITS = {"gib": 2**30, "mib": 2**20, "kib": 2**10, "gb": 10**9, "mb": 10**6, "kb": 10**3,
          "b": 1, "": 1}


def parse_size_bytes(text: str) -> int:
    """``16GiB``, ``512MiB``, ``8GB`` or a number of bytes: finite, at least one byte."""
    number = text.strip().rstrip("BbIiKkMmGg")
    unit = text.strip()[len(number):].lower()
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size (e.g. 16GiB, 512MiB, 8GB)") from None
    if unit not in _UNITS or value <= 0:
        raise ValueError(f"{text!r} is not a size (e.g. 16GiB, 512MiB, 8GB)")
    return _bytes_of(value, _UNITS[unit])


def _bytes_of(value: float, unit: int) -> int:
    """``value`` units as whole bytes; a ValueError (never an OverflowError) where that is
    not a finite number or is under one byte."""
    size = value * unit
    if not math.isfinite(size):
        raise ValueError("not a finite size")
    if size < 1:
        raise ValueError("under 1 byte")
    return int(size)


def _path(value: str | None) -> Path | None:
    return Path(value) if value is not None else None


def _set(**values: Any) -> dict[str, Any]:
    """Only the keys that were given (None means "not set": keep the dataclass default)."""
    return {key: value for key, value in values.items() if value is not None}


def _balancer(section: BalancingSection, base: BalancerConfig) -> BalancerConfig:
    target_ms = section.latency_target_ms if section.latency_target_ms is not None \
        else section.slo_ms
    return dataclasses.replace(base, **_set(
        policy=Policy(section.policy) if section.policy else None,
        adaptive_batching=(section.batch_policy == "adaptive") if section.batch_policy
        else None,
        max_batch=section.max_batch,
        max_wait_s=section.max_wait_ms / 1000.0 if section.max_wait_ms is not None else None,
        latency_target_s=target_ms / 1000.0 if target_ms is not None else None,
        slo_s=section.slo_ms / 1000.0 if section.slo_ms is not None else None,
        max_queued_requests=section.max_queued_requests,
        max_queued_samples=section.max_queued_samples,
        max_queue_delay_s=section.max_queue_delay_ms / 1000.0
        if section.max_queue_delay_ms is not None else None,
        work_stealing=section.work_stealing, late_binding=section.late_binding,
        watchdog_s=section.watchdog_s, watchdog_floor_s=section.watchdog_floor_s,
        priority_levels=section.priority_levels,
        default_priority_level=section.default_priority_level))


def _pipeline(section: BalancingSection, base: PipelineConfig) -> PipelineConfig:
    return dataclasses.replace(base, **_set(stages=section.pipeline_stages,
                                            partition=section.pipeline_partition,
                                            repartition=section.repartition))


def load(path: Path | None, overrides: Mapping[str, Any]) -> ServerConfig:
    """The file at ``path`` (if any) with ``overrides`` (from flags) laid over it, validated."""
    table = read_file(path) if path is not None else {}
    origin = f"{path}{' + command line' if overrides else ''}" if path else "command line"
    return to_server_config(validate(merge(table, overrides), origin))
