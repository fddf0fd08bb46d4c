"""The server's configuration: frozen values built once, from the command line and/or a
configuration file (``server.settings``). The defaults stated here are the only ones: the CLI's
help, the file's schema and the docs read them from these classes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evenflow.balancer import BalancerConfig
from evenflow.server.models.repository import BuiltinOptions
from evenflow.server.models.spec import SimProfile, TensorSpec

DTYPES = ("float32", "bfloat16", "float16")
WORKER_HOSTS = ("thread", "process", "ray")
PARTITIONS = ("optimal", "even")
PLACEMENTS = ("all", "auto")


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """Attributes:
    stages: devices per replica; each replica is a pipeline of that many stages.
    partition: "optimal" (exact partitioner) or "even" (same layer count per stage).
    repartition: re-partition a pipeline when its stage times drift apart.
    """

    stages: int = 1
    partition: str = "optimal"
    repartition: bool = True


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One model the server knows.

    Attributes:
        name: the name clients call it by.
        source: a built-in name, package.module:factory, a TorchScript .pt or an exported .pt2.
        balancer: admission, routing and batching; None uses the server's.
        pipeline: how replicas are split over devices; None uses the server's.
        inputs, outputs: the tensor spec, overriding the source's own (e.g. TorchScript's
            ``.json`` beside the file); None keeps the source's.
        load_at_start: load when the server starts; else it waits for a model-control load.
        min_replicas, max_replicas, pinned: with ``--placement auto``, the bounds on its
            replica count and the devices it always has a replica on; ``min_replicas = 0``
            lets an idle model lose its replicas to others and load again on its next request.
        memory_bytes: a replica's footprint for placement (None: measured when it loads).
        sim_profile, sim_load_s: a ``sim`` model's batch cost (None: the server's
            ``builtins``) and the load time its replicas simulate (slept before each is built).
    """

    name: str
    source: str
    balancer: BalancerConfig | None = None
    pipeline: PipelineConfig | None = None
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    load_at_start: bool = True
    min_replicas: int = 1
    max_replicas: int | None = None
    pinned: tuple[str, ...] = ()
    memory_bytes: int | None = None
    sim_profile: SimProfile | None = None
    sim_load_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Attributes:
    host, port: where to listen (port 0 picks a free port; the bound one is printed).
    max_message_bytes: largest gRPC message received or sent, and largest HTTP request body
        (before and after decompression).
    max_tensor_elements: most elements one input tensor of a request may have.
    models: the models the server knows (``(name, source)`` pairs are accepted and become
        ModelConfig with the server's balancer and pipeline settings).
    devices: comma list (cuda:N, cpu[:N], sim:SPEED); None = every GPU, else cpu.
    cpu_threads: torch intra-op threads (shared by the process's CPU workers).
    dtype: precision the model runs in on GPUs.
    warmup_batches: batches each replica runs before its model is READY (sizes 1 up to the
        max batch), so first-batch costs (lazy CUDA init, cuBLAS heuristics, TorchScript
        profiling) land neither in the latency fit nor in the statistics; 0 turns it off.
    balancer: admission, routing and batching settings of models that set none of their own.
    pipeline: pipeline settings of models that set none of their own.
    builtins: sizes of the built-in models.
    admin: serve the admin service (changes simulated devices).
    allow_any_model_source: model control may load sources the configuration does not name
        (they run arbitrary code: off unless asked for).
    http_port: serve the KServe v2 REST API (and the devices page at ``/``) on this port,
        beside gRPC (Triton's 8000; 0 picks a free port; None serves no HTTP).
    metrics_port: serve Prometheus metrics at http://host:PORT/metrics (0 picks a free port);
        None serves none.
    shutdown_grace_s: on SIGTERM, how long in-flight requests get to finish.
    frontends: gRPC front-end processes sharing the port (SO_REUSEPORT) around one engine
        process that balances; 1 serves everything from one process.
    workers: where device workers run: "thread" (threads of the engine process),
        "process" (one process per replica: a crash or hang there stays there) or "ray" (one
        Ray actor per replica, on any node of a Ray cluster; needs the ``ray`` extra).
    ray_address: with ``workers="ray"``: the cluster to join (``auto``, ``HOST:PORT``,
        ``ray://...``), or "local" for a private instance on this machine.
    ray_placement_timeout_s: with ``workers="ray"``: how long start-up waits for the cluster
        to place a replica's actor before it fails, naming the replica and what it asked for.
    gil_switch_interval_s: Python's GIL switch interval. The default 5 ms lets the busy event
        loop hold the GIL for 5 ms while a worker thread waits to resume after each kernel; a
        short interval hands it over sooner.
    log_level, log_format: logging threshold and line format ("text" or "json").
    tls_cert, tls_key: serve gRPC (and metrics) over TLS with this certificate and key.
    tls_client_ca: also require client certificates signed by this CA (mutual TLS).
    auth_token_file: require ``authorization: Bearer TOKEN`` (the file's first line; else the
        EVENFLOW_AUTH_TOKEN environment variable, if set) on the RPC groups in ``auth_groups``.
    placement: "all" (every model a replica on every device) or "auto" (the placer decides,
        within each device's memory, from the measured demand: ``balancer.placement``).
    device_memory_bytes: memory replicas may use, per device name; a device not named has
        its GPU's free memory at start less a tenth of its total, or its total less a tenth
        where free memory is not known (``engine.device_memory.usable_bytes``), the machine's
        RAM (cpu), or no limit (sim).
    """

    host: str = "127.0.0.1"
    port: int = 8001
    max_message_bytes: int = 64 * 1024 * 1024
    max_tensor_elements: int = 1 << 24
    models: Sequence[ModelConfig | tuple[str, str]] = (ModelConfig("mlp", "mlp"),)
    devices: str | None = None
    cpu_threads: int = 1
    dtype: str = "float32"
    warmup_batches: int = 3
    balancer: BalancerConfig = field(default_factory=BalancerConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    builtins: BuiltinOptions = field(default_factory=BuiltinOptions)
    admin: bool = False
    allow_any_model_source: bool = False
    http_port: int | None = 8000
    metrics_port: int | None = None
    shutdown_grace_s: float = 30.0
    frontends: int = 1
    workers: str = "thread"
    ray_address: str = "local"
    ray_placement_timeout_s: float = 60.0
    gil_switch_interval_s: float = 0.0002
    log_level: str = "INFO"
    log_format: str = "text"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    auth_token_file: Path | None = None
    auth_groups: tuple[str, ...] = ("inference", "statistics", "model-control", "admin")
    placement: str = "all"
    device_memory_bytes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        models = tuple(m if isinstance(m, ModelConfig) else ModelConfig(*m) for m in self.models)
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique: {names}")
        object.__setattr__(self, "models", models)
        if self.frontends < 1:
            raise ValueError(f"frontends must be >= 1, not {self.frontends}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, not {self.placement!r}")
        if self.workers not in WORKER_HOSTS:
            raise ValueError(f"workers must be one of {WORKER_HOSTS}, not {self.workers!r}")

    def unused_placement_note(self) -> str | None:
        """What to tell an operator whose models set placement keys that this configuration
        ignores (``check-config`` prints it, ``serve`` logs it), if any do."""
        keys = self._unused_placement_keys()
        if not keys:
            return None
        return (f"{', '.join(keys)} steer placement = \"auto\" (--placement auto) alone; under "
                f"\"{self.placement}\" every model has a replica on every device, and they do "
                "nothing")

    def _unused_placement_keys(self) -> list[str]:
        """The models' placement keys set in this configuration that do nothing under it:
        ``pinned``, ``min_replicas``, ``max_replicas`` and ``memory_gib`` steer
        ``placement = "auto"`` alone. A ``min_replicas`` of 1 is the default, so it is not
        told apart from one unset."""
        if self.placement == "auto":
            return []
        unused = []
        for model in self.models:
            if not isinstance(model, ModelConfig):
                continue
            for key, value in (("pinned", model.pinned),
                               ("min_replicas", model.min_replicas != 1),
                               ("max_replicas", model.max_replicas is not None),
                               ("memory_gib", model.memory_bytes is not None)):
                if value:
                    unused.append(f"models.{model.name}.{key}")
        return unused

    def model_configs(self) -> tuple[ModelConfig, ...]:
        """Every model, its balancer and pipeline resolved to the server's where unset."""
        return tuple(self.resolve(m) for m in self.models if isinstance(m, ModelConfig))

    def resolve(self, model: ModelConfig) -> ModelConfig:
        return dataclasses.replace(model, balancer=model.balancer or self.balancer,
                                   pipeline=model.pipeline or self.pipeline)
