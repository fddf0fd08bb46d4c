"""The composition root: builds models, workers, balancers and the gRPC server from a
ServerConfig, and shuts them down in reverse order."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

import torch

from evenflow.balancer.placement.report import PlacementSnapshot
from evenflow.proto import evenflow_pb2_grpc, grpc_service_pb2_grpc
from evenflow.server.config.server_config import ServerConfig
from evenflow.server.edge.grpc_server import PortSettings, ServingPort, tls_files
from evenflow.server.edge.registration import Register
from evenflow.server.edge.rest.api import RestApi
from evenflow.server.edge.rest.http_port import HttpPort, HttpSettings
from evenflow.server.edge.rest.page import devices_page
from evenflow.server.edge.security import load_token
from evenflow.server.engine.kserve_servicer import InferenceServicer
from evenflow.server.engine.model_control import ModelManager
from evenflow.server.engine.proxied_calls import ProxiedCalls
from evenflow.server.engine.served import ModelTable
from evenflow.server.engine.stats_service import AdminServicer, StatsServicer
from evenflow.server.observability.metrics import collect
from evenflow.server.observability.metrics_app import MetricsApp
from evenflow.server.observability.prometheus import CONTENT_TYPE, render
from evenflow.server.observability.telemetry import NvmlSampler
from evenflow.server.processes.frontend_pool import FrontendPool
from evenflow.server.processes.ipc.frontend_messages import FrontendSettings
from evenflow.server.workers.devices import default_devices, parse_devices

logger = logging.getLogger(__name__)

# A scrape is one short GET: the metrics port allows far less than the REST API's.
METRICS_HEAD_BYTES = 8192
METRICS_CONNECTIONS = 64


def _server_version() -> str:
    try:
        return version("evenflow")
    except PackageNotFoundError:
        return "0+unknown"


class App:
    """One evenflow server process. ``start`` returns once it serves; ``stop`` drains it."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.port = 0
        self.models = ModelTable()
        self.manager: ModelManager | None = None
        self._serving = True
        self._port: ServingPort | None = None  # this process's port (never opened with pools)
        self._frontend: InferenceServicer | None = None
        # (model, status name) -> inference requests answered with that error, wherever the
        # edge that failed them runs (here, or in a front-end process).
        self.failures: Counter[tuple[str, str]] = Counter()
        self._nvml: NvmlSampler | None = None
        self._http: HttpPort | None = None  # the REST API, where this process serves it
        self._metrics: HttpPort | None = None
        self._pool: FrontendPool | None = None  # --frontends N > 1
        self._follower: Any = None  # --workers ray without --devices: follows the cluster
        self.metrics_port = 0
        self.http_port = 0

    async def start(self) -> int:
        config = self.config
        torch.set_num_threads(config.cpu_threads)
        sys.setswitchinterval(config.gil_switch_interval_s)
        follow = config.workers == "ray" and not config.devices
        if follow:  # the devices are the Ray cluster's, as they come and go
            from evenflow.server.workers import ray_cluster, ray_host

            await asyncio.to_thread(ray_host.connect, config.ray_address)
            devices = await asyncio.to_thread(ray_cluster.cluster_devices)
            if not devices:
                raise ValueError("the Ray cluster offers no GPU (nor evenflow_sim resource) "
                                 "to serve on; name --devices, or add nodes")
        else:
            devices = parse_devices(config.devices or default_devices())
        # Set before loading, so that a failed start still closes what it built.
        self.manager = ModelManager(config, self.models, devices, on_health=self._health_changed)
        await self.manager.start()
        if follow:
            self._follower = ray_cluster.ClusterFollower(self.manager)
            self._follower.start()
        if any(d.kind == "cuda" for d in devices):
            self._nvml = NvmlSampler.open()
            if self._nvml is not None:
                self._nvml.start()

        token = load_token(config.auth_token_file)
        tls = tls_files(config.tls_cert, config.tls_key, config.tls_client_ca)
        self._frontend = InferenceServicer(models=self.models, manager=self.manager,
                                           server_name="evenflow",
                                           server_version=_server_version(),
                                           max_tensor_elements=config.max_tensor_elements,
                                           on_failure=self._count_failure)
        self._port = ServingPort(edge=self._frontend)
        if config.frontends > 1:
            self.port = await self._start_frontends()
        else:
            self.port = await self._port.start(
                PortSettings(config.host, config.port, config.max_message_bytes, tls=tls,
                             token=token, auth_groups=tuple(config.auth_groups)),
                services=self._services())
            if config.http_port is not None:
                self._http = HttpPort(RestApi(
                    edge=self._frontend, control=self._proxied_calls(),
                    max_body_bytes=config.max_message_bytes,
                    max_tensor_elements=config.max_tensor_elements, token=token,
                    auth_groups=config.auth_groups, page=devices_page()))
                self.http_port = await self._http.start(
                    HttpSettings(config.host, config.http_port, tls=tls))
        if config.metrics_port is not None:
            self._metrics = HttpPort(MetricsApp(self._render_metrics, CONTENT_TYPE, token=token),
                                     name="metrics")
            self.metrics_port = await self._metrics.start(HttpSettings(
                config.host, config.metrics_port, tls=tls, max_head_bytes=METRICS_HEAD_BYTES,
                max_connections=METRICS_CONNECTIONS, flag="--metrics-port"))
        self._frontend.ready = True
        await self._port.set_health(serving=True)
        return self.port

    def _stats_servicer(self) -> StatsServicer:
        nvml = self._nvml
        return StatsServicer(models=self.models,
                             gpu_samples=lambda: nvml.latest if nvml is not None else [],
                             placement=self._placement_snapshot)

    def _placement_snapshot(self) -> PlacementSnapshot | None:
        return None if self.manager is None else self.manager.placement_snapshot()

    def _services(self) -> list[tuple[Register, object]]:
        """The services besides inference, wherever the port is served."""
        services: list[tuple[Register, object]] = [
            (evenflow_pb2_grpc.add_EvenflowStatsServicer_to_server, self._stats_servicer())]
        if self.config.admin:
            services.append((evenflow_pb2_grpc.add_EvenflowAdminServicer_to_server,
                             AdminServicer(models=self.models)))
        return services

    def _proxied_calls(self) -> ProxiedCalls:
        """Every gRPC method of this process's servicers, run on serialized requests: what a
        front-end process forwards, and what the REST API's non-inference calls run."""
        assert self._frontend is not None
        calls = ProxiedCalls()
        calls.add(grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server,
                  self._frontend)
        for register, servicer in self._services():
            calls.add(register, servicer)
        return calls

    async def _start_frontends(self) -> int:
        """Front-end processes serve the port; this process (the engine) answers them."""
        config = self.config
        calls = self._proxied_calls()
        server_version = _server_version()

        def settings(index: int, engine_address: str, port: int,
                     http_port: int | None) -> FrontendSettings:
            return FrontendSettings.from_config(config, index=index,
                                                engine_address=engine_address, port=port,
                                                http_port=http_port,
                                                server_version=server_version)

        self._pool = FrontendPool(count=config.frontends, settings=settings, models=self.models,
                                  calls=calls, host=config.host, port=config.port,
                                  http_port=config.http_port,
                                  on_failure=self._count_failure)
        self.models.on_change = self._pool.models_changed
        port = await self._pool.start()
        self.http_port = self._pool.http_port or 0
        return port

    def _count_failure(self, model: str, code: str) -> None:
        self.failures[model, code] += 1

    def _health_changed(self) -> None:
        """A replica left or rejoined routing: health is NOT_SERVING while some model has no
        replica in service and none coming (its requests would fail), SERVING again when every
        model has one, or will load one for its next request (``--placement auto``)."""
        if self._port is None or self._port.edge.draining:
            return
        serving = all(model.balancer.routable for model in self.models)
        if serving != self._serving:
            self._serving = serving
            if self._pool is not None:
                self._pool.set_serving(serving)
            logger.warning("health: %s", "SERVING" if serving else "NOT_SERVING")
            self._port.update_health(serving)

    @property
    def frontend_pids(self) -> list[int]:
        """The front-end processes' ids (none when this process serves the port)."""
        return self._pool.pids if self._pool is not None else []

    def _render_metrics(self) -> bytes:
        nvml = self._nvml
        return render(collect(self.models, nvml.latest if nvml is not None else (),
                              self.failures,
                              self._pool.states() if self._pool is not None else (),
                              self._placement_snapshot()))

    async def stop(self, grace_s: float | None = None,
                   abort: asyncio.Event | None = None) -> None:
        """Health NOT_SERVING and new calls refused (UNAVAILABLE) at once; admitted requests
        get up to the grace (or until ``abort`` is set) to finish, then whatever is left fails
        with UNAVAILABLE; then the workers close, the answers are sent, and the port closes
        without a call cancelled (see ``closing``). Idempotent."""
        grace_s = self.config.shutdown_grace_s if grace_s is None else grace_s
        # New inference calls hear UNAVAILABLE from here on: at the front-end processes (if
        # any), and here; health is NOT_SERVING.
        if self._pool is not None:
            await self._pool.drain()
        if self._port is not None:
            await self._port.drain()
        if self._follower is not None:
            await self._follower.close()
            self._follower = None
        if self.manager is not None:
            await self.manager.close(grace_s, abort)
            self.manager = None
        if self._pool is not None:  # every admitted call has its answer; front-ends exit
            await self._pool.stop()
            self._pool = None
        if self._port is not None:  # every admitted call has its answer; now close the port
            await self._port.close()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self.config.workers == "ray":
            from evenflow.server.workers import ray_host

            await asyncio.to_thread(ray_host.disconnect)
        if self._nvml is not None:
            await self._nvml.close()
            self._nvml = None
        if self._metrics is not None:
            await self._metrics.close()
            self._metrics = None


