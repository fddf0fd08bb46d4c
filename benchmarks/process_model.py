"""The process models side by side: throughput, tail, and where each request's CPU goes.

    python -m benchmarks.process_model [--concurrency 64] [--repeats 1] [--window-ms 3000]

For each mode (single process; ``--frontends 2``; ``--workers process``; both) and workload
(``mlp`` on one CPU device; a free model, ``sim`` at 0 ms, on two sim devices) and request
size (1 and 8 samples), one ``evenflow serve`` runs while perf_analyzer drives it closed-loop
at ``--concurrency``. Each process's CPU time is read from /proc before and after and divided
by the requests the server answered (its own statistics): front-end, engine (the process
that balances; in the single process, everything) and worker microseconds per request. From
those, the requests/s each role could reach on a K-core host: front-ends scale with processes
(K / front-end CPU), the engine is one process (1 / engine CPU), workers one per device. Then
``benchmarks.engine_routing`` measures the engine alone. The JSON goes to
.bench/process_model.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from benchmarks import engine_routing
from benchmarks.harness import REPO, evenflow_argv, perf_analyzer, start, write_json
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
    infer_per_s: float
    samples_per_s: float
    p50_ms: float
    p99_ms: float
    frontend_us: float
    engine_us: float
    worker_us: float


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
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
    totals = {"engine": 0.0, "frontend": 0.0, "worker": 0.0}
    for pid, role in roles.items():
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            totals[role] += _cpu_s(pid)
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
    return Row(mode, workload, batch, point.infer_per_s, point.infer_per_s * batch,
               point.p50_ms, point.p99_ms, per["frontend"], per["engine"], per["worker"])


def _bound_per_s(row: Row, cores: int) -> float:
    """Requests/s the front-end and engine roles could carry on ``cores`` (workers aside)."""
    if row.frontend_us == 0.0:  # one process: everything on its one event loop
        return 1e6 / row.engine_us
    frontends = max(1, cores - 1) * 1e6 / row.frontend_us
    return min(frontends, 1e6 / row.engine_us)


def _table(rows: list[Row]) -> str:
    head = ("| workload | samples/request | mode | infer/s | samples/s | p50 ms | p99 ms | "
            "front-end us | engine us | worker us | "
            + " | ".join(f"bound on {k} cores" for k in CORES) + " |")
    lines = [head, "|" + "---|" * (10 + len(CORES))]
    for r in rows:
        bounds = " | ".join(f"{_bound_per_s(r, k):,.0f}" for k in CORES)
        lines.append(f"| {r.workload} | {r.batch} | {r.mode} | {r.infer_per_s:,.0f} | "
                     f"{r.samples_per_s:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | "
                     f"{r.frontend_us:.0f} | {r.engine_us:.0f} | {r.worker_us:.0f} | {bounds} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    for workload in WORKLOADS:
        for batch in (1, 8):
            for mode in MODES:
                runs = [_measure(mode, workload, batch, args.concurrency, args.window_ms,
                                 args.out) for _ in range(args.repeats)]
                row = min(runs, key=lambda r: abs(r.infer_per_s - statistics.median(
                    x.infer_per_s for x in runs)))
                rows.append(row)
                print(f"  {workload} b={batch} {mode}: {row.infer_per_s:,.0f} infer/s "
                      f"p99 {row.p99_ms:.1f} ms", flush=True)
    routing = engine_routing.measure(5.0, 256)
    print(_table(rows))
    print(f"\nengine alone: {routing.engine_cpu_us_per_request:.1f} us CPU per request -> "
          f"{routing.one_core_per_s:,.0f} one-sample requests/s on one core")
    for workload in WORKLOADS:
        thread = next(r for r in rows if r.workload == workload and r.batch == 8
                      and r.mode == "single")
        process = next(r for r in rows if r.workload == workload and r.batch == 8
                       and r.mode == "workers process")
        print(f"{workload}, 8-sample requests: --workers process / thread samples/s = "
              f"{process.samples_per_s / thread.samples_per_s:.2f}")
    write_json(args.out / "process_model.json",
               {"rows": [asdict(r) for r in rows],
                "engine_alone": {"cpu_us_per_request": routing.engine_cpu_us_per_request,
                                 "one_core_per_s": routing.one_core_per_s}})


if __name__ == "__main__":
    main()
