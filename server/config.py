"""The server's configuration: one frozen value built once from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field

from evenflow.balancer import BalancerConfig
from evenflow.server.models.repository import BuiltinOptions

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Attributes:
    host, port: where to listen (port 0 picks a free port; the bound one is printed).
    max_message_bytes: largest gRPC message received or sent.
    models: (name, source) pairs; source is a built-in name, package.module:factory or a .pt file.
    devices: comma list (cuda:N, cpu[:N], sim:SPEED); None = every GPU, else cpu.
    cpu_threads: torch intra-op threads (shared by the process's CPU workers).
    dtype: precision the model runs in on GPUs.
    balancer: admission, routing and batching settings, the same for every model.
    builtins: sizes of the built-in models.
    admin: serve the admin service (changes simulated devices).
    metrics_port: serve Prometheus metrics at http://host:PORT/metrics (0 picks a free port);
        None serves none.
    shutdown_grace_s: on SIGTERM, how long in-flight requests get to finish.
    pipeline_stages: devices per replica; each replica is a pipeline of that many stages.
    pipeline_partition: "optimal" (exact partitioner) or "even" (same layer count per stage).
    repartition: re-partition a pipeline when its stage times drift apart.
    gil_switch_interval_s: Python's GIL switch interval. The default 5 ms lets the busy event
        loop hold the GIL for 5 ms while a worker thread waits to resume after each kernel; a
        short interval hands it over sooner.
    """

    host: str = "127.0.0.1"
    port: int = 8001
    max_message_bytes: int = 64 * 1024 * 1024
    models: tuple[tuple[str, str], ...] = (("mlp", "mlp"),)
    devices: str | None = None
    cpu_threads: int = 1
    dtype: str = "float32"
    balancer: BalancerConfig = field(default_factory=BalancerConfig)
    builtins: BuiltinOptions = field(default_factory=BuiltinOptions)
    admin: bool = False
    metrics_port: int | None = None
    shutdown_grace_s: float = 30.0
    gil_switch_interval_s: float = 0.0002
    pipeline_stages: int = 1
    pipeline_partition: str = "optimal"
    repartition: bool = True
