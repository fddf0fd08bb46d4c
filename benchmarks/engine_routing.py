"""How many one-sample requests the engine alone can route on one core.

    python -m benchmarks.engine_routing [--seconds 5] [--window 256]

The engine (balancer, a free model on two ``sim`` devices in worker processes) runs in a
process whose main thread is pinned to CPU 0; a stub front-end in this process, pinned to CPU 1,
replays pre-encoded ``Infer`` messages over the engine's ZeroMQ socket, keeping ``--window``
requests in flight. It reports the engine process's CPU microseconds per answered request
(every thread of it: loop, ZeroMQ's I/O thread) and so the rate one core of engine could route;
the achieved rate is bounded by whatever else shares this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import uvloop
import zmq
import zmq.asyncio

from benchmarks.harness import REPO, wait_for_line, write_json
from evenflow.server.processes.ipc import arrays
from evenflow.server.processes.ipc import frontend_messages as msg


@dataclass(frozen=True, slots=True)
class RoutingResult:
    answered_per_s: float
    engine_cpu_us_per_request: float
    refused_per_s: float

    @property
    def one_core_per_s(self) -> float:
        return 1e6 / self.engine_cpu_us_per_request


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _engine(address: str) -> None:
    from evenflow.balancer import BalancerConfig
    from evenflow.server.config.server_config import ServerConfig
    from evenflow.server.engine.model_control import ModelManager
    from evenflow.server.engine.proxied_calls import ProxiedCalls
    from evenflow.server.engine.served import ModelTable
    from evenflow.server.models.repository import BuiltinOptions
    from evenflow.server.models.spec import SimProfile
    from evenflow.server.processes.frontend_pool import FrontendPool
    from evenflow.server.workers.devices import parse_devices

    config = ServerConfig(models=(("m", "sim"),), devices="sim:1,sim:1", workers="process",
                          builtins=BuiltinOptions(sim_profile=SimProfile(0.0, 0.0)),
                          balancer=BalancerConfig(max_wait_s=0.0), log_level="WARNING")
    table = ModelTable()
    manager = ModelManager(config, table, parse_devices(config.devices or ""))
    await manager.start()
    os.sched_setaffinity(0, {0})  # this thread only: the workers started unpinned
    pool = FrontendPool(count=1, settings=lambda *_: None,  # type: ignore[arg-type,return-value]
                        models=table, calls=ProxiedCalls(), host="127.0.0.1", port=0)
    pool.bind(address)
    print("engine ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await pool.stop()
    await manager.close(5.0)


async def _stub(address: str, engine_pid: int, seconds: float, window: int) -> RoutingResult:
    os.sched_setaffinity(0, {1 % os.cpu_count()})  # type: ignore[operator]
    socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(address)
    await socket.send_multipart([msg.encoder.encode(msg.Hello(0, os.getpid(),
                                                              listening=False))])
    msg.to_frontend.decode((await socket.recv_multipart())[0])  # the models
    metas: list[arrays.ArrayMeta] = []
    frames: list[object] = []
    arrays.pack([np.ones((1, 256), np.float32)], metas, frames)
    payload = [bytes(frame) for frame in frames]  # type: ignore[call-overload]
    ids = 4 * window
    headers = [msg.encoder.encode(msg.Infer(id=i, model="m", version="", num_samples=1,
                                            deadline_s=float("inf"), priority=0, arrays=metas))
               for i in range(ids)]
    sent = answered = refused = 0

    async def send(n: int) -> None:
        nonlocal sent
        for _ in range(n):
            await socket.send_multipart([headers[sent % ids], *payload], copy=False)
            sent += 1

    def replies(parts: list[bytes]) -> list[msg.ToFrontend]:
        header = msg.to_frontend.decode(parts[0])
        if not isinstance(header, msg.Bundle):
            return [header]
        starts = [1 + sum(header.parts[:i]) for i in range(len(header.parts))]
        return [msg.to_frontend.decode(parts[start]) for start in starts]

    await send(window)
    warm = 0
    while warm < window * 4:
        got = replies(await socket.recv_multipart())
        warm += len(got)
        await send(len(got))
    cpu_before_s, started_s = _cpu_s(engine_pid), time.monotonic()
    while time.monotonic() - started_s < seconds:
        got = replies(await socket.recv_multipart())
        answered += sum(isinstance(r, msg.Answer) for r in got)
        refused += sum(isinstance(r, msg.Refused) for r in got)
        await send(len(got))
    elapsed_s = time.monotonic() - started_s
    cpu_s = _cpu_s(engine_pid) - cpu_before_s
    socket.close()
    return RoutingResult(answered / elapsed_s, cpu_s / max(1, answered) * 1e6,
                         refused / elapsed_s)


def measure(seconds: float, window: int) -> RoutingResult:
    address = f"ipc://@evenflow-bench-{uuid.uuid4().hex}"
    engine = subprocess.Popen([sys.executable, "-m", "benchmarks.engine_routing", "--engine",
                               address], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=REPO)
    try:
        line, _ = wait_for_line(engine, "engine ready", 120)
        if line is None:
            raise RuntimeError("the engine did not start")
        return uvloop.run(_stub(address, engine.pid, seconds, window))
    finally:
        assert engine.stdin is not None
        engine.stdin.close()
        engine.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--engine", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        uvloop.run(_engine(args.engine))
        return
    result = measure(args.seconds, args.window)
    print(f"engine: {result.engine_cpu_us_per_request:.1f} us CPU per request -> "
          f"{result.one_core_per_s:,.0f} requests/s on one core "
          f"(achieved here {result.answered_per_s:,.0f}/s, refused {result.refused_per_s:,.0f}/s)")
    write_json(REPO / ".bench" / "engine_routing.json",
               {"answered_per_s": result.answered_per_s,
                "engine_cpu_us_per_request": result.engine_cpu_us_per_request})


if __name__ == "__main__":
    main()
