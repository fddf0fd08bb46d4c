"""The shifting-mix placement scenario through a real server over gRPC, beside the same
scenario in virtual time.

    python -m benchmarks.placement_real [--slo-ms 100] [--streams N] [--time-scale K]
                                        [--out .bench/placement_real]

A server on ``sim:1,sim:1,sim:0.5,sim:0.25`` with the scenario's declared memory serves its
three ``sim`` models (their batch costs, memory and a 2 s simulated load time declared in the
configuration file) with ``--placement auto``: replicas are really loaded, warmed up and
drained. A client process sends the scenario's open-loop traffic (a warm-up at the first mix,
then the phases) with evenflow's ``AsyncClient`` and no retries, one unary call per request or
over ``--streams`` ModelStreamInfer streams per model, and counts every answer by status:
a request lost or failed because a replica moved shows there. The SLO search
(``evenflow loadtest --slo-ms``'s) runs over fresh servers, one per probe, judged like the
virtual one (every phase, after the settling time, within the SLO with at most 1 % errors);
the virtual-time search of the same scenario starts from the placement the real server chose
at start. It runs twice: on the bare simulated devices, and with what each real run measured
the server adding (``measured_overheads``: per request outside the server, per batch in the
hand-offs), from the three runs nearest the real goodput.

``--time-scale K`` runs the scenario with every batch cost and the SLO K times longer (so at
about 1/K of the rate); the virtual search runs the same scaled scenario. The server's and the
client's CPU per request then weigh K times less against the devices' time, which tells how
much of a gap between real and virtual is the machine's per-call cost rather than the
balancer's and the planner's decisions.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from benchmarks.harness import evenflow_argv, start
from benchmarks.placement import SCENARIOS
from benchmarks.placement_bound import bound_per_s
from benchmarks.placement_sim import (
    NO_OVERHEADS,
    Overheads,
    Run,
    Scenario,
    phase_percentiles_s,
    probe_of,
    run_scenario,
)
from benchmarks.virtual_time import VirtualLoop
from evenflow.balancer.placement.inventory import Placement
from evenflow.client import AsyncClient, InferenceServerError
from evenflow.loadtest.slo_search import Probe, SearchSettings, search_goodput
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

WARMUP_S = 10.0
SETTLE_S = 12.0
ANSWER_TIMEOUT_S = 30.0  # far past any SLO: a request not answered by then is lost
Inputs = Mapping[str, np.ndarray]


def scaled(scenario: Scenario, factor: float) -> Scenario:
    """``scenario`` with every model's batch cost ``factor`` times longer."""
    if factor == 1.0:
        return scenario
    models = tuple(dataclasses.replace(m, base_s=m.base_s * factor,
                                       per_sample_s=m.per_sample_s * factor)
                   for m in scenario.models)
    return dataclasses.replace(scenario, models=models)


def config_text(scenario: Scenario, slo_s: float) -> str:
    """The deployment file for ``scenario``: devices with their memory, the models' costs."""
    speeds = ", ".join(f'"sim:{speed:g}"' for speed in scenario.speeds)
    memory = ", ".join(f'sim{i} = "{gib:g}GiB"' for i, gib in enumerate(scenario.memory_gib))
    lines = ["[server]", 'placement = "auto"', "", "[devices]", f"list = [{speeds}]",
             f"memory = {{ {memory} }}", "warmup_batches = 2", ""]
    for model in scenario.models:
        lines += [f"[models.{model.name}]", 'source = "sim"', f"memory_gib = {model.memory_gib:g}",
                  f"sim_base_ms = {model.base_s * 1e3:g}",
                  f"sim_per_sample_ms = {model.per_sample_s * 1e3:g}",
                  f"sim_load_ms = {model.load_s * 1e3:g}", "min_replicas = 1",
                  f"slo_ms = {slo_s * 1e3:g}", f"latency_target_ms = {slo_s * 1e3:g}",
                  f"max_batch = {scenario.max_batch}", "max_queued_requests = 100000", ""]
    return "\n".join(lines)


