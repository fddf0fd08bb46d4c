"""SLO goodput per policy and scenario, as a fraction of the computed limit.

    python -m benchmarks.slo_goodput [--slos-ms 50,100] [--repeats 3] [--scenarios steady,...]
                                     [--no-real-time] [--out .bench/slo_goodput]

For every scenario of ``benchmarks.slo_scenarios`` and every SLO, the SLO search of
``evenflow loadtest --slo-ms`` (bisection on the offered rate; p99 of successful requests within
the SLO and at most 1 % errors) runs each policy against the production balancer on simulated
devices in virtual time: least-work, shared-queue and pow2 and round-robin (all with evenflow's
adaptive per-replica batch sizes), and Triton as usually deployed (one shared queue, one fixed
model-wide batch size, here the best one for the fastest device under the SLO). Each search is
repeated with other seeds; the table gives the median goodput as a fraction of the scenario's
computed limit (``evenflow.balancer.capacity``), with the range over repeats. Then, unless
``--no-real-time``, the steady scenario at the first SLO once more through a real server on
``sim`` devices with ``evenflow loadtest``'s own search, to check the virtual-time figure.
Writes results.json, report.md and one plot per scenario and SLO (p99 against offered rate)
under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from benchmarks.slo_scenarios import SCENARIOS, Scenario, Window, probe
from benchmarks.virtual_time import VirtualLoop
from evenflow.balancer import BalancerConfig, Policy
from evenflow.balancer.capacity import DeviceCost, largest_batch_within
from evenflow.loadtest.slo_search import Probe, SearchSettings, SloGoodput, search_goodput


def _adaptive(policy: Policy) -> Callable[[Scenario, float], BalancerConfig]:
    def config(scenario: Scenario, slo_s: float) -> BalancerConfig:
        return BalancerConfig(policy=policy, latency_target_s=slo_s, slo_s=slo_s,
                              max_batch=scenario.max_batch, max_queued_requests=100_000)
    return config


def _triton_like(scenario: Scenario, slo_s: float) -> BalancerConfig:
    fastest = DeviceCost(scenario.base_s, scenario.per_sample_s, max(scenario.speeds))
    size = max(largest_batch_within(fastest, slo_s, scenario.max_batch), scenario.sizes[1])
    return BalancerConfig(policy=Policy.SHARED_QUEUE, adaptive_batching=False, max_batch=size,
                          latency_target_s=slo_s, slo_s=slo_s, max_queued_requests=100_000)


POLICIES: dict[str, Callable[[Scenario, float], BalancerConfig]] = {
    "least-work": _adaptive(Policy.LEAST_WORK),
    "shared-queue": _adaptive(Policy.SHARED_QUEUE),
    "pow2": _adaptive(Policy.POW2),
    "round-robin": _adaptive(Policy.ROUND_ROBIN),
    "triton-like": _triton_like,
}
BASELINES = tuple(name for name in POLICIES if name != "least-work")


@dataclass(frozen=True, slots=True)
class Job:
    scenario: Scenario
    slo_s: float
    policy: str
    repeat: int
    window: Window


def run_search(job: Job) -> SloGoodput:
    """One SLO search in a fresh virtual-time loop (runs in a pool process)."""
    config = POLICIES[job.policy](job.scenario, job.slo_s)
    limit = job.scenario.limit_per_s(job.slo_s)
    settings = SearchSettings(slo_s=job.slo_s, start_per_s=0.5 * limit, repeats=1,
                              min_per_s=0.005 * limit)

    async def measure(rate_per_s: float, seed: int) -> Probe:
        return await probe(job.scenario, config, rate_per_s, seed, job.window)

    loop = VirtualLoop()
    try:
        return loop.run_until_complete(
            search_goodput(measure, settings, first_seed=1000 * job.repeat))
    finally:
        loop.close()


@dataclass(slots=True)
class Row:
    """One scenario, SLO and policy: its searches' goodputs."""

    scenario: str
    slo_s: float
    policy: str
    limit_per_s: float
    searches: list[SloGoodput]

    @property
    def goodputs_per_s(self) -> list[float]:
        return [search.goodput_per_s for search in self.searches]

    @property
    def median_per_s(self) -> float:
        return statistics.median(self.goodputs_per_s)

    def fraction(self, value_per_s: float) -> float:
        return value_per_s / self.limit_per_s if self.limit_per_s else float("nan")

    def cell(self) -> str:
        goodputs = self.goodputs_per_s
        return (f"{self.fraction(self.median_per_s):.2f} ({self.fraction(min(goodputs)):.2f}-"
                f"{self.fraction(max(goodputs)):.2f})")

    def as_dict(self) -> dict[str, object]:
        return {"scenario": self.scenario, "slo_ms": self.slo_s * 1e3, "policy": self.policy,
                "limit_per_s": self.limit_per_s, "median_per_s": self.median_per_s,
                "fraction_of_limit": self.fraction(self.median_per_s),
                "goodputs_per_s": self.goodputs_per_s,
                "searches": [search.as_dict() for search in self.searches]}