class Startable(Protocol):
    async def start(self) -> int: ...


async def start_unless_stopped(app: Startable, stop: asyncio.Event) -> int | None:
    """``app.start()``, cancelled if ``stop`` is set first; None then. Loading may take
    minutes, longer than an orchestrator waits after its SIGTERM before a SIGKILL, and a
    cancelled start closes what it built (worker processes and Ray actors are stopped; a
    factory already running in a thread finishes first)."""
    starting = asyncio.create_task(app.start(), name="app:start")
    stopped = asyncio.create_task(stop.wait(), name="app:stop-signal")
    try:
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not starting.done():
            starting.cancel()
        await asyncio.wait({starting, stopped})
    return None if starting.cancelled() else starting.result()


async def serve(config: ServerConfig) -> None:
    """Run until SIGINT/SIGTERM, then drain and return. A second signal ends the grace: what
    is still running fails with UNAVAILABLE and the process exits."""
    if note := config.unused_placement_note():
        logger.warning("configuration: %s", note)
    app = App(config)
    stop = asyncio.Event()
    abort = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            logger.warning("second signal: failing what is left with UNAVAILABLE")
            abort.set()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        port = await start_unless_stopped(app, stop)
        if port is None:
            logger.info("signal received while starting: stopping")
            return
        # Everything built so far (torch, the models, gRPC) lives as long as the process; move
        # it out of the collector's reach, or each full collection walks all of it while the
        # loop waits: full collections at start-up took 15-95 ms here (sim model); one while
        # serving, after the freeze, 0.4 ms.
        gc.collect()
        gc.freeze()
        host = f"[{config.host}]" if ":" in config.host else config.host
        if config.metrics_port is not None:
            print(f"evenflow metrics on http://{host}:{app.metrics_port}/metrics", flush=True)
        if app.http_port:
            print(f"evenflow http on http://{host}:{app.http_port}", flush=True)
        print(f"evenflow listening on {config.host}:{port}", flush=True)
        await stop.wait()
        logger.info("signal received: draining")
    finally:
        await app.stop(abort=abort)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
