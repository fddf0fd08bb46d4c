"""The steady scenario's SLO goodput through a real server, beside the virtual-time figure.

A server on ``sim:1,sim:1,sim:0.5,sim:0.25`` (least-work, the server's default admission, its
latency target set to the SLO) is searched by ``evenflow loadtest --slo-ms`` over gRPC. The
virtual-time search of the same scenario runs again with a per-request transport time added to
every latency (the gRPC round trip and decode that the virtual run does not have), and with
none; the report gives both ratios.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import evenflow_argv, start
from benchmarks.slo_scenarios import SCENARIOS, Window, probe
from benchmarks.virtual_time import VirtualLoop
from evenflow.balancer import BalancerConfig
from evenflow.loadtest.slo_search import Probe, SearchSettings, search_goodput

DEVICES = "sim:1,sim:1,sim:0.5,sim:0.25"
TRANSPORT_S = 0.002  # client latency minus server latency under this load, measured here


def virtual_goodput(slo_s: float, window: Window) -> float:
    steady = SCENARIOS[0]
    config = BalancerConfig(latency_target_s=slo_s, max_queued_requests=100_000)

    async def measure(rate_per_s: float, seed: int) -> Probe:
        return await probe(steady, config, rate_per_s, seed, window)

    loop = VirtualLoop()
    try:
        return loop.run_until_complete(search_goodput(
            measure, SearchSettings(slo_s=slo_s, start_per_s=0.5 * steady.limit_per_s(slo_s))
        )).goodput_per_s
    finally:
        loop.close()


def real_goodput(slo_s: float, out: Path, start_per_s: float) -> dict[str, float]:
    server = start(evenflow_argv("--model", "sim", "--devices", DEVICES, "--latency-target-ms",
                                 f"{slo_s * 1e3:g}", time_admission=True), out / "server.log")
    try:
        run = subprocess.run(
            [sys.executable, "-m", "evenflow.server.cli", "loadtest", "--url", server.url,
             "--model", "sim", "--slo-ms", f"{slo_s * 1e3:g}", "--start-rate",
             f"{start_per_s:.0f}", "--duration-s", "5", "--warmup-s", "1", "--out",
             str(out / "real_time")], check=True, capture_output=True, text=True, timeout=900)
    finally:
        server.stop()
    print(run.stdout.strip().splitlines()[-2])
    found = json.loads((out / "real_time" / "results.json").read_text())["slo_search"]
    return {key: float(found[key]) for key in ("goodput_per_s", "low_per_s", "high_per_s")}


def compare_real_time(slo_s: float, out: Path) -> dict[str, object]:
    """The real server's SLO goodput beside the virtual-time searches (module docstring)."""
    window = Window(warmup_s=1.0, measured_s=5.0)
    alone = virtual_goodput(slo_s, window)
    with_transport = virtual_goodput(slo_s, Window(1.0, 5.0, TRANSPORT_S))
    real = real_goodput(slo_s, out, with_transport)
    measured = real["goodput_per_s"]
    summary = (f"steady, SLO {slo_s * 1e3:g} ms, least-work: real server {measured:.0f} req/s "
               f"(range {real['low_per_s']:.0f}-{real['high_per_s']:.0f}); "
               f"virtual time {alone:.0f} req/s (real/virtual {measured / alone:.2f}), with "
               f"{TRANSPORT_S * 1e3:g} ms of transport per request {with_transport:.0f} req/s "
               f"(real/virtual {measured / with_transport:.2f})")
    print(summary)
    return {"summary": summary, "real": real, "virtual_per_s": alone,
            "virtual_with_transport_per_s": with_transport}