@dataclass(slots=True)
class Counts:
    """Every request sent and how it was answered."""

    sent: int = 0
    ok: int = 0
    ok_latency_s: float = 0.0  # the sum over the answers, as the client saw them
    by_status: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def unanswered(self) -> int:
        return self.sent - self.ok - sum(self.by_status.values())


async def stats_of(url: str) -> ef.GetStatsResponse:
    async with grpc.aio.insecure_channel(url) as channel:
        return await ef_grpc.EvenflowStatsStub(channel).GetStats(ef.GetStatsRequest())


def serving_placement(stats: ef.GetStatsResponse) -> Placement:
    return frozenset((r.model, r.device) for r in stats.placement.replicas
                     if r.state == "serving")


def moves_while_counted(scenario: Scenario, moves: Iterable[ef.PlacementMove],
                        begin_uptime_s: float) -> list[str]:
    """The moves that finished while requests counted (a phase's time after its settling
    time), as "phase N +S s: kind model on device (reason)"; ``begin_uptime_s`` is the
    server's uptime when the run's warm-up began."""
    out = []
    for move in (m for m in moves if m.outcome == "done"):
        at_s = move.at_s - begin_uptime_s - WARMUP_S
        for index in range(len(scenario.phases)):
            into_s = at_s - scenario.start_s(index)
            if SETTLE_S <= into_s < scenario.phases[index].seconds:
                out.append(f"phase {index} +{into_s:.1f} s: {move.kind} {move.model} on "
                           f"{move.device} ({move.reason})")
    return out


