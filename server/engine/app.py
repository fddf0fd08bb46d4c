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
from pathlib import Path
from typing import Any

import grpc
import torch
from grpc_health.v1 import health, health_pb2

from evenflow.proto import (
    evenflow_pb2,
    evenflow_pb2_grpc,
    grpc_service_pb2,
    grpc_service_pb2_grpc,
)
from evenflow.server.config.server_config import ServerConfig
from evenflow.server.edge.closing import close_port
from evenflow.server.edge.security import TlsFiles, TokenInterceptor, load_token
from evenflow.server.edge.servicer import (
    GenericOnly,
    add_inference_service,
    add_support_services,
)
from evenflow.server.engine.kserve_servicer import InferenceServicer
from evenflow.server.engine.model_control import ModelManager
from evenflow.server.engine.proxied_calls import ProxiedCalls
from evenflow.server.engine.served import ModelTable
from evenflow.server.engine.stats_service import AdminServicer, StatsServicer
from evenflow.server.observability.metrics import collect
from evenflow.server.observability.metrics_http import MetricsEndpoint
from evenflow.server.observability.prometheus import CONTENT_TYPE, render
from evenflow.server.observability.telemetry import NvmlSampler
from evenflow.server.processes.frontend_pool import FrontendPool, FrontendSettings
from evenflow.server.workers.devices import default_devices, parse_devices

logger = logging.getLogger(__name__)

# Once the models are closed, how long the edge waits for gRPC to send the answers the
# handlers already have, and then how long gRPC's stop waits for calls still running.
_ANSWER_S = 5.0

