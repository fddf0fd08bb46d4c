"""One load point (a concurrency or a rate held for a duration), run in this process or spread
over ``procs`` processes, with the generator's own CPU use and schedule lag measured."""

from __future__ import annotations

import asyncio
import multiprocessing
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evenflow.client._endpoint import Protocol
from evenflow.client.credentials import Credentials
from evenflow.loadtest.arrivals import Arrival, send_times_s
from evenflow.loadtest.histogram import LatencyHistogram
from evenflow.loadtest.percentiles import ordered_percentile, percentile
from evenflow.loadtest.progress import Progress
from evenflow.loadtest.runner import (
    OK,
    LoadTarget,
    RequestRecord,
    Target,
    closed_loop,
    open_loop,
)
from evenflow.loadtest.streaming import stream_closed_loop, stream_open_loop
from evenflow.loadtest.targets import make_target
from evenflow.proto import grpc_service_pb2 as pb

STREAMING_NEEDS_GRPC = ("--streaming sends over gRPC's ModelStreamInfer; HTTP/1.1 has no "
                        "streams: drop --streaming, or use --protocol grpc")
SERIES_BIN_S = 0.25  # time series (throughput, p99 over time) in bins of this width
RECORD_DTYPE = np.dtype([("intended_s", "f8"), ("sent_s", "f8"), ("done_s", "f8"),
                         ("status", "U24")])


@dataclass(frozen=True)
class LoadSpec:
    """What one process generates. ``mode`` is ``concurrency`` or ``rate``; ``protocol`` the
    transport (``streaming`` needs gRPC's streams)."""

    url: str
    request_bytes: bytes
    mode: str
    value: float
    duration_s: float
    arrival: str = "poisson"
    seed: int = 0
    streaming: bool = False
    timeout_s: float = 30.0
    start_at_s: float = 0.0  # monotonic (system-wide); every process starts then
    credentials: Credentials | None = None
    protocol: Protocol = "grpc"

    def __post_init__(self) -> None:
        if self.streaming and self.protocol != "grpc":
            raise ValueError(STREAMING_NEEDS_GRPC)

    def share(self, index: int, procs: int) -> LoadSpec:
        value: float
        if self.mode == "concurrency":
            value = int(self.value) // procs + (1 if index < int(self.value) % procs else 0)
        else:
            value = self.value / procs
        return LoadSpec(self.url, self.request_bytes, self.mode, value, self.duration_s,
                        self.arrival, self.seed * 1000 + index, self.streaming, self.timeout_s,
                        self.start_at_s, self.credentials, self.protocol)


@dataclass
class GeneratorShare:
    records: np.ndarray
    cpu_s: float
    wall_s: float
    dropped: int


@dataclass
class PointResult:
    mode: str
    value: float
    duration_s: float
    throughput_per_s: float
    latency_ms: dict[str, float]
    status_counts: dict[str, int]
    generator_cpu_fraction: float  # of one core, busiest process
    schedule_lag_p99_ms: float
    dropped: int
    warnings: list[str]
    cdf_ms: list[tuple[float, float]] = field(default_factory=list)  # (latency, fraction)
    throughput_series: list[float] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


async def _generate(spec: LoadSpec, progress: Progress | None) -> tuple[list[RequestRecord], int]:
    request = pb.ModelInferRequest.FromString(spec.request_bytes)
    # HTTP/1.1 needs a connection per request in flight: a closed loop's concurrency, or as
    # many as an open loop has outstanding (unbounded).
    target = make_target(spec.url, spec.protocol, request, timeout_s=spec.timeout_s,
                         credentials=spec.credentials,
                         connections=int(spec.value) if spec.mode == "concurrency" else 0)
    reporter = asyncio.create_task(progress.report_from(lambda: records)) if progress else None
    records: list[RequestRecord] = []
    try:
        await asyncio.sleep(max(0.0, spec.start_at_s - time.monotonic()))  # align processes
        if spec.mode == "concurrency":
            if spec.streaming:
                await stream_closed_loop(_grpc(target), concurrency=int(spec.value),
                                         duration_s=spec.duration_s, records=records)
            else:
                await closed_loop(target, concurrency=int(spec.value),
                                  duration_s=spec.duration_s, records=records)
            return records, 0
        offsets = send_times_s(Arrival.parse(spec.arrival), spec.value, spec.duration_s,
                               spec.seed)
        start_s = max(spec.start_at_s, time.monotonic())
        if spec.streaming:
            _, dropped = await stream_open_loop(_grpc(target), offsets, start_s,
                                                records=records)
        else:
            _, dropped = await open_loop(target, offsets, start_s=start_s, records=records)
        return records, dropped
    finally:
        if reporter is not None:
            reporter.cancel()
        await target.close()


def _grpc(target: LoadTarget) -> Target:
    if not isinstance(target, Target):
        raise ValueError(STREAMING_NEEDS_GRPC)
    return target


