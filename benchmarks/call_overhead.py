"""What one call costs outside the server, one call at a time: evenflow against bare
grpc.aio+uvloop echo servers that answer after the same delay.

    python -m benchmarks.call_overhead [--delay-ms 12] [--calls 400] [--warmup-calls 50]
                                       [--repeats 3]

One ``AsyncClient`` (the SDK, no retries) sends 1-sample requests in a closed loop of one, so no
request ever waits for another. Four servers, started once and measured in turn (A B C D A B C
D):

- ``echo``: ``benchmarks.echo_server`` answering in the handler's first step (delay 0);
- ``echo+timer``: the same, answering ``--delay-ms`` later by a timer on its event loop;
- ``echo+thread``: answering once a worker thread has slept ``--delay-ms`` (a model's compute
  off the event loop, as evenflow's thread workers run it);
- ``evenflow``: ``evenflow serve`` with the ``sim`` model costing ``--delay-ms`` per batch on one
  ``sim:1`` device.

"outside" is the client's mean call time minus the time the server spent on the call: the delay
for an echo, the mean success time of ModelStatistics (admission to answer) for evenflow. It is
the cost of the transport, both event loops and waking from the idle wait; for ``echo`` it is
the whole call. Medians over ``--repeats`` with min..max; the JSON goes to
.bench/call_overhead.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np
import uvloop

from benchmarks.harness import REPO, Server, evenflow_argv, median, start, write_json
from evenflow.client import AsyncClient
from evenflow.loadtest.percentiles import percentile
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

MODEL = "mlp"  # the echo servers' model; evenflow serves the sim model under this name
SAMPLE = {"x": np.ones((1, 256), np.float32)}


@dataclass(frozen=True)
class Calls:
    """One server's calls, one at a time: the client's times and the server's share."""

    mean_ms: float
    p50_ms: float
    p99_ms: float
    server_ms: float  # the server's time per call: its delay, or its success time

    @property
    def outside_ms(self) -> float:
        return self.mean_ms - self.server_ms


async def success_s(url: str) -> tuple[int, float]:
    """Requests answered and their summed success time (admission to answer), server-wide."""
    async with grpc.aio.insecure_channel(url) as channel:
        stats = await pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            pb.ModelStatisticsRequest())
    successes = [model.inference_stats.success for model in stats.model_stats]
    return sum(s.count for s in successes), sum(s.ns for s in successes) / 1e9


async def one_at_a_time(url: str, calls: int, warmup_calls: int,
                        delay_s: float | None) -> Calls:
    """``calls`` sequential calls after ``warmup_calls``. With ``delay_s`` None the server's
    time is read from its statistics (evenflow), otherwise it is ``delay_s`` (an echo)."""
    times_s: list[float] = []
    async with AsyncClient(url, retries=0) as client:
        for _ in range(warmup_calls):
            await client.infer(MODEL, SAMPLE)
        before = await success_s(url) if delay_s is None else (0, 0.0)
        for _ in range(calls):
            started_s = time.perf_counter()
            await client.infer(MODEL, SAMPLE)
            times_s.append(time.perf_counter() - started_s)
        if delay_s is None:
            after = await success_s(url)
            answered = after[0] - before[0]
            if answered != calls:
                raise RuntimeError(f"the server counted {answered} successes for {calls} calls")
            server_s = (after[1] - before[1]) / answered
        else:
            server_s = delay_s
    times_ms = [t * 1e3 for t in times_s]
    return Calls(statistics.fmean(times_ms), statistics.median(times_ms),
                 percentile(times_ms, 0.99), server_s * 1e3)


def _servers(delay_ms: float, out: Path) -> dict[str, tuple[Server, float | None]]:
    """Each server, with the time it spends on a call where that is known beforehand."""
    echo = [sys.executable, "-m", "benchmarks.echo_server", "--port", "0"]
    delay = ("--delay-ms", str(delay_ms))
    servers: dict[str, tuple[Server, float | None]] = {}
    try:
        servers["echo"] = start(echo, out / "echo.log"), 0.0
        servers["echo+timer"] = start([*echo, *delay], out / "echo_timer.log"), delay_ms / 1e3
        servers["echo+thread"] = (start([*echo, "--defer", "thread", *delay],
                                        out / "echo_thread.log"), delay_ms / 1e3)
        servers["evenflow"] = start(evenflow_argv(
            "--model", f"{MODEL}=sim", "--devices", "sim:1", "--sim-base-ms", str(delay_ms),
            "--sim-per-sample-ms", "0"), out / "evenflow.log"), None
    except BaseException:
        for server, _ in servers.values():
            server.stop()
        raise
    return servers


def run(delay_ms: float, calls: int, warmup_calls: int, repeats: int,
        out: Path) -> dict[str, list[Calls]]:
    servers = _servers(delay_ms, out)
    runs: dict[str, list[Calls]] = {name: [] for name in servers}
    try:
        for _ in range(repeats):
            for name, (server, delay_s) in servers.items():
                runs[name].append(uvloop.run(one_at_a_time(server.url, calls, warmup_calls,
                                                           delay_s)))
    finally:
        for server, _ in servers.values():
            server.stop()
    return runs


def _spread(values: list[float]) -> str:
    return f"{median(values):6.2f} ({min(values):.2f}..{max(values):.2f})"


def report(runs: dict[str, list[Calls]]) -> None:
    print(f"{'server':12} {'mean ms':>22} {'p99 ms':>22} {'server ms':>10} {'outside ms':>22}")
    for name, calls in runs.items():
        print(f"{name:12} {_spread([c.mean_ms for c in calls]):>22} "
              f"{_spread([c.p99_ms for c in calls]):>22} "
              f"{median([c.server_ms for c in calls]):10.2f} "
              f"{_spread([c.outside_ms for c in calls]):>22}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=12.0,
                        help="what the delayed echoes wait and the sim model costs per batch")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--warmup-calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.delay_ms < 0 or args.calls < 1 or args.warmup_calls < 0 or args.repeats < 1:
        parser.error("--delay-ms and --warmup-calls must be >= 0, --calls and --repeats >= 1")
    out = REPO / ".bench" / "call_overhead"
    out.mkdir(parents=True, exist_ok=True)
    runs = run(args.delay_ms, args.calls, args.warmup_calls, args.repeats, out)
    report(runs)
    write_json(REPO / ".bench" / "call_overhead.json", {
        "delay_ms": args.delay_ms, "calls": args.calls, "warmup_calls": args.warmup_calls,
        "runs": {name: [{**asdict(c), "outside_ms": c.outside_ms} for c in calls]
                 for name, calls in runs.items()}})


if __name__ == "__main__":
    main()