_INFERENCE_SERVICE = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def _text(path: Path | None) -> str | None:
    return str(path) if path is not None else None


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
        self._health_updates: set[asyncio.Task[None]] = set()
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._frontend: InferenceServicer | None = None
        self._nvml: NvmlSampler | None = None
        self._metrics: MetricsEndpoint | None = None
        self._pool: FrontendPool | None = None  # --frontends N > 1
        self._follower: Any = None  # --workers ray without --devices: follows the cluster
        self.metrics_port = 0

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
        tls = self._tls()
        self._frontend = InferenceServicer(models=self.models, manager=self.manager,
                                           server_name="evenflow",
                                           server_version=_server_version(),
                                           max_tensor_elements=config.max_tensor_elements)
        if config.frontends > 1:
            self.port = await self._start_frontends()
        else:
            self.port = await self._start_grpc(token, tls)
        if config.metrics_port is not None:
            self._metrics = MetricsEndpoint(self._render_metrics, CONTENT_TYPE,
                                            ssl_context=tls.ssl_context() if tls else None,
                                            token=token)
            self.metrics_port = await self._metrics.start(config.host, config.metrics_port)
        self._frontend.ready = True
        for service in ("", _INFERENCE_SERVICE.full_name):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    def _stats_servicer(self) -> StatsServicer:
        nvml = self._nvml
        return StatsServicer(models=self.models,
                             gpu_samples=lambda: nvml.latest if nvml is not None else [])

    async def _start_grpc(self, token: str | None, tls: TlsFiles | None) -> int:
        """This process serves the port itself."""
        config = self.config
        assert self._frontend is not None
        options = [("grpc.max_receive_message_length", config.max_message_bytes),
                   ("grpc.max_send_message_length", config.max_message_bytes),
                   ("grpc.so_reuseport", 0)]
        interceptors = [TokenInterceptor(token, config.auth_groups)] if token else []
        server = grpc.aio.server(options=options, interceptors=interceptors)
        add_inference_service(self._frontend, server)
        cold = GenericOnly(server)
        evenflow_pb2_grpc.add_EvenflowStatsServicer_to_server(self._stats_servicer(), cold)
        services = [_INFERENCE_SERVICE.full_name,
                    evenflow_pb2.DESCRIPTOR.services_by_name["EvenflowStats"].full_name,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name]
        if config.admin:
            evenflow_pb2_grpc.add_EvenflowAdminServicer_to_server(
                AdminServicer(models=self.models), cold)
            services.append(evenflow_pb2.DESCRIPTOR.services_by_name["EvenflowAdmin"].full_name)
        add_support_services(server, self._health, services)
        host = f"[{config.host}]" if ":" in config.host else config.host
        address = f"{host}:{config.port}"
        port = (server.add_secure_port(address, tls.server_credentials()) if tls
                else server.add_insecure_port(address))
        if port == 0:
            raise OSError(f"could not bind {host}:{config.port}")
        await server.start()
        self._server = server
        return port

    async def _start_frontends(self) -> int:
        """Front-end processes serve the port; this process (the engine) answers them."""
        config = self.config
        assert self._frontend is not None
        calls = ProxiedCalls()
        calls.add(grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server,
                  self._frontend)
        calls.add(evenflow_pb2_grpc.add_EvenflowStatsServicer_to_server, self._stats_servicer())
        if config.admin:
            calls.add(evenflow_pb2_grpc.add_EvenflowAdminServicer_to_server,
                      AdminServicer(models=self.models))

        def settings(index: int, engine_address: str, port: int) -> FrontendSettings:
            return FrontendSettings(
                index=index, engine_address=engine_address, host=config.host, port=port,
                max_message_bytes=config.max_message_bytes,
                max_tensor_elements=config.max_tensor_elements,
                server_version=_server_version(), admin=config.admin,
                tls_cert=_text(config.tls_cert), tls_key=_text(config.tls_key),
                tls_client_ca=_text(config.tls_client_ca),
                auth_token_file=_text(config.auth_token_file),
                auth_groups=tuple(config.auth_groups), log_level=config.log_level,
                log_format=config.log_format,
                gil_switch_interval_s=config.gil_switch_interval_s)

        self._pool = FrontendPool(count=config.frontends, settings=settings, models=self.models,
                                  calls=calls, host=config.host, port=config.port)
        self.models.on_change = self._pool.models_changed
        return await self._pool.start()

    def _health_changed(self) -> None:
        """A replica left or rejoined routing: health is NOT_SERVING while some model has no
        replica in service (its requests would fail), SERVING again when every model has one."""
        if self._frontend is None or self._frontend.draining:
            return
        serving = all(model.balancer.serving for model in self.models)
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        if serving != self._serving:
            self._serving = serving
            if self._pool is not None:
                self._pool.set_serving(serving)
            logger.warning("health: %s", "SERVING" if serving else "NOT_SERVING")
            task = asyncio.create_task(self._set_health(status))
            self._health_updates.add(task)
            task.add_done_callback(self._health_updates.discard)

    async def _set_health(self, status: int) -> None:
        for service in ("", _INFERENCE_SERVICE.full_name):
            await self._health.set(service, status)

    def _tls(self) -> TlsFiles | None:
        config = self.config
        if config.tls_cert is None or config.tls_key is None:
            return None
        return TlsFiles(config.tls_cert, config.tls_key, config.tls_client_ca)

    @property
    def frontend_pids(self) -> list[int]:
        """The front-end processes' ids (none when this process serves the port)."""
        return self._pool.pids if self._pool is not None else []

    def _render_metrics(self) -> bytes:
        nvml = self._nvml
        failures: Counter[tuple[str, str]] = Counter()
        if self._frontend is not None:
            failures.update(self._frontend.failures)
        if self._pool is not None:
            failures.update(self._pool.failures)
        return render(collect(self.models, nvml.latest if nvml is not None else (), failures,
                              self._pool.states() if self._pool is not None else ()))

    async def stop(self, grace_s: float | None = None,
                   abort: asyncio.Event | None = None) -> None:
        """Health NOT_SERVING and new calls refused (UNAVAILABLE) at once; admitted requests
        get up to the grace (or until ``abort`` is set) to finish, then whatever is left fails
        with UNAVAILABLE; then the workers close, the answers are sent, and the port closes
        without a call cancelled (see ``closing``). Idempotent."""
        grace_s = self.config.shutdown_grace_s if grace_s is None else grace_s
        if self._frontend is not None:  # new inference calls hear UNAVAILABLE from here on
            self._frontend.drain()
        if self._pool is not None:  # and at the front-end processes, first thing
            await self._pool.drain()
        await asyncio.gather(*self._health_updates)
        await self._health.enter_graceful_shutdown()
        if self._follower is not None:
            await self._follower.close()
            self._follower = None
        if self.manager is not None:
            await self.manager.close(grace_s, abort)
            self.manager = None
        if self._pool is not None:  # every admitted call has its answer; front-ends exit
            await self._pool.stop()
            self._pool = None
        if self._server is not None:  # every admitted call has its answer; now close the port
            await self._close_server(self._server)
            self._server = None
        if self.config.workers == "ray":
            from evenflow.server.workers import ray_host

            await asyncio.to_thread(ray_host.disconnect)
        if self._nvml is not None:
            await self._nvml.close()
            self._nvml = None
        if self._metrics is not None:
            await self._metrics.close()
            self._metrics = None

    async def _close_server(self, server: grpc.aio.Server) -> None:
        """Once the answers are on the wire, no call may reach gRPC's stop: clients still
        sending hear UNAVAILABLE from their closed connection instead of CANCELLED."""
        if self._frontend is not None:
            unsent = await self._frontend.answered(_ANSWER_S)
            if unsent:
                logger.warning("%d calls not answered within %.1f s; closing the port",
                               unsent, _ANSWER_S)
        closed = close_port(self.port)
        logger.info("port %d closed: %d listeners, %d client connections", self.port,
                    closed.listeners, closed.connections)
        await server.stop(_ANSWER_S)


async def serve(config: ServerConfig) -> None:
    """Run until SIGINT/SIGTERM, then drain and return. A second signal ends the grace: what
    is still running fails with UNAVAILABLE and the process exits."""
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
        port = await app.start()
        # Everything built so far (torch, the models, gRPC) lives as long as the process; move
        # it out of the collector's reach, or each full collection walks all of it while the
        # loop waits: full collections at start-up took 15-95 ms here (sim model); one while
        # serving, after the freeze, 0.4 ms.
        gc.collect()
        gc.freeze()
        if config.metrics_port is not None:
            host = f"[{config.host}]" if ":" in config.host else config.host
            print(f"evenflow metrics on http://{host}:{app.metrics_port}/metrics", flush=True)
        print(f"evenflow listening on {config.host}:{port}", flush=True)
        await stop.wait()
        logger.info("signal received: draining")
    finally:
        await app.stop(abort=abort)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
