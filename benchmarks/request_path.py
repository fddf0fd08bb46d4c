"""Where a request's CPU time goes: microseconds per request in each part of the path.

    python -m benchmarks.request_path [--concurrency 1,16,64] [--repeats 3] [--seconds 3]

Three servers, one after another at each concurrency (A B C A B C): the bare grpc.aio+uvloop
echo server (``benchmarks.echo_server``: gRPC and the event loop only), evenflow serving ``mlp``
on one CPU worker, and evenflow serving a free model (``sim`` at 0 ms, named ``mlp``); the free
model once more over ModelStreamInfer (one stream per client slot, ``stream``), where gRPC's
per-call costs are paid once per stream instead of once per request. evenflow
runs with ``EVENFLOW_CPU_PARTS=1``: each part of the path reads its thread's CPU clock
(``evenflow.balancer.stats.CPU_PARTS``) and the server exports the sums as
``evenflow_cpu_seconds_total``. For each point the closed-loop generator of ``evenflow
loadtest`` sends 1-sample requests for ``--seconds`` after a 1 s warm-up; the server's whole
CPU time (every thread, from /proc) and its counters are read before and after, and divided by
the requests answered in between. "grpc+loop" is the whole minus the counted parts: gRPC's core,
the event loop, task switches and thread hand-offs. Reading the clocks costs about 1 us per
part, included in the parts. Medians over ``--repeats``; the JSON goes to
.bench/request_path.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness import REPO, Server, evenflow_argv, start, write_json
from evenflow.balancer.stats import CPU_PARTS
from evenflow.loadtest.runner import OK, Target, closed_loop, mlp_like_request
from evenflow.loadtest.streaming import stream_closed_loop
from evenflow.server.observability.cpu_accounting import ENV_VAR

REST = "grpc+loop"


def _servers(out: Path, extra: list[str]) -> dict[str, Server]:
    os.environ[ENV_VAR] = "1"
    metrics = ("--metrics-port", "0")
    return {
        "echo": start([sys.executable, "-m", "benchmarks.echo_server"], out / "echo.log"),
        "mlp": start(evenflow_argv("--model", "mlp", "--devices", "cpu", *metrics, *extra),
                     out / "mlp.log"),
        "free": start(evenflow_argv("--model", "mlp=sim", "--devices", "sim:1",
                                    "--sim-base-ms", "0", "--sim-per-sample-ms", "0", *metrics,
                                    *extra), out / "free.log"),
    }


def _metrics_url(server: Server) -> str | None:
    for line in server.banner:
        if "metrics on " in line:
            return line.split("metrics on ")[1].strip()
    return None


def _parts_s(url: str | None) -> dict[str, float]:
    if url is None:
        return {}
    with urllib.request.urlopen(url, timeout=5) as response:
        page = response.read().decode()
    parts: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        if family.name == "evenflow_cpu_seconds":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    parts[sample.labels["part"]] = parts.get(sample.labels["part"], 0.0) \
                        + sample.value
    return parts


async def _point(server: Server, concurrency: int, seconds: float,
                 streaming: bool = False) -> dict[str, float]:
    """Per-request CPU microseconds by part (and the total) at one concurrency."""
    target = Target(server.url, mlp_like_request("mlp", "x", [1, 256]))
    metrics = _metrics_url(server)
    run = stream_closed_loop if streaming else closed_loop
    try:
        await run(target, concurrency=concurrency, duration_s=1.0)
        parts_before, cpu_before_s = _parts_s(metrics), server.cpu_s()
        started_s = time.monotonic()
        records = await run(target, concurrency=concurrency, duration_s=seconds)
        elapsed_s = time.monotonic() - started_s
        parts_after, cpu_after_s = _parts_s(metrics), server.cpu_s()
    finally:
        await target.close()
    answered = sum(1 for r in records if r.status == OK)
    per_request_us = {part: (parts_after[part] - parts_before.get(part, 0.0)) / answered * 1e6
                      for part in parts_after}
    total_us = (cpu_after_s - cpu_before_s) / answered * 1e6
    return {**per_request_us, REST: total_us - sum(per_request_us.values()),
            "total": total_us, "requests_per_s": answered / elapsed_s}


def _table(rows: dict[tuple[str, int], dict[str, float]], concurrencies: list[int]) -> str:
    columns = [(name, c) for c in concurrencies for name in ("echo", "free", "stream", "mlp")]
    header = "| part (us per request) | " + " | ".join(f"{n} c={c}" for n, c in columns) + " |"
    lines = [header, "|---|" + "---|" * len(columns)]
    for part in (*CPU_PARTS, REST, "total", "requests_per_s"):
        cells = []
        for key in columns:
            value = rows[key].get(part)
            cells.append("" if value is None else f"{value:.0f}")
        label = "requests/s (generator shares the cores)" if part == "requests_per_s" else part
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--evenflow-args", default="", help="extra evenflow serve flags")
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    servers = _servers(args.out, args.evenflow_args.split())
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for concurrency in concurrencies:
            for _ in range(args.repeats):
                for name, server, streaming in (*((n, s, False) for n, s in servers.items()),
                                                ("stream", servers["free"], True)):
                    point = asyncio.run(_point(server, concurrency, args.seconds, streaming))
                    runs.setdefault((name, concurrency), []).append(point)
                    print(f"  {name:6s} c={concurrency:<3d} {point['requests_per_s']:7.0f} req/s "
                          f"{point['total']:6.0f} us CPU per request", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    rows = {key: {part: statistics.median(p[part] for p in points) for part in points[0]}
            for key, points in runs.items()}
    print(_table(rows, concurrencies))
    write_json(args.out / "request_path.json",
               {"rows": [{"server": name, "concurrency": c, **row}
                         for (name, c), row in rows.items()]})


if __name__ == "__main__":
    main()
