"""Placement across uneven devices within memory: ``auto`` against a static placement and a
Ray-Serve-like autoscaler, as fractions of a computed bound, in virtual time.

    python -m benchmarks.placement [--slos-ms 50,100] [--repeats 3] [--scenarios shift,...]
                                   [--out .bench/placement]

Four sim devices (speeds 1, 1, 0.5, 0.25; 16, 16, 8 and 8 GiB) serve models whose replicas do
not fit everywhere. Each scenario runs a warm-up at its first phase's demand mix, then its
phases; every strategy starts from the best placement for the first phase (the static
baseline keeps it). A strategy's SLO goodput is the highest total rate at which, in every
phase, requests arriving after ``--settle-s`` (the time a move takes to load and drain) have a
p99 within the SLO and at most 1 % errors (the SLO search of ``evenflow loadtest --slo-ms``);
it is given as a fraction of the scenario's bound (``benchmarks.placement_bound``). Recovery:
at 80 % of the bound, the seconds after each phase change until ``auto``'s live placement is
back within 10 % of the best placement's computed headroom, and until the answers within the
SLO each second are back within 10 % of the requests sent in that second (and stay there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Coroutine
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.placement_bound import bound_per_s, phase_bounds_per_s
from benchmarks.placement_sim import (
    Phase,
    Run,
    Scenario,
    SimModel,
    headroom_over_time,
    probe_of,
    run_scenario,
)
from benchmarks.virtual_time import VirtualLoop
from evenflow.loadtest.slo_search import Probe, SearchSettings, SloGoodput, search_goodput

# Three models of one size and cost (the sim model's 10 ms + 2 ms per sample at speed 1), 7 GiB
# each: a 16 GiB device holds two, an 8 GiB one holds one, so six replicas fit in all. With
# equal costs the mix alone decides the best placement, and a shifted mix has the same bound
# as the first, so a placement that does not follow it shows.
A, B, C = (SimModel(name, 7.0, 0.010, 0.002) for name in "abc")
SEVEN = tuple(SimModel(f"m{i}", 7.0, 0.010, 0.002) for i in range(7))


def _mix(**shares: float) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(shares.items()))


SCENARIOS = (
    Scenario("shift", (A, B, C), (
        Phase(25.0, _mix(a=0.6, b=0.2, c=0.2)),
        Phase(25.0, _mix(a=0.2, b=0.6, c=0.2)))),
    Scenario("slow-down", (A, B, C), (
        Phase(25.0, _mix(a=0.4, b=0.3, c=0.3)),
        Phase(25.0, _mix(a=0.4, b=0.3, c=0.3), slow=((0, 4.0),)))),
    Scenario("hot-model", (A, B, C), (
        Phase(25.0, _mix(a=0.5, b=0.5)),
        Phase(25.0, _mix(a=0.2, b=0.2, c=0.6)))),
    # Seven models: at most six replicas fit at once; the hot three change each phase.
    Scenario("multiplex", SEVEN, (
        Phase(25.0, _mix(m0=0.34, m1=0.33, m2=0.33)),
        Phase(25.0, _mix(m3=0.34, m4=0.33, m5=0.33)),
        Phase(25.0, _mix(m6=0.34, m0=0.33, m3=0.33)))),
)
T = TypeVar("T")
STRATEGIES = ("auto", "static", "ray-like")
BASELINES = ("static", "ray-like")


@dataclass(frozen=True, slots=True)
class Job:
    scenario: Scenario
    slo_s: float
    strategy: str
    repeat: int
    settle_s: float


def run_search(job: Job) -> SloGoodput:
    """One SLO search on a fresh virtual-time loop (runs in a pool process)."""
    bound = bound_per_s(job.scenario, job.slo_s)
    settings = SearchSettings(slo_s=job.slo_s, start_per_s=0.6 * bound, repeats=1,
                              min_per_s=0.01 * bound)

    async def measure(rate_per_s: float, seed: int) -> Probe:
        run = await run_scenario(job.scenario, job.strategy, job.slo_s, rate_per_s, seed,
                                 job.settle_s)
        return probe_of(run, rate_per_s, seed)

    return _on_virtual_loop(search_goodput(measure, settings, first_seed=1000 * job.repeat))


def _on_virtual_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


@dataclass(frozen=True, slots=True)
class Recovery:
    scenario: str
    slo_s: float
    seed: int
    placement_s: list[float]  # per phase change: until the placement is within 10 % of best
    traffic_s: list[float]  # until each second's answers within the SLO are within 10 %


def _first_lasting(times_values: list[tuple[float, bool]], start_s: float,
                   end_s: float) -> float:
    """Seconds from ``start_s`` to the first time in [start_s, end_s) from which every value
    holds until ``end_s``; inf if none does."""
    found = None
    for at_s, ok in times_values:
        if not start_s <= at_s < end_s:
            continue
        if ok and found is None:
            found = at_s
        elif not ok:
            found = None
    return float("inf") if found is None else found - start_s


def answers_recovery_s(run: Run, start_s: float, end_s: float) -> float:
    """Seconds from ``start_s`` until every whole second up to ``end_s`` answers within the
    SLO at least 90 % of the requests sent in it. Compared with the requests actually sent,
    not the mean rate: a second holds 5 % fewer arrivals or more by Poisson chance alone."""
    return _first_lasting(
        [(float(second), ok >= 0.9 * sent) for second, (ok, sent)
         in enumerate(zip(run.ok_by_second, run.sent_by_second, strict=True))],
        start_s, end_s - 1.0)


RECOVERY_SEED = 7


def run_recovery(scenario: Scenario, slo_s: float, seed: int = RECOVERY_SEED) -> Recovery:
    """``auto`` at 80 % of the bound: how long after each phase change it takes to recover."""
    rate = 0.8 * bound_per_s(scenario, slo_s)
    run = _on_virtual_loop(run_scenario(scenario, "auto", slo_s, rate, seed, settle_s=0.0))
    bests = phase_bounds_per_s(scenario, slo_s)
    headroom = headroom_over_time(run, scenario, slo_s, rate)
    placement_s, traffic_s = [], []
    for index in range(1, len(scenario.phases)):
        start_s, end_s = scenario.start_s(index), scenario.start_s(index + 1)
        best = bests[index] / rate
        placement_s.append(_first_lasting(
            [(at_s, value >= 0.9 * best) for at_s, value in headroom], start_s, end_s))
        traffic_s.append(answers_recovery_s(run, start_s, end_s))
    return Recovery(scenario.name, slo_s, seed, placement_s, traffic_s)


def table(jobs: list[Job], results: list[SloGoodput]) -> list[str]:
    cells: dict[tuple[str, float], dict[str, list[float]]] = {}
    for job, result in zip(jobs, results, strict=True):
        bound = bound_per_s(job.scenario, job.slo_s)
        cells.setdefault((job.scenario.name, job.slo_s), {}).setdefault(
            job.strategy, []).append(result.goodput_per_s / bound)
    strategies = list(dict.fromkeys(job.strategy for job in jobs))
    lines = ["| scenario | SLO ms | bound req/s | " + " | ".join(strategies)
             + " | auto / best baseline |", "|---|---|---|" + "---|" * len(strategies) + "---|"]
    for (name, slo_s), row in cells.items():
        scenario = next(job.scenario for job in jobs if job.scenario.name == name)

        def cell(values: list[float]) -> str:
            return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

        best = max((statistics.median(row[b]) for b in BASELINES if b in row), default=0.0)
        ours = statistics.median(row["auto"]) if "auto" in row else 0.0
        ratio = f"{ours / best:.2f}x" if best > 0 else "(baselines 0)"
        lines.append(f"| {name} | {slo_s * 1e3:g} | {bound_per_s(scenario, slo_s):.0f} | "
                     + " | ".join(cell(row[s]) for s in strategies) + f" | {ratio} |")
    return lines


def recovery_table(recoveries: list[Recovery]) -> list[str]:
    """Per scenario and SLO, per phase change: the median and range over seeds."""
    rows: dict[tuple[str, float], list[Recovery]] = {}
    for recovery in recoveries:
        rows.setdefault((recovery.scenario, recovery.slo_s), []).append(recovery)

    def seconds(per_seed: list[list[float]]) -> str:
        return ", ".join(f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
                         for v in zip(*per_seed, strict=True))

    lines = ["| scenario | SLO ms | placement within 10 % of best, s | answers within 10 % of "
             "sent, s |", "|---|---|---|---|"]
    lines += [f"| {name} | {slo_s * 1e3:g} | {seconds([r.placement_s for r in row])} | "
              f"{seconds([r.traffic_s for r in row])} |" for (name, slo_s), row in rows.items()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slos-ms", default="50,100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--settle-s", type=float, default=12.0,
                        help="after a phase change, time left out of its goodput (default 12: "
                             "10 s to react plus the 2 s a replica takes to load)")
    parser.add_argument("--procs", type=int, default=0, help="search processes (default: cores)")
    parser.add_argument("--out", type=Path, default=Path(".bench/placement"))
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if s.name in args.scenarios.split(",")]
    slos = [float(x) / 1e3 for x in args.slos_ms.split(",")]
    jobs = [Job(scenario, slo_s, strategy, repeat, args.settle_s) for scenario in chosen
            for slo_s in slos for strategy in args.strategies.split(",")
            for repeat in range(args.repeats)]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.procs or None) as pool:
        results = list(pool.map(run_search, jobs))
        recovering = [(s, slo, RECOVERY_SEED + r) for s in chosen for slo in slos
                      for r in range(args.repeats)]
        recoveries = list(pool.map(run_recovery, *zip(*recovering, strict=True)))
    lines = table(jobs, results)
    lines += ["", *recovery_table(recoveries)]
    print("\n".join(lines))
    print(f"({len(jobs)} searches, {sum(len(r.probes) for r in results)} virtual-time runs in "
          f"{time.perf_counter() - started:.0f} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"searches": [{"scenario": j.scenario.name, "slo_ms": j.slo_s * 1e3,
                             "strategy": j.strategy, "repeat": j.repeat,
                             "bound_per_s": bound_per_s(j.scenario, j.slo_s), **r.as_dict()}
                            for j, r in zip(jobs, results, strict=True)],
               "recovery": [{"scenario": r.scenario, "slo_ms": r.slo_s * 1e3, "seed": r.seed,
                             "placement_s": r.placement_s, "traffic_s": r.traffic_s}
                            for r in recoveries]}
    (args.out / "results.json").write_text(json.dumps(payload, indent=2))
    (args.out / "report.md").write_text("\n".join(
        ["# Placement", "", "`python -m benchmarks.placement`", "", *lines]) + "\n")
    print(f"results in {args.out}/")


if __name__ == "__main__":
    main()
