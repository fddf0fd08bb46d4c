"""Shared pieces of the benchmarks: start servers as processes, run perf_analyzer, record the
machine, write JSON. Benchmarks report ratios measured side by side in one run."""

from __future__ import annotations

import csv
import json
import os
import platform
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")
HTTP_BANNER = "evenflow http on http://"  # how ``evenflow serve`` announces its HTTP port
Protocol = Literal["grpc", "http"]  # perf_analyzer's -i for a KServe v2 server


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str
    banner: tuple[str, ...] = ()  # what it printed before its address line

    @property
    def http_url(self) -> str:
        """HOST:PORT of an evenflow server's HTTP port, from the ``evenflow http on
        http://HOST:PORT`` line it prints before its gRPC address."""
        for line in self.banner:
            if line.startswith(HTTP_BANNER):
                return line.removeprefix(HTTP_BANNER).split()[0]
        raise RuntimeError(f"the server at {self.url} printed no '{HTTP_BANNER}' line: is its "
                           "HTTP port off?")

    def cpu_s(self) -> float:
        """User + system CPU seconds the server process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def wait_for_line(proc: subprocess.Popen[str], marker: str,
                  timeout_s: float) -> tuple[str | None, list[str]]:
    """Read ``proc``'s stdout until a line containing ``marker``: that line (None when the
    process ended or the time ran out first) and the lines before it.

    Reads the file descriptor itself: a buffered ``readline`` can pull two lines at once and leave
    the second where ``select`` cannot see it.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    pending = b""
    before: list[str] = []
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (remaining_s := deadline - time.monotonic()) > 0:
            if not selector.select(remaining_s):
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                raw, pending = pending.split(b"\n", 1)
                line = raw.decode(errors="replace")
                if marker in line:
                    return line, before
                before.append(line)
    return None, before


def start(argv: list[str], log_path: Path, timeout_s: float = 120.0) -> Server:
    """Start a server that prints ``... listening on HOST:PORT`` once it serves."""
    log = log_path.open("w")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    log.close()
    line, before = wait_for_line(proc, "listening on ", timeout_s)
    if line is not None:
        return Server(proc, line.split()[-1], tuple(before))
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{argv} did not start; log: {log_path}")


def evenflow_argv(*args: str, time_admission: bool = False) -> list[str]:
    """``evenflow serve`` on a free port. Unless ``time_admission``, admission by time is off
    (``--max-queue-delay-ms inf``): most benchmarks drive closed loops past what the latency
    target allows to measure capacity, and perf_analyzer stops at the first refusal."""
    off = () if time_admission else ("--max-queue-delay-ms", "inf")
    return [sys.executable, "-m", "evenflow.server.config.cli", "serve", "--port", "0",
            "--http-port", "0", "--log-level", "WARNING", *off, *args]


def perf_analyzer_binary() -> str:
    for candidate in (os.environ.get("EVENFLOW_PERF_ANALYZER"),
                      str(REPO / ".tools" / "bin" / "perf_analyzer"),
                      shutil.which("perf_analyzer")):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("perf_analyzer not found: run ./scripts/setup.sh --perf-analyzer")


class UnstableMeasurement(RuntimeError):
    """perf_analyzer found no window stable enough within its trials (a shared machine): no
    figure, but no failure of the server either, unlike any other ``RuntimeError`` here."""


@dataclass
class PerfPoint:
    concurrency: int
    infer_per_s: float
    p50_ms: float
    p99_ms: float
    stable: bool
    generator_cpu_s: float


# The name suffix of a benchmark series measured over ModelStreamInfer (``streaming=True``).
STREAM = "+stream"


def perf_analyzer(url: str, model: str, concurrency: int, out_dir: Path, *, shape: str = "x:256",
                  batch: int = 1, window_ms: int = 3000, extra: tuple[str, ...] = (),
                  streaming: bool = False, protocol: Protocol = "grpc") -> PerfPoint:
    """One closed-loop point over KServe v2: gRPC unary calls, or with ``streaming`` one
    ModelStreamInfer stream per concurrency slot, or with ``protocol="http"`` REST requests
    (``url`` is then the HTTP port's HOST:PORT; tensors binary unless ``extra`` asks for
    ``--input-tensor-format json``). An unstable measurement is kept and flagged, not dropped."""
    if streaming and protocol != "grpc":
        raise ValueError("perf_analyzer streams over gRPC only")
    return _perf_analyzer_point(
        url, model, ("--concurrency-range", f"{concurrency}:{concurrency}"), concurrency,
        out_dir, inputs=_kserve_inputs(shape, batch, protocol), window_ms=window_ms,
        extra=(*extra, *(("--streaming",) if streaming else ())))