async def measured_overheads(url: str, scenario: Scenario, counts: Counts) -> Overheads:
    """What the server at ``url`` added to the simulated devices over a run: per request, the
    client's mean latency minus the server's own (GetModelStatistics' success time); per
    batch, the fitted fixed cost of the full-speed replicas alone on their device minus the
    model's declared one (a replica sharing its device fits the device time alone)."""
    async with grpc.aio.insecure_channel(url) as channel:
        served_stats = await pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            pb.ModelStatisticsRequest())
        stats = await ef_grpc.EvenflowStatsStub(channel).GetStats(ef.GetStatsRequest())
    served = sum(m.inference_stats.success.count for m in served_stats.model_stats)
    server_s = sum(m.inference_stats.success.ns for m in served_stats.model_stats) / 1e9
    transport_s = counts.ok_latency_s / counts.ok - server_s / served if served else 0.0
    full_speed = {f"sim{i}" for i, speed in enumerate(scenario.speeds) if speed == 1.0}
    per_device = collections.Counter(d for m in stats.models for r in m.replicas
                                     for d in r.devices)
    base_s = {m.name: m.base_s for m in scenario.models}
    excess_s = [r.fit_base_s - base_s[m.model_name] for m in stats.models for r in m.replicas
                if r.fit_reliable and len(r.devices) == 1 and r.devices[0] in full_speed
                and per_device[r.devices[0]] == 1]
    return Overheads(max(0.0, transport_s),
                     max(0.0, sum(excess_s) / len(excess_s)) if excess_s else 0.0)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the scenario: when it was due to be sent, in which phase (-1: the
    warm-up) and whether it counts (after the phase's settling time)."""

    model: str
    at_s: float
    phase: int
    counted: bool


@dataclass(slots=True)
class Tally:
    """Counts each request of a run as it is sent and answered, into the ``Run`` record the
    virtual run makes and into ``Counts``. Latency runs from when a request was due, so a
    client that falls behind shows as latency rather than as a lower rate."""

    run: Run
    counts: Counts
    slo_s: float
    measured_from_s: float

    def sent(self, arrival: Arrival) -> None:
        self.counts.sent += 1
        if arrival.phase >= 0:
            self.run.sent_by_second[int(arrival.at_s - self.measured_from_s)] += 1
            self.run.phase_sent[arrival.phase] += arrival.counted

    def failed(self, arrival: Arrival, error: Exception) -> None:
        self.counts.by_status[type(error).__name__] += 1
        if arrival.phase >= 0:
            self.run.phase_errors[arrival.phase] += arrival.counted

    def answered(self, arrival: Arrival, now_s: float) -> None:
        latency_s = now_s - arrival.at_s
        self.counts.ok += 1
        self.counts.ok_latency_s += latency_s
        if arrival.phase >= 0:
            if arrival.counted:
                self.run.phase_latencies_s[arrival.phase].append(latency_s)
            if latency_s <= self.slo_s:
                self.run.ok_by_second[int(arrival.at_s - self.measured_from_s)] += 1


async def arrivals(scenario: Scenario, rate_per_s: float, seed: int,
                   begin_s: float) -> AsyncIterator[Arrival]:
    """The scenario's open-loop requests (a warm-up at the first mix, then the phases), each
    yielded at its time."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    phases = [(WARMUP_S, scenario.phases[0].shares), *((p.seconds, p.shares)
                                                       for p in scenario.phases)]
    phase_start_s = now_s = begin_s
    for index, (seconds, shares) in enumerate(phases):
        names = sorted(shares)
        weights = [shares[n] for n in names]
        while (now_s := now_s + rng.expovariate(rate_per_s)) < phase_start_s + seconds:
            await asyncio.sleep(max(0.0, now_s - loop.time()))
            yield Arrival(rng.choices(names, weights)[0], now_s, index - 1,
                          index > 0 and now_s >= phase_start_s + SETTLE_S)
        phase_start_s += seconds
        now_s = phase_start_s


async def drive(url: str, scenario: Scenario, slo_s: float, rate_per_s: float, seed: int,
                *, streams: int = 0) -> tuple[Run, Counts]:
    """The scenario's traffic against the server at ``url``, one unary ModelInfer call per
    request or, with ``streams``, over that many ModelStreamInfer streams per model; the same
    ``Run`` record as the virtual run (placements over time are not sampled here)."""
    loop = asyncio.get_running_loop()
    begin_s = loop.time()
    phases_s = sum(p.seconds for p in scenario.phases)
    tally = Tally(Run.empty(len(scenario.phases), phases_s), Counts(), slo_s,
                  begin_s + WARMUP_S)
    sample = {"x": np.ones((1, 256), np.float32)}
    async with AsyncClient(url, retries=0) as client:
        # Bounded like the unary calls' deadline: a request left unanswered fails the run.
        send = _streams(client, sample, tally, streams,
                        WARMUP_S + phases_s + ANSWER_TIMEOUT_S) if streams else \
            _unary(client, sample, tally)
        async with send as submit:
            async for arrival in arrivals(scenario, rate_per_s, seed, begin_s):
                tally.sent(arrival)
                submit(arrival)
    return tally.run, tally.counts


@contextlib.asynccontextmanager
async def _unary(client: AsyncClient, sample: Inputs,
                 tally: Tally) -> AsyncIterator[Callable[[Arrival], None]]:
    """One task and one ModelInfer call per request; on exit, every call answered."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def one(arrival: Arrival) -> None:
        try:
            await client.infer(arrival.model, sample, timeout_s=ANSWER_TIMEOUT_S)
        except InferenceServerError as exc:
            tally.failed(arrival, exc)
        else:
            tally.answered(arrival, loop.time())

    def submit(arrival: Arrival) -> None:
        task = loop.create_task(one(arrival))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        yield submit
    finally:
        await asyncio.gather(*tasks)


@contextlib.asynccontextmanager
async def _streams(client: AsyncClient, sample: Inputs, tally: Tally, per_model: int,
                   timeout_s: float) -> AsyncIterator[Callable[[Arrival], None]]:
    """``per_model`` ModelStreamInfer streams per model, opened on its first request and
    taken in turn (a stream writes its answers one at a time, so one stream would answer a
    whole batch in a row); answers matched by request id; on exit, the streams closed once
    every request on them is answered. A stream still open after ``timeout_s`` fails."""
    loop = asyncio.get_running_loop()
    outboxes: dict[tuple[str, int], asyncio.Queue[Inputs | None]] = {}
    sent: dict[tuple[str, int], list[Arrival]] = {}
    turn: collections.Counter[str] = collections.Counter()
    readers: list[asyncio.Task[None]] = []

    async def requests(outbox: asyncio.Queue[Inputs | None]) -> AsyncIterator[Inputs]:
        while (item := await outbox.get()) is not None:
            yield item

    async def read(key: tuple[str, int]) -> None:
        async for result in client.stream_infer(key[0], requests(outboxes[key]),
                                                   timeout_s=timeout_s):
            arrival = sent[key][int(result.request_id)]
            if result.error is not None:
                tally.failed(arrival, result.error)
            else:
                tally.answered(arrival, loop.time())

    def submit(arrival: Arrival) -> None:
        key = (arrival.model, turn[arrival.model] % per_model)
        turn[arrival.model] += 1
        if key not in outboxes:
            outboxes[key], sent[key] = asyncio.Queue(), []
            readers.append(loop.create_task(read(key)))
        sent[key].append(arrival)
        outboxes[key].put_nowait(sample)

    try:
        yield submit
    finally:
        for outbox in outboxes.values():
            outbox.put_nowait(None)
        await asyncio.gather(*readers)


@dataclass(slots=True)
class RealProbes:
    out: Path
    scenario: Scenario
    slo_s: float
    streams: int
    starts: list[Placement] = field(default_factory=list)
    counts: list[Counts] = field(default_factory=list)
    overheads: list[Overheads] = field(default_factory=list)
    moves: list[list[str]] = field(default_factory=list)  # per run, moves_while_counted

    async def measure(self, rate_per_s: float, seed: int) -> Probe:
        config = self.out / "evenflow.toml"
        config.write_text(config_text(self.scenario, self.slo_s))
        server = start(evenflow_argv("--config", str(config), time_admission=True),
                       self.out / f"server-{len(self.counts)}.log")
        try:
            before = await stats_of(server.url)
            self.starts.append(serving_placement(before))
            run, counts = await drive(server.url, self.scenario, self.slo_s, rate_per_s, seed,
                                      streams=self.streams)
            self.overheads.append(await measured_overheads(server.url, self.scenario, counts))
            after = await stats_of(server.url)
        finally:
            server.stop()
        self.counts.append(counts)
        self.moves.append(moves_while_counted(self.scenario, after.placement.recent,
                                              before.uptime_s))
        probe = probe_of(run, rate_per_s, seed)
        phase_p99_ms = ", ".join(f"{p99_s * 1e3:.0f}"
                                 for p99_s in phase_percentiles_s(run, 0.99))
        print(f"  real {rate_per_s:.0f}/s: p99 {probe.p99_s * 1e3:.1f} ms (by phase "
              f"{phase_p99_ms}), errors {probe.error_fraction:.3f}; sent {counts.sent}, ok "
              f"{counts.ok}, {dict(counts.by_status)}, unanswered {counts.unanswered}; "
              f"moves while counted: {'; '.join(self.moves[-1]) or 'none'}", flush=True)
        return probe


def virtual_goodput(scenario: Scenario, slo_s: float, start_placement: Placement,
                    overheads: Overheads = NO_OVERHEADS) -> float:
    async def measure(rate_per_s: float, seed: int) -> Probe:
        run = await run_scenario(scenario, "auto", slo_s, rate_per_s, seed, SETTLE_S,
                                 WARMUP_S, start_placement, overheads)
        return probe_of(run, rate_per_s, seed)

    bound = bound_per_s(scenario, slo_s)
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(search_goodput(measure, _settings(slo_s, bound),
                                                      first_seed=0)).goodput_per_s
    finally:
        loop.close()


def _settings(slo_s: float, bound_per_s: float) -> SearchSettings:
    return SearchSettings(slo_s=slo_s, start_per_s=0.6 * bound_per_s, repeats=1,
                          tolerance=0.05, min_per_s=0.01 * bound_per_s, max_probes=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slo-ms", type=float, default=100.0)
    parser.add_argument("--streams", type=int, default=0,
                        help="send over this many ModelStreamInfer streams per model, not "
                             "unary calls (default 0: unary)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="make every batch cost and the SLO this many times longer "
                             "(default 1: the scenario as it is)")
    parser.add_argument("--out", type=Path, default=Path(".bench/placement_real"))
    args = parser.parse_args()
    if args.time_scale <= 0:
        parser.error("--time-scale must be positive")
    args.out.mkdir(parents=True, exist_ok=True)
    scenario = scaled(next(s for s in SCENARIOS if s.name == "shift"), args.time_scale)
    slo_s = args.slo_ms * args.time_scale / 1e3
    bound = bound_per_s(scenario, slo_s)
    started = time.perf_counter()
    probes = RealProbes(args.out, scenario, slo_s, args.streams)
    real = asyncio.run(search_goodput(probes.measure, _settings(slo_s, bound), first_seed=0))
    first = probes.starts[0]
    virtual = virtual_goodput(scenario, slo_s, first)
    # The runs nearest the goodput load the server as the search's answer does.
    near = sorted(zip(real.probes, probes.overheads, strict=True),
                  key=lambda p: abs(p[0].rate_per_s - real.goodput_per_s))[:3]
    overheads = Overheads(statistics.median(o.transport_s for _, o in near),
                          statistics.median(o.batch_overhead_s for _, o in near))
    calibrated = virtual_goodput(scenario, slo_s, first, overheads)
    lost = sum(c.unanswered for c in probes.counts)
    failed = collections.Counter[str]()
    for counts in probes.counts:
        failed.update(counts.by_status)
    calls = f"{args.streams} ModelStreamInfer streams per model" if args.streams else \
        "unary ModelInfer"
    scale = f", batch costs and SLO x{args.time_scale:g}" if args.time_scale != 1.0 else ""
    summary = (f"shift, SLO {slo_s * 1e3:g} ms{scale}, auto, {calls}: real server "
               f"{real.goodput_per_s:.0f} req/s ({real.goodput_per_s / bound:.2f} of the bound "
               f"{bound:.0f}), virtual time {virtual:.0f} req/s ({virtual / bound:.2f}); "
               f"real / virtual {real.goodput_per_s / virtual:.2f}; virtual time with the real "
               f"server's measured overheads ({overheads.transport_s * 1e3:.1f} ms per request "
               f"outside the server, {overheads.batch_overhead_s * 1e3:.2f} ms per batch) "
               f"{calibrated:.0f} req/s (real / virtual {real.goodput_per_s / calibrated:.2f})."
               f" Over {len(probes.counts)} real runs: "
               f"{sum(c.sent for c in probes.counts)} requests sent, {lost} unanswered, "
               f"failures by kind {dict(failed)}. ({time.perf_counter() - started:.0f} s)")
    print(summary)
    (args.out / "results.json").write_text(json.dumps({
        "summary": summary, "time_scale": args.time_scale, "bound_per_s": bound,
        "real": real.as_dict(),
        "virtual_per_s": virtual, "virtual_with_overheads_per_s": calibrated,
        "overheads": [{"transport_s": o.transport_s, "batch_overhead_s": o.batch_overhead_s}
                      for o in probes.overheads],
        "start_placement": sorted(first), "moves_while_counted": probes.moves,
        "counts": [{"sent": c.sent, "ok": c.ok, "by_status": dict(c.by_status)}
                   for c in probes.counts]}, indent=2))


if __name__ == "__main__":
    main()
