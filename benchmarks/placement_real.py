"""The shifting-mix placement scenario through a real server over gRPC, beside the same
scenario in virtual time.

    python -m benchmarks.placement_real [--slo-ms 100] [--out .bench/placement_real]

A server on ``sim:1,sim:1,sim:0.5,sim:0.25`` with the scenario's declared memory serves its
three ``sim`` models (their batch costs, memory and a 2 s simulated load time declared in the
configuration file) with ``--placement auto``: replicas are really loaded, warmed up and
drained. A client process sends the scenario's open-loop traffic (a warm-up at the first mix,
then the phases) with evenflow's ``AsyncClient`` and no retries, and counts every answer by
status: a request lost or failed because a replica moved shows there. The SLO search
(``evenflow loadtest --slo-ms``'s) runs over fresh servers, one per probe, judged like the
virtual one (every phase, after the settling time, within the SLO with at most 1 % errors);
the virtual-time search of the same scenario starts from the placement the real server chose
at start. It runs twice: on the bare simulated devices, and with what each real run measured
the server adding (``measured_overheads``: per request outside the server, per batch in the
hand-offs), from the three runs nearest the real goodput.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from benchmarks.harness import evenflow_argv, start
from benchmarks.placement import SCENARIOS
from benchmarks.placement_bound import bound_per_s
from benchmarks.placement_sim import NO_OVERHEADS, Overheads, Run, Scenario, probe_of, run_scenario
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


async def placement_of(url: str) -> Placement:
    async with grpc.aio.insecure_channel(url) as channel:
        stats = await ef_grpc.EvenflowStatsStub(channel).GetStats(ef.GetStatsRequest())
    return frozenset((r.model, r.device) for r in stats.placement.replicas
                     if r.state == "serving")


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


async def drive(url: str, scenario: Scenario, slo_s: float, rate_per_s: float,
                seed: int) -> tuple[Run, Counts]:
    """The scenario's traffic against the server at ``url``; the same ``Run`` record as the
    virtual run (placements over time are not sampled here)."""
    loop = asyncio.get_running_loop()
    phases = [(WARMUP_S, scenario.phases[0].shares), *((p.seconds, p.shares)
                                                       for p in scenario.phases)]
    run = Run.empty(len(scenario.phases), sum(p.seconds for p in scenario.phases))
    counts = Counts()
    sample = {"x": np.ones((1, 256), np.float32)}
    rng = random.Random(seed)
    tasks: set[asyncio.Task[None]] = set()
    async with AsyncClient(url, retries=0) as client:
        async def one(model: str, arrived_s: float, phase: int, counted: bool,
                      measured_from_s: float) -> None:
            try:
                await client.infer(model, sample, timeout_s=30.0)
            except InferenceServerError as exc:
                counts.by_status[type(exc).__name__] += 1
                run.phase_errors[phase] += counted and phase >= 0
                return
            counts.ok += 1
            latency_s = loop.time() - arrived_s
            counts.ok_latency_s += latency_s
            if phase >= 0:
                if counted:
                    run.phase_latencies_s[phase].append(latency_s)
                if latency_s <= slo_s:
                    run.ok_by_second[int(arrived_s - measured_from_s)] += 1

        begin_s = loop.time()
        measured_from_s = begin_s + WARMUP_S
        phase_start_s = begin_s
        now_s = begin_s
        for index, (seconds, shares) in enumerate(phases):
            names = sorted(shares)
            weights = [shares[n] for n in names]
            phase = index - 1
            while (now_s := now_s + rng.expovariate(rate_per_s)) < phase_start_s + seconds:
                await asyncio.sleep(max(0.0, now_s - loop.time()))
                counted = phase >= 0 and now_s >= phase_start_s + SETTLE_S
                if counted:
                    run.phase_sent[phase] += 1
                if phase >= 0:
                    run.sent_by_second[int(now_s - measured_from_s)] += 1
                counts.sent += 1
                task = loop.create_task(one(rng.choices(names, weights)[0], now_s, phase,
                                            counted, measured_from_s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            phase_start_s += seconds
            now_s = phase_start_s
        await asyncio.gather(*tasks)
    return run, counts


@dataclass(slots=True)
class RealProbes:
    out: Path
    scenario: Scenario
    slo_s: float
    starts: list[Placement] = field(default_factory=list)
    counts: list[Counts] = field(default_factory=list)
    overheads: list[Overheads] = field(default_factory=list)

    async def measure(self, rate_per_s: float, seed: int) -> Probe:
        config = self.out / "evenflow.toml"
        config.write_text(config_text(self.scenario, self.slo_s))
        server = start(evenflow_argv("--config", str(config), time_admission=True),
                       self.out / f"server-{len(self.counts)}.log")
        try:
            self.starts.append(await placement_of(server.url))
            run, counts = await drive(server.url, self.scenario, self.slo_s, rate_per_s, seed)
            self.overheads.append(await measured_overheads(server.url, self.scenario, counts))
        finally:
            server.stop()
        self.counts.append(counts)
        probe = probe_of(run, rate_per_s, seed)
        print(f"  real {rate_per_s:.0f}/s: p99 {probe.p99_s * 1e3:.1f} ms, errors "
              f"{probe.error_fraction:.3f}; sent {counts.sent}, ok {counts.ok}, "
              f"{dict(counts.by_status)}, unanswered {counts.unanswered}", flush=True)
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
    parser.add_argument("--out", type=Path, default=Path(".bench/placement_real"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scenario = next(s for s in SCENARIOS if s.name == "shift")
    slo_s = args.slo_ms / 1e3
    bound = bound_per_s(scenario, slo_s)
    started = time.perf_counter()
    probes = RealProbes(args.out, scenario, slo_s)
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
    summary = (f"shift, SLO {args.slo_ms:g} ms, auto: real server {real.goodput_per_s:.0f} "
               f"req/s ({real.goodput_per_s / bound:.2f} of the bound {bound:.0f}), virtual "
               f"time {virtual:.0f} req/s ({virtual / bound:.2f}); real / virtual "
               f"{real.goodput_per_s / virtual:.2f}; virtual time with the real server's "
               f"measured overheads ({overheads.transport_s * 1e3:.1f} ms per request outside "
               f"the server, {overheads.batch_overhead_s * 1e3:.2f} ms per batch) "
               f"{calibrated:.0f} req/s (real / virtual {real.goodput_per_s / calibrated:.2f})."
               f" Over {len(probes.counts)} real runs: "
               f"{sum(c.sent for c in probes.counts)} requests sent, {lost} unanswered, "
               f"failures by kind {dict(failed)}. ({time.perf_counter() - started:.0f} s)")
    print(summary)
    (args.out / "results.json").write_text(json.dumps({
        "summary": summary, "bound_per_s": bound, "real": real.as_dict(),
        "virtual_per_s": virtual, "virtual_with_overheads_per_s": calibrated,
        "overheads": [{"transport_s": o.transport_s, "batch_overhead_s": o.batch_overhead_s}
                      for o in probes.overheads],
        "start_placement": sorted(first),
        "counts": [{"sent": c.sent, "ok": c.ok, "by_status": dict(c.by_status)}
                   for c in probes.counts]}, indent=2))


if __name__ == "__main__":
    main()
