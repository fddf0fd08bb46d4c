"""Does ``evenflow loadtest`` measure the server, not itself? Closed loop at one concurrency
against one evenflow ``mlp`` server, perf_analyzer and the harness alternated A B A B.

    python -m benchmarks.harness_vs_perf_analyzer [--concurrency 16] [--repeats 3]

Prints both tools' throughput and p50 (median of repeats) and their ratios; writes
.bench/harness_vs_perf_analyzer.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import REPO, evenflow_argv, median, perf_analyzer, start, write_json


def harness_point(url: str, concurrency: int, seconds: float, out: Path, procs: int) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "evenflow.server.config.cli", "loadtest", "--url", url,
         "--model", "mlp",
         "--concurrency", str(concurrency), "--duration-s", str(seconds), "--warmup-s", "1",
         "--procs", str(procs), "--out", str(out)],
        check=False, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    point = json.loads((out / "results.json").read_text())["points"][0]
    return {"infer_per_s": point["throughput_per_s"], "p50_ms": point["latency_ms"]["p50"],
            "p99_ms": point["latency_ms"]["p99"],
            "generator_cpu_fraction": point["generator_cpu_fraction"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--procs", type=int, default=1, help="harness generator processes")
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    server = start(evenflow_argv("--model", "mlp", "--devices", "cpu"), args.out / "hvp.log")
    pa, lt = [], []
    try:
        for repeat in range(args.repeats):
            point = perf_analyzer(server.url, "mlp", args.concurrency, args.out,
                                  window_ms=int(args.seconds * 1000 / 3))
            pa.append({"infer_per_s": point.infer_per_s, "p50_ms": point.p50_ms,
                       "p99_ms": point.p99_ms, "stable": point.stable})
            lt.append(harness_point(server.url, args.concurrency, args.seconds,
                                    args.out / f"hvp_{repeat}", args.procs))
            print(f"rep {repeat}: perf_analyzer {pa[-1]['infer_per_s']:.0f}/s p50 "
                  f"{pa[-1]['p50_ms']:.2f} ms | loadtest {lt[-1]['infer_per_s']:.0f}/s p50 "
                  f"{lt[-1]['p50_ms']:.2f} ms (gen cpu {lt[-1]['generator_cpu_fraction']:.0%})",
                  flush=True)
    finally:
        server.stop()
    summary = {}
    for key in ("infer_per_s", "p50_ms", "p99_ms"):
        a, b = median([p[key] for p in pa]), median([p[key] for p in lt])
        summary[key] = {"perf_analyzer": a, "loadtest": b, "ratio_loadtest_to_pa": b / a}
    print(f"\nconcurrency {args.concurrency}, median of {args.repeats}:")
    print(f"{'':>14} {'perf_analyzer':>14} {'loadtest':>10} {'ratio':>7}")
    for key, row in summary.items():
        print(f"{key:>14} {row['perf_analyzer']:>14.2f} {row['loadtest']:>10.2f} "
              f"{row['ratio_loadtest_to_pa']:>7.3f}")
    write_json(args.out / "harness_vs_perf_analyzer.json",
               {"summary": summary, "perf_analyzer": pa, "loadtest": lt, "settings": {
                   "concurrency": args.concurrency, "repeats": args.repeats,
                   "seconds": args.seconds, "procs": args.procs}})


if __name__ == "__main__":
    main()
