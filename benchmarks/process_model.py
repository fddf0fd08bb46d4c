"""The process models side by side: throughput, tail, and where each request's CPU goes.

    python -m benchmarks.process_model [--concurrency 64] [--repeats 1] [--window-ms 3000]

For each mode (single process; ``--frontends 2``; ``--workers process``; both) and workload
(``mlp`` on one CPU device; a free model, ``sim`` at 0 ms, on two sim devices) and request
size (1 and 8 samples), one ``evenflow serve`` runs while perf_analyzer drives it closed-loop
at ``--concurrency``. Each process's CPU time is read from /proc before and after and divided
by the requests the server answered (its own statistics): front-end, engine (the process
that balances; in the single process, everything) and worker microseconds per request, and of
the engine its event-loop thread alone. From those, the requests/s a K-core host could carry:
all the CPU must fit in K cores (K / total), and the engine's loop thread, the one serial part
(front-ends and workers are as many processes as one likes), in one (1 / engine loop). Then
``benchmarks.engine_routing`` measures the engine alone. ``--workloads``, ``--batches`` and
``--modes`` pick a subset; with ``--repeats`` the modes alternate and the median run is kept.
The JSON goes to .bench/process_model.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from benchmarks import engine_routing
from benchmarks.harness import (
    REPO,
    evenflow_argv,
    median_run,
    perf_analyzer,
    start,
    write_json,
)
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

MODES = {"single": [], "frontends 2": ["--frontends", "2"],
         "workers process": ["--workers", "process"],
         "both": ["--frontends", "2", "--workers", "process"]}
WORKLOADS = {"mlp cpu": ["--model", "mlp", "--devices", "cpu"],
             "free sim": ["--model", "mlp=sim", "--devices", "sim:1,sim:1", "--sim-base-ms", "0",
                          "--sim-per-sample-ms", "0"]}
CORES = (2, 8, 16)


@dataclass
class Row:
    mode: str
    workload: str
    batch: int
    requests_per_s: float
    samples_per_s: float
    p50_ms: float
    p99_ms: float
    frontend_us: float
    engine_us: float
    engine_loop_us: float  # the engine's event-loop thread
    worker_us: float


def _cpu_s(pid: int, tid: int | None = None) -> float:
    path = Path(f"/proc/{pid}/stat") if tid is None else Path(f"/proc/{pid}/task/{tid}/stat")
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _roles(engine_pid: int) -> dict[int, str]:
    """The server's processes by role: its children are front-ends or workers."""
    roles = {engine_pid: "engine"}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat[1]) == engine_pid:
            roles[int(entry.name)] = "frontend" if "frontend_process" in cmdline else "worker"
    return roles


def _cpu_by_role(roles: dict[int, str]) -> dict[str, float]:
    totals = {"engine": 0.0, "engine_loop": 0.0, "frontend": 0.0, "worker": 0.0}
    for pid, role in roles.items():
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            totals[role] += _cpu_s(pid)
            if role == "engine":
                totals["engine_loop"] += _cpu_s(pid, pid)  # the main thread runs the loop
    return totals


def _answered(url: str) -> int:
    with grpc.insecure_channel(url) as channel:
        stats = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            pb.ModelStatisticsRequest(name="mlp"))
    return int(stats.model_stats[0].inference_stats.success.count)


def _measure(mode: str, workload: str, batch: int, concurrency: int, window_ms: int,
             out: Path) -> Row:
    server = start(evenflow_argv(*WORKLOADS[workload], *MODES[mode], "--max-batch", "256"),
                   out / "process_model.log")
    try:
        perf_analyzer(server.url, "mlp", concurrency, out, batch=batch, window_ms=1000)  # warm
        roles = _roles(server.proc.pid)
        before, answered_before = _cpu_by_role(roles), _answered(server.url)
        point = perf_analyzer(server.url, "mlp", concurrency, out, batch=batch,
                              window_ms=window_ms)
        after, answered = _cpu_by_role(roles), _answered(server.url) - answered_before
    finally:
        server.stop()
    per = {role: (after[role] - before[role]) / max(1, answered) * 1e6 for role in after}
    # perf_analyzer counts inferences as requests x samples per request.
    return Row(mode, workload, batch, point.infer_per_s / batch, point.infer_per_s,
               point.p50_ms, point.p99_ms, per["frontend"], per["engine"], per["engine_loop"],
               per["worker"])


def _bound_per_s(row: Row, cores: int) -> float:
    """Requests/s ``cores`` could carry: all the CPU in K cores, the engine's loop in one."""
    total_us = row.frontend_us + row.engine_us + row.worker_us
    return min(cores * 1e6 / total_us, 1e6 / row.engine_loop_us)


def _table(rows: list[Row]) -> str:
    head = ("| workload | samples/request | mode | requests/s | samples/s | p50 ms | p99 ms | "
            "front-end us | engine us (loop) | worker us | "
            + " | ".join(f"bound on {k} cores" for k in CORES) + " |")
    lines = [head, "|" + "---|" * (10 + len(CORES))]
    for r in rows:
        bounds = " | ".join(f"{_bound_per_s(r, k):,.0f}" for k in CORES)
        lines.append(f"| {r.workload} | {r.batch} | {r.mode} | {r.requests_per_s:,.0f} | "
                     f"{r.samples_per_s:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | "
                     f"{r.frontend_us:.0f} | {r.engine_us:.0f} ({r.engine_loop_us:.0f}) | "
                     f"{r.worker_us:.0f} | {bounds} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    rows: list[Row] = []
    for workload in args.workloads.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            runs: dict[str, list[Row]] = {mode: [] for mode in modes}
            for _ in range(args.repeats):  # A B C D A B C D ...
                for mode in modes:
                    runs[mode].append(_measure(mode, workload, batch, args.concurrency,
                                               args.window_ms, args.out))
            for mode, points in runs.items():
                row = median_run(points, lambda r: r.samples_per_s)
                rows.append(row)
                spread = ", ".join(f"{p.samples_per_s:,.0f}" for p in points)
                print(f"  {workload} b={batch} {mode}: {row.samples_per_s:,.0f} samples/s "
                      f"({spread}) p99 {row.p99_ms:.1f} ms", flush=True)
    routing = engine_routing.measure(5.0, 256)
    print(_table(rows))
    print(f"\nengine alone: {routing.engine_cpu_us_per_request:.1f} us CPU per request -> "
          f"{routing.one_core_per_s:,.0f} one-sample requests/s on one core")
    for workload in WORKLOADS:
        thread = next((r for r in rows if r.workload == workload and r.batch == 8
                       and r.mode == "single"), None)
        process = next((r for r in rows if r.workload == workload and r.batch == 8
                        and r.mode == "workers process"), None)
        if thread is not None and process is not None:
            print(f"{workload}, 8-sample requests: --workers process / thread samples/s = "
                  f"{process.samples_per_s / thread.samples_per_s:.2f}")
    write_json(args.out / "process_model.json",
               {"rows": [asdict(r) for r in rows],
                "engine_alone": {"cpu_us_per_request": routing.engine_cpu_us_per_request,
                                 "one_core_per_s": routing.one_core_per_s}})


if __name__ == "__main__":
    main()
