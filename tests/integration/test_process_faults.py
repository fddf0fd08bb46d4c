"""Faults stay local (``--workers process``, ``--frontends N``): a worker process killed or hung
under load, a front-end process killed under load. Each test counts that every request sent
got exactly one answer and that successes resume; load is paced by the requests themselves."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import urllib.request

import grpc
import pytest

from evenflow.balancer import BalancerConfig
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.engine.app import App
from evenflow.server.workers.process_host import ProcessWorker
from tests.integration.inprocess import running_app
from tests.integration.load import FAST, Load

# slow: kills and hangs worker and front-end processes under load.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

def _read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _workers(app: App) -> list[ProcessWorker]:
    replicas = app.models.get("sim").balancer.replicas  # type: ignore[union-attr]
    return [r.worker for r in replicas]  # type: ignore[misc]


@pytest.mark.timing  # serves again within 5 s of the kill: a process start, torch import included
async def test_a_killed_worker_process_loses_no_request_and_serves_again() -> None:
    async with running_app((("sim", "sim"),), devices="sim:1,sim:1", sim_profile=FAST,
                           workers="process", frontends=1) as (app, url):
        replica = app.models.get("sim").balancer.replicas[0]  # type: ignore[union-attr]
        worker = _workers(app)[0]
        old_pid = worker.pid
        assert old_pid is not None
        async with Load(url, 8) as load:
            await load.until(lambda: sum(load.ok.values()) >= 50, 20)
            os.kill(old_pid, signal.SIGKILL)
            batches: list[int] = []

            def back() -> bool:  # restarted, in routing, and running batches again
                if not (replica.healthy and replica.restarts and worker.pid != old_pid):
                    return False
                batches.append(replica.stats.num_batches)
                return batches[-1] > batches[0] + 3

            await load.until(back, 20)
        assert load.answered()
        assert sum(load.failed.values()) == 0, load.failed


async def test_a_hung_worker_process_is_killed_by_the_watchdog_and_replaced() -> None:
    config = BalancerConfig(max_wait_s=0.0, max_queue_delay_s=math.inf, watchdog_s=1.0)
    async with running_app((("sim", "sim"),), devices="sim:1,sim:1", sim_profile=FAST,
                           balancer=config, workers="process", frontends=1) as (app, url):
        replica = app.models.get("sim").balancer.replicas[0]  # type: ignore[union-attr]
        worker = _workers(app)[0]
        old_pid = worker.pid
        async with Load(url, 4) as load:
            await load.until(lambda: sum(load.ok.values()) >= 20, 20)
            await worker.set_device_fault("sim0", "hang", 1)
            ok_before = replica.stats.num_batches
            await load.until(lambda: replica.restarts >= 1 and replica.healthy
                             and replica.stats.num_batches > ok_before + 3, 30)
        assert worker.pid != old_pid  # the hung process was killed, not left behind
        assert load.answered()
        assert sum(load.failed.values()) == 0, load.failed


async def _frontend_of(channel: grpc.aio.Channel) -> str:
    call = pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest())
    await call
    metadata = dict(await call.trailing_metadata() or ())
    return str(metadata["evenflow-process"])


async def test_a_killed_frontend_fails_only_its_own_calls_and_is_restarted() -> None:
    async with running_app((("sim", "sim"),), devices="sim:1,sim:1", sim_profile=FAST,
                           frontends=2, workers="thread", metrics_port=0) as (app, url):
        old_pids = set(app.frontend_pids)
        async with Load(url, 12) as load:
            await load.until(lambda: all(load.ok[i] >= 2 for i in range(12)), 20)
            homes = [await _frontend_of(channel) for channel in load.channels]
            if len(set(homes)) < 2:
                pytest.skip(f"the kernel put all 12 connections on one front-end: {homes}")
            victim = homes[0]
            victim_pid = int(victim.rsplit(" ", 1)[1])
            ok_at_kill = dict(load.ok)
            os.kill(victim_pid, signal.SIGKILL)

            def resumed() -> bool:  # a new front-end process, and every client served again
                return len(set(app.frontend_pids) - old_pids) == 1 and \
                    all(load.ok[i] >= ok_at_kill.get(i, 0) + 3 for i in range(12))

            await load.until(resumed, 30)
        assert load.answered()
        for index, home in enumerate(homes):
            if home == victim:
                # Its calls to the dead process only: the one in flight, and at most one more
                # sent before the client saw the connection drop (a "Broken pipe" on send).
                assert load.failed[index] <= 2, (index, load.errors)
            else:
                assert load.failed[index] == 0, (index, home, load.errors)
        assert {code for _, code, _ in load.errors} <= {"UNAVAILABLE"}, load.errors
        metrics = await asyncio.to_thread(_read, f"http://127.0.0.1:{app.metrics_port}/metrics")
        assert "evenflow_frontend_restarts_total" in metrics
        restarted = [line for line in metrics.splitlines()
                     if line.startswith("evenflow_frontend_restarts_total{")]
        assert sorted(line.rsplit(" ", 1)[1] for line in restarted) == ["0.0", "1.0"], restarted