def perf_analyzer_torchserve(url: str, model: str, concurrency: int, out_dir: Path, *,
                             input_data: Path, window_ms: int = 3000) -> PerfPoint:
    """One closed-loop point against TorchServe's HTTP inference API (perf_analyzer's
    ``torchserve`` service kind: each request POSTs the file ``input_data`` names)."""
    return _perf_analyzer_point(
        url, model, ("--concurrency-range", f"{concurrency}:{concurrency}"), concurrency,
        out_dir, inputs=("--service-kind", "torchserve", "-i", "http",
                         "--input-data", str(input_data)), window_ms=window_ms, extra=())


def perf_analyzer_at_rate(url: str, model: str, rate_per_s: float, out_dir: Path, *,
                          shape: str = "x:256", window_ms: int = 6000) -> PerfPoint:
    """One open-loop point: Poisson arrivals at ``rate_per_s`` (``concurrency`` is 0)."""
    return _perf_analyzer_point(
        url, model, ("--request-rate-range", f"{rate_per_s:.1f}", "--request-distribution",
                     "poisson", "--max-threads", "64"), 0, out_dir,
        inputs=_kserve_inputs(shape, 1), window_ms=window_ms, extra=("--percentile", "99"))


def _kserve_inputs(shape: str, batch: int, protocol: Protocol = "grpc") -> tuple[str, ...]:
    return ("-i", protocol, "--shape", shape, "-b", str(batch))


def _perf_analyzer_point(url: str, model: str, load: tuple[str, ...], concurrency: int,
                         out_dir: Path, *, inputs: tuple[str, ...], window_ms: int,
                         extra: tuple[str, ...]) -> PerfPoint:
    csv_path = out_dir / f"pa_{model}_{concurrency}_{time.monotonic_ns()}.csv"
    before = os.times()
    run = subprocess.run(
        [perf_analyzer_binary(), "-u", url, "-m", model, *inputs, *load, "-p", str(window_ms),
         "-s", "60", "-r", "6", "-f", str(csv_path), *extra],
        check=False, capture_output=True, text=True, timeout=300)
    after = os.times()
    generator_cpu_s = (after.children_user - before.children_user
                       + after.children_system - before.children_system)
    stable = run.returncode == 0 and "unstable" not in run.stdout.lower()
    if not csv_path.exists():
        said = f"{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
        if "Failed to obtain stable measurement" in run.stdout + run.stderr:
            raise UnstableMeasurement(f"perf_analyzer found no stable window:\n{said}")
        raise RuntimeError(f"perf_analyzer failed:\n{said}")
    with csv_path.open() as f:
        row = next(csv.DictReader(f))
    return PerfPoint(concurrency, float(row["Inferences/Second"]),
                     float(row["p50 latency"]) / 1000.0, float(row["p99 latency"]) / 1000.0,
                     stable, generator_cpu_s)


@dataclass
class ClosedLoopRun:
    records: list[Any]  # loadtest RequestRecords
    elapsed_s: float

    @property
    def ok(self) -> int:
        return sum(1 for r in self.records if r.status == "OK")

    @property
    def ok_per_s(self) -> float:
        return self.ok / self.elapsed_s


async def closed_loop_run(url: str, request: Any, *, concurrency: int, seconds: float,
                          warmup_s: float) -> ClosedLoopRun:
    """Warm up, then one measured closed-loop window with evenflow's load generator."""
    from evenflow.loadtest.runner import Target, closed_loop

    target = Target(url, request)
    try:
        await closed_loop(target, concurrency=concurrency, duration_s=warmup_s)
        start_s = time.monotonic()
        records = await closed_loop(target, concurrency=concurrency, duration_s=seconds)
        return ClosedLoopRun(records, time.monotonic() - start_s)
    finally:
        await target.close()


def machine() -> dict[str, Any]:
    import grpc
    import torch

    return {"cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "grpcio": grpc.__version__,
            "platform": platform.platform()}


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"command": " ".join(sys.argv), "machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {path}")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def median_run(runs: Sequence[T], value: Callable[[T], float]) -> T:
    """The run whose value is nearest the runs' median: a real run to report, with its other
    figures, rather than an average of runs."""
    middle = median([value(run) for run in runs])
    return min(runs, key=lambda run: abs(value(run) - middle))
