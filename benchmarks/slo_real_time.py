"""The steady scenario's SLO goodput through a real server, beside the virtual-time figure.

A server on ``sim:1,sim:1,sim:0.5,sim:0.25`` (least-work, the server's default admission, its
latency target set to the SLO) is first measured at 70 % of the computed limit, for what it adds
that simulated devices do not have: per request, the client's mean latency minus the server's
own (the gRPC round trip and codec); per batch, the speed-1 devices' fitted fixed cost minus the
sim model's 10 ms (hand-offs to the worker thread and back). Then ``evenflow loadtest --slo-ms``
searches it over gRPC. The virtual-time search of the same scenario runs twice: on the bare
devices, and with those two measured overheads added; the report gives both ratios.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path

import grpc

from benchmarks.harness import evenflow_argv, start
from benchmarks.slo_scenarios import SCENARIOS, Window, probe
from benchmarks.virtual_time import VirtualLoop
from evenflow.balancer import BalancerConfig
from evenflow.loadtest.slo_search import Probe, SearchSettings, search_goodput
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc

DEVICES = "sim:1,sim:1,sim:0.5,sim:0.25"
FULL_SPEED = ("sim0", "sim1")


def virtual_goodput(slo_s: float, window: Window) -> float:
    steady = SCENARIOS[0]
    config = BalancerConfig(latency_target_s=slo_s, slo_s=slo_s, max_queued_requests=100_000)

    async def measure(rate_per_s: float, seed: int) -> Probe:
        return await probe(steady, config, rate_per_s, seed, window)

    loop = VirtualLoop()
    try:
        return loop.run_until_complete(search_goodput(
            measure, SearchSettings(slo_s=slo_s, start_per_s=0.5 * steady.limit_per_s(slo_s))
        )).goodput_per_s
    finally:
        loop.close()


def _loadtest(url: str, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "evenflow.server.config.cli", "loadtest", "--url", url,
                    "--model", "sim", "--duration-s", "5", "--warmup-s", "1", *args],
                   check=True, capture_output=True, text=True, timeout=900)


async def _fitted_base_s(url: str) -> float:
    async with grpc.aio.insecure_channel(url) as channel:
        stats = await ef_grpc.EvenflowStatsStub(channel).GetStats(ef.GetStatsRequest())
    return statistics.mean(replica.fit_base_s for model in stats.models
                           for replica in model.replicas
                           if any(device in FULL_SPEED for device in replica.devices))


def measure_real(slo_s: float, out: Path) -> tuple[dict[str, float], Window]:
    """The real server's SLO goodput, and its measured overheads as a virtual-time window."""
    steady = SCENARIOS[0]
    server = start(evenflow_argv("--model", "sim", "--devices", DEVICES, "--slo-ms",
                                 f"{slo_s * 1e3:g}", time_admission=True), out / "server.log")
    try:
        _loadtest(server.url, "--rate", f"{0.7 * steady.limit_per_s(slo_s):.0f}", "--out",
                  str(out / "real_overheads"))
        point = json.loads((out / "real_overheads" / "results.json").read_text())["points"][0]
        transport_s = (point["latency_ms"]["mean"]
                       - point["server"]["breakdown_ms"]["success"]) / 1e3
        overhead_s = asyncio.run(_fitted_base_s(server.url)) - steady.base_s
        _loadtest(server.url, "--slo-ms", f"{slo_s * 1e3:g}", "--start-rate",
                  f"{0.75 * steady.limit_per_s(slo_s):.0f}", "--out", str(out / "real_time"))
    finally:
        server.stop()
    found = json.loads((out / "real_time" / "results.json").read_text())["slo_search"]
    real = {key: float(found[key]) for key in ("goodput_per_s", "low_per_s", "high_per_s")}
    return real, Window(warmup_s=1.0, measured_s=5.0, transport_s=max(0.0, transport_s),
                        batch_overhead_s=max(0.0, overhead_s))


def compare_real_time(slo_s: float, out: Path) -> dict[str, object]:
    """The real server's SLO goodput beside the virtual-time searches (module docstring)."""
    real, measured = measure_real(slo_s, out)
    bare = virtual_goodput(slo_s, Window(warmup_s=1.0, measured_s=5.0))
    calibrated = virtual_goodput(slo_s, measured)
    goodput = real["goodput_per_s"]
    summary = (f"steady, SLO {slo_s * 1e3:g} ms, least-work: real server {goodput:.0f} req/s "
               f"(range {real['low_per_s']:.0f}-{real['high_per_s']:.0f}); virtual time "
               f"{bare:.0f} req/s (real / virtual {goodput / bare:.2f}); virtual time with the "
               f"real server's measured overheads ({measured.transport_s * 1e3:.1f} ms per "
               f"request outside the server, {measured.batch_overhead_s * 1e3:.2f} ms per batch) "
               f"{calibrated:.0f} req/s (real / virtual {goodput / calibrated:.2f})")
    print(summary)
    return {"summary": summary, "real": real, "virtual_per_s": bare,
            "virtual_with_overheads_per_s": calibrated,
            "transport_s": measured.transport_s, "batch_overhead_s": measured.batch_overhead_s}
