"""Where a model's workers run: threads of this process (``thread``), one process per replica
(``process``) or one Ray actor per replica (``ray``). Either way the balancer drives them
through the same ``Worker`` seam; ``build_workers`` picks the host.

The hosts import what they share from ``worker_spec``, ``hosted`` and ``thread_host``, never
this module, so nothing imports back into the dispatcher."""

from __future__ import annotations

import asyncio

from evenflow.balancer import Worker
from evenflow.server.config.server_config import WORKER_HOSTS, ServerConfig
from evenflow.server.models.spec import ModelDefinition
from evenflow.server.workers.ray_resources import RayPlacement
from evenflow.server.workers.thread_host import build_thread_worker
from evenflow.server.workers.worker_spec import WorkerSpec


async def build_workers(specs: list[WorkerSpec], definition: ModelDefinition,
                        host: str, ray_address: str = "local",
                        ray_placement: RayPlacement | None = None) -> list[Worker]:
    """Every replica's worker on ``host``; on failure, what was built is closed again.
    ``ray_placement``: with ``host="ray"``, how actors are placed (default: one replica per
    GPU, the default placement timeout)."""
    if host not in WORKER_HOSTS:
        raise ValueError(f"unknown worker host {host!r}: one of {WORKER_HOSTS}")
    workers: list[Worker] = []
    try:
        if host == "thread":
            for spec in specs:
                workers.append(await asyncio.to_thread(build_thread_worker, spec, definition))
        elif host == "process":
            # Imported on use: a server with thread workers never loads ZeroMQ's host.
            from evenflow.server.workers.process_host import ProcessWorker

            processes = [ProcessWorker(spec) for spec in specs]
            workers.extend(processes)
            await asyncio.gather(*(p.start() for p in processes))
        else:
            try:
                from evenflow.server.workers import ray_host
            except ImportError as exc:
                raise ValueError("--workers ray needs Ray: pip install 'evenflow[ray]'") \
                    from exc
            await asyncio.to_thread(ray_host.connect, ray_address)
            placement = ray_placement or RayPlacement(ServerConfig().ray_placement_timeout_s)
            actors = [ray_host.RayWorker(spec, placement) for spec in specs]
            workers.extend(actors)
            await asyncio.gather(*(a.start() for a in actors))
    except BaseException:
        await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)
        raise
    return workers