_worker_progress: Progress | None = None


def _init_worker(progress: Progress) -> None:
    # NOTE: shared counters reach spawned processes only at their creation (initargs).
    global _worker_progress  # noqa: PLW0603 - per-process state set once by the pool
    _worker_progress = progress


def generate_share(spec: LoadSpec, progress: Progress | None = None) -> GeneratorShare:
    """Run one process's share (also the entry point of worker processes)."""
    progress = progress or _worker_progress
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    wall_before = time.monotonic()
    records, dropped = asyncio.run(_generate(spec, progress))
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    array = np.array([(r.intended_s, r.sent_s, r.done_s, r.status) for r in records],
                     dtype=RECORD_DTYPE)
    return GeneratorShare(array, cpu_s, time.monotonic() - wall_before, dropped)


async def generate(spec: LoadSpec, procs: int, progress: Progress | None) -> list[GeneratorShare]:
    if procs <= 1:
        return [await asyncio.to_thread(generate_share, spec, progress)]
    context = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    initargs: tuple[Any, ...] = () if progress is None else (progress,)
    with ProcessPoolExecutor(max_workers=procs, mp_context=context,  # type: ignore[arg-type]
                             initializer=_init_worker if progress else None,
                             initargs=initargs) as pool:
        futures = [loop.run_in_executor(pool, generate_share, spec.share(i, procs))
                   for i in range(procs)]
        return list(await asyncio.gather(*futures))


def binned_p99_ms(records: np.ndarray, start_s: float, duration_s: float,
                  bin_s: float = SERIES_BIN_S) -> list[float | None]:
    """The p99 latency (ms) of the successful requests meant to be sent in each bin; None for a
    bin without one."""
    ok = records[records["status"] == OK]
    bins = ((ok["intended_s"] - start_s) / bin_s).astype(int)
    latencies_ms = (ok["done_s"] - ok["intended_s"]) * 1000.0
    series: list[float | None] = []
    for index in range(max(1, int(duration_s / bin_s))):
        in_bin = np.sort(latencies_ms[bins == index])
        series.append(ordered_percentile(in_bin, 0.99) if len(in_bin) else None)
    return series


def summarize(spec: LoadSpec, shares: list[GeneratorShare], start_s: float, warmup_s: float,
              bin_s: float = SERIES_BIN_S) -> PointResult:
    """Statistics over the requests meant to be sent after the warm-up."""
    records = np.concatenate([s.records for s in shares]) if shares else np.empty(0, RECORD_DTYPE)
    since_s = start_s + warmup_s
    measured = records[records["intended_s"] >= since_s]
    end_s = float(measured["done_s"].max()) if len(measured) else since_s
    window_s = max(1e-9, min(end_s, start_s + spec.duration_s) - since_s)
    ok = measured[measured["status"] == OK]
    latencies_s = np.sort(ok["done_s"] - ok["intended_s"])
    hist = LatencyHistogram()
    hist.record_all_s(latencies_s.tolist())
    statuses, counts = np.unique(measured["status"], return_counts=True)
    lag_ms = (measured["sent_s"] - measured["intended_s"]) * 1000.0
    cpu_fraction = max((s.cpu_s / s.wall_s for s in shares if s.wall_s > 0), default=0.0)
    completed_in_window = ok[ok["done_s"] < since_s + window_s]
    warnings = []
    if cpu_fraction > 0.85:
        warnings.append(f"load generator used {cpu_fraction:.0%} of a core: it may be measuring "
                        "itself; add --procs")
    lag_p99 = percentile(lag_ms, 0.99) if len(lag_ms) else 0.0
    if spec.mode == "rate" and lag_p99 > 5.0:
        warnings.append(f"load generator fell behind schedule (p99 lag {lag_p99:.1f} ms)")
    dropped = sum(s.dropped for s in shares)
    if dropped:
        warnings.append(f"{dropped} requests not sent: too many outstanding")
    num_bins = max(1, int(spec.duration_s / bin_s))
    series = np.histogram(ok["done_s"] - start_s, bins=num_bins,
                          range=(0.0, num_bins * bin_s))[0] / bin_s
    cdf = []
    if len(latencies_s):
        for q in (0.0, *np.linspace(0.01, 0.99, 99), 0.999, 1.0):
            cdf.append((ordered_percentile(latencies_s, float(q)) * 1000, float(q)))
    return PointResult(
        mode=spec.mode, value=spec.value, duration_s=spec.duration_s,
        throughput_per_s=len(completed_in_window) / window_s, latency_ms=hist.summary_ms(),
        status_counts={str(s): int(c) for s, c in zip(statuses, counts, strict=True)},
        generator_cpu_fraction=cpu_fraction, schedule_lag_p99_ms=lag_p99, dropped=dropped,
        warnings=warnings, cdf_ms=cdf, throughput_series=series.tolist())

