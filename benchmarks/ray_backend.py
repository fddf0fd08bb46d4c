"""The same simulated devices through each worker host: thread, process and Ray actors.

    python -m benchmarks.ray_backend [--batches 1,8,32] [--repeats 3] [--window-ms 3000]

``sim`` (10 ms + 2 ms per sample at speed 1) on two devices ``sim:1,sim:1``, perf_analyzer at
concurrency 64 with requests of each ``--batches`` size; the hosts alternate (A B C A B C ...)
and each cell is the median of ``--repeats``. The Ray server starts its own private Ray
(``--ray-address local``). "added per batch": the replicas' fitted fixed cost per batch ``a``
minus the device's own 10 ms, i.e. what each host adds to every batch (hand-offs, the call).
The JSON goes to .bench/ray_backend.json.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from benchmarks.harness import (
    REPO,
    evenflow_argv,
    median_run,
    perf_analyzer,
    start,
    write_json,
)
from evenflow.proto import evenflow_pb2, evenflow_pb2_grpc

HOSTS = {"thread": [], "process": ["--workers", "process"],
         "ray": ["--workers", "ray", "--ray-address", "local"]}
_SIM_BASE_S = 0.010


@dataclass
class Row:
    host: str
    batch: int
    samples_per_s: float
    p50_ms: float
    p99_ms: float
    added_per_batch_ms: float


def _added_per_batch_ms(url: str) -> float:
    with grpc.insecure_channel(url) as channel:
        stats = evenflow_pb2_grpc.EvenflowStatsStub(channel).GetStats(
            evenflow_pb2.GetStatsRequest(model_name="sim"))
    return statistics.mean(r.fit_base_s - _SIM_BASE_S for r in stats.models[0].replicas) * 1e3


def _measure(host: str, batch: int, window_ms: int, out: Path) -> Row:
    server = start(evenflow_argv("--model", "sim", "--devices", "sim:1,sim:1", "--max-batch",
                                 "256", *HOSTS[host]), out / "ray_backend.log")
    try:
        perf_analyzer(server.url, "sim", 64, out, batch=batch, window_ms=1000)  # warm-up
        point = perf_analyzer(server.url, "sim", 64, out, batch=batch, window_ms=window_ms)
        added_ms = _added_per_batch_ms(server.url)
    finally:
        server.stop()
    # perf_analyzer counts inferences as requests x samples per request.
    return Row(host, batch, point.infer_per_s, point.p50_ms, point.p99_ms, added_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--hosts", default=",".join(HOSTS))
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    hosts = args.hosts.split(",")
    rows: list[Row] = []
    for batch in (int(b) for b in args.batches.split(",")):
        runs: dict[str, list[Row]] = {host: [] for host in hosts}
        for _ in range(args.repeats):
            for host in hosts:
                runs[host].append(_measure(host, batch, args.window_ms, args.out))
        for host, points in runs.items():
            row = median_run(points, lambda r: r.samples_per_s)
            rows.append(row)
            spread = ", ".join(f"{p.samples_per_s:,.0f}" for p in points)
            print(f"  b={batch} {host}: {row.samples_per_s:,.0f} samples/s ({spread})",
                  flush=True)
    print("| samples/request | host | samples/s | / thread | p50 ms | p99 ms | "
          "added per batch ms |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        thread = next(r for r in rows if r.batch == row.batch and r.host == hosts[0])
        print(f"| {row.batch} | {row.host} | {row.samples_per_s:,.0f} | "
              f"{row.samples_per_s / thread.samples_per_s:.2f} | {row.p50_ms:.1f} | "
              f"{row.p99_ms:.1f} | {row.added_per_batch_ms:.2f} |")
    write_json(args.out / "ray_backend.json", {"rows": [asdict(r) for r in rows]})


if __name__ == "__main__":
    main()