def collect(jobs: list[Job], results: list[SloGoodput]) -> list[Row]:
    rows: dict[tuple[str, float, str], Row] = {}
    for job, result in zip(jobs, results, strict=True):
        key = (job.scenario.name, job.slo_s, job.policy)
        if key not in rows:
            rows[key] = Row(*key, job.scenario.limit_per_s(job.slo_s), [])
        rows[key].searches.append(result)
    return list(rows.values())


def table(rows: list[Row]) -> list[str]:
    """Markdown: per scenario and SLO, each policy's median fraction of the limit (range over
    repeats), and least-work's goodput over the best baseline's."""
    policies = list(dict.fromkeys(row.policy for row in rows))
    baselines = [p for p in policies if p in BASELINES]
    lines = ["| scenario | SLO ms | limit req/s | " + " | ".join(policies)
             + " | least-work / best baseline |",
             "|---|---|---|" + "---|" * len(policies) + "---|"]
    groups: dict[tuple[str, float], dict[str, Row]] = {}
    for row in rows:
        groups.setdefault((row.scenario, row.slo_s), {})[row.policy] = row
    for (name, slo_s), cells in groups.items():
        best = max((cells[p].median_per_s for p in baselines), default=math.nan)
        ours = cells["least-work"].median_per_s if "least-work" in cells else math.nan
        ratio = f"{ours / best:.2f}x" if best > 0 else "(every baseline 0)"
        limit = next(iter(cells.values())).limit_per_s
        lines.append(f"| {name} | {slo_s * 1e3:g} | {limit:.0f} | "
                     + " | ".join(cells[p].cell() for p in policies) + f" | {ratio} |")
    return lines


def plot(rows: list[Row], out: Path) -> list[str]:
    """Per scenario and SLO: every probe's p99 against its offered rate, per policy."""
    from evenflow.loadtest.report import plot_slo_probes

    names = []
    groups: dict[tuple[str, float], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.scenario, row.slo_s), []).append(row)
    for (name, slo_s), group in groups.items():
        filename = f"{name}_{slo_s * 1e3:g}ms.png"
        plot_slo_probes(out / filename, {row.policy: [p for s in row.searches for p in s.probes]
                                         for row in group},
                        slo_s=slo_s, limit_per_s=group[0].limit_per_s,
                        title=f"{name}, SLO {slo_s * 1e3:g} ms")
        names.append(filename)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slos-ms", default="50,100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--measured-s", type=float, default=8.0, help="per probe, virtual")
    parser.add_argument("--procs", type=int, default=0, help="search processes (default: cores)")
    parser.add_argument("--no-real-time", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(".bench/slo_goodput"))
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if s.name in args.scenarios.split(",")]
    window = Window(measured_s=args.measured_s)
    jobs = [Job(scenario, float(slo) / 1e3, policy, repeat, window)
            for scenario in chosen for slo in args.slos_ms.split(",")
            for policy in args.policies.split(",") for repeat in range(args.repeats)]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.procs or None) as pool:
        results = list(pool.map(run_search, jobs))
    rows = collect(jobs, results)
    lines = table(rows)
    print("\n".join(lines))
    print(f"({len(jobs)} searches, {sum(len(r.probes) for r in results)} virtual-time runs in "
          f"{time.perf_counter() - started:.0f} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    plots = plot(rows, args.out)
    payload: dict[str, object] = {"rows": [row.as_dict() for row in rows]}
    if not args.no_real_time:
        from benchmarks.slo_real_time import compare_real_time

        payload["real_time"] = check = compare_real_time(
            float(args.slos_ms.split(",")[0]) / 1e3, args.out)
        lines += ["", str(check["summary"])]
    (args.out / "results.json").write_text(json.dumps(payload, indent=2))
    (args.out / "report.md").write_text("\n".join(
        ["# SLO goodput", "", "`python -m benchmarks.slo_goodput`", "", *lines, "",
         *(f"![{name}]({name})" for name in plots)]) + "\n")
    print(f"results in {args.out}/")


if __name__ == "__main__":
    main()
