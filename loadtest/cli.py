"""``evenflow loadtest``: measure any KServe v2 server, over gRPC or HTTP/REST.

    evenflow loadtest --url 127.0.0.1:8001 --model mlp --concurrency 1,8,64 --out results/mlp
    evenflow loadtest --url 127.0.0.1:8000 --protocol http --model mlp --concurrency 1,8,64 ...
    evenflow loadtest --url ... --model mlp --rate 200,500,1000 --arrival gamma:2 --out ...
    evenflow loadtest --url ... --model sim --scenario loadtest/scenarios/burst.toml --out ...
    evenflow loadtest --url ... --model sim --slo-ms 50 --start-rate 300 --out results/goodput
    evenflow loadtest compare results/least-work results/round-robin
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from evenflow.client import InferenceServerError
from evenflow.client._endpoint import PROTOCOLS, resolve
from evenflow.client.credentials import Credentials
from evenflow.loadtest.compare import compare
from evenflow.loadtest.inputs import build_request, fetch_metadata, generated_arrays, npz_arrays
from evenflow.loadtest.progress import LiveView, Progress
from evenflow.loadtest.report import environment, write_results
from evenflow.loadtest.scenario import load_scenario, run_scenario
from evenflow.loadtest.server_stats import ServerWatcher
from evenflow.loadtest.slo_search import Probe, SearchSettings, SloGoodput, search_goodput
from evenflow.loadtest.sweep import (
    RECORD_DTYPE,
    SERIES_BIN_S,
    STREAMING_NEEDS_GRPC,
    GeneratorShare,
    LoadSpec,
    PointResult,
    binned_p99_ms,
    generate,
    summarize,
)
from evenflow.loadtest.targets import make_target


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evenflow loadtest", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--url", required=True,
                   help="HOST:PORT of a KServe v2 server (its HTTP port with --protocol http), "
                        "or an http(s):// URL")
    p.add_argument("--protocol", choices=PROTOCOLS, default=None,
                   help="grpc (default) or http: every request over HTTP/REST with Triton's "
                        "binary tensor data, one keep-alive connection per request in flight "
                        "(an http:// URL means http)")
    p.add_argument("--grpc-url", help="with --protocol http: the same server's gRPC HOST:PORT, "
                   "for a scenario's admin actions (gRPC only; the server's view of the run "
                   "is read over HTTP)")
    p.add_argument("--model", required=True)
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=_floats, help="closed loop: comma list of N")
    load.add_argument("--rate", type=_floats, help="open loop: comma list of requests/s")
    load.add_argument("--scenario", type=Path, help="a TOML timeline (see loadtest/scenarios)")
    load.add_argument("--slo-ms", type=float, help="search for the highest open-loop rate whose "
                      "p99 of successful requests stays within this many ms (SLO goodput)")
    slo = p.add_argument_group("SLO search (--slo-ms)")
    slo.add_argument("--start-rate", type=float, default=100.0,
                     help="first rate tried, req/s (default 100; the search doubles or halves)")
    slo.add_argument("--max-error-fraction", type=float, default=0.01,
                     help="a rate fails when more of its requests fail (default 0.01)")
    slo.add_argument("--tolerance", type=float, default=0.03,
                     help="stop when the bracket is this narrow, relative (default 0.03)")
    slo.add_argument("--repeats", type=int, default=3,
                     help="runs per rate in the bisection, majority decides (default 3)")
    p.add_argument("--arrival", default="poisson", help="poisson | constant | gamma:CV")
    p.add_argument("--duration-s", type=float, default=10.0, help="per point (default 10)")
    p.add_argument("--warmup-s", type=float, default=2.0, help="per point, not measured")
    p.add_argument("--batch", type=int, default=1, help="samples per request (default 1)")
    p.add_argument("--streaming", action="store_true",
                   help="use ModelStreamInfer (gRPC only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inputs", type=Path, help=".npz with one array per input name")
    p.add_argument("--procs", type=int, default=1, help="generator processes (default 1)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="per-request deadline")
    p.add_argument("--tls", action="store_true", help="connect over TLS (system roots unless "
                                                      "--tls-ca)")
    p.add_argument("--tls-ca", type=Path, help="PEM of the CA that signed the server's cert")
    p.add_argument("--tls-cert", type=Path, help="client certificate (mutual TLS)")
    p.add_argument("--tls-key", type=Path, help="the client certificate's key")
    p.add_argument("--token-file", type=Path,
                   help="bearer token (first line) sent as 'authorization: Bearer TOKEN'")
    p.add_argument("--label", default="", help="name of this run in compare tables")
    p.add_argument("--out", type=Path, required=True, help="folder for results and plots")
    return p


async def run_points(args: argparse.Namespace, request_bytes: bytes) -> list[dict[str, Any]]:
    mode = "concurrency" if args.concurrency else "rate"
    view = LiveView()
    points = []
    for value in args.concurrency or args.rate:
        result = await _run_point(args, request_bytes, view, mode, value, args.seed,
                                  watch_server=True)
        points.append(result.as_dict() | {"warmup_s": args.warmup_s})
    return points


async def _run_point(args: argparse.Namespace, request_bytes: bytes, view: LiveView, mode: str,
                     value: float, seed: int, *, watch_server: bool) -> PointResult:
    """One load point (``mode`` concurrency or rate at ``value``), printed; with
    ``watch_server``, the server's own view after the warm-up too (evenflow servers)."""
    # Spawned generator processes need a few seconds to import; all start together then.
    start_s = time.monotonic() + (4.0 if args.procs > 1 else 0.05)
    spec = LoadSpec(args.url, request_bytes, mode, value, args.warmup_s + args.duration_s,
                    args.arrival, seed, args.streaming, args.timeout_s, start_s,
                    credentials_from_args(args), args.protocol)
    watcher = (ServerWatcher(args.url, args.model, credentials=credentials_from_args(args),
                             protocol=args.protocol) if watch_server else None)

    async def watch_after_warmup() -> None:
        if watcher is not None:
            await asyncio.sleep(max(0.0, start_s + args.warmup_s - time.monotonic()))
            await watcher.start(start_s + args.warmup_s)

    watching = asyncio.create_task(watch_after_warmup())
    progress = Progress()
    label = f"{value:g} {'conc' if mode == 'concurrency' else 'req/s'}"
    drawing = asyncio.create_task(view.watch(progress, label, spec.duration_s))
    try:
        shares = await generate(spec, args.procs, progress)
    finally:
        drawing.cancel()
    await watching
    result = summarize(spec, shares, start_s, args.warmup_s)
    result.duration_s = args.duration_s
    if watcher is not None:
        result.server = (await watcher.stop()).as_dict()
    _print_point(result)
    return result


def _print_point(result: PointResult) -> None:
    latency = result.latency_ms
    errors = sum(v for k, v in result.status_counts.items() if k != "OK")
    unit = {"concurrency": "conc", "rate": "req/s"}.get(result.mode, "")
    name = f"{result.value:>7g} {unit:<5}" if unit else f"{result.mode:>13}"
    print(f"{name} {result.throughput_per_s:>9.1f} req/s  "
          f"p50 {latency.get('p50', float('nan')):7.2f}  "
          f"p90 {latency.get('p90', float('nan')):7.2f}"
          f"  p99 {latency.get('p99', float('nan')):7.2f}  p99.9 "
          f"{latency.get('p99.9', float('nan')):7.2f} ms  errors {errors}  "
          f"gen cpu {result.generator_cpu_fraction:.0%}", flush=True)
    breakdown = result.server.get("breakdown_ms", {})
    if breakdown:
        print("        server: " + "  ".join(f"{k} {v:.2f} ms" for k, v in breakdown.items()))
    for warning in result.warnings:
        print(f"        warning: {warning}", file=sys.stderr)


async def run_timeline(args: argparse.Namespace, request_bytes: bytes) -> list[dict[str, Any]]:
    from evenflow.proto import grpc_service_pb2 as pb

    scenario = load_scenario(args.scenario)
    target = make_target(args.url, args.protocol, pb.ModelInferRequest.FromString(request_bytes),
                         timeout_s=args.timeout_s, credentials=credentials_from_args(args))
    watcher = ServerWatcher(args.url, args.model, credentials=credentials_from_args(args),
                            protocol=args.protocol)
    await watcher.start(time.monotonic())
    cpu_before_s, wall_before_s = time.process_time(), time.monotonic()
    try:
        records, events, start_s = await run_scenario(scenario, target, args.seed,
                                                      admin_url(args),
                                                      credentials_from_args(args))
    finally:
        await target.close()
    cpu_s, wall_s = time.process_time() - cpu_before_s, time.monotonic() - wall_before_s
    server = await watcher.stop()
    spec = LoadSpec(args.url, request_bytes, "scenario", 0, scenario.duration_s)
    array = np.array([(r.intended_s, r.sent_s, r.done_s, r.status) for r in records],
                     dtype=RECORD_DTYPE)
    result = summarize(spec, [GeneratorShare(array, cpu_s, wall_s, 0)], start_s, 0.0,
                       bin_s=SERIES_BIN_S)
    result.server = server.as_dict()
    point = result.as_dict() | {"warmup_s": 0.0, "scenario": scenario.name,
                                "events": events, "throughput_series_bin_s": SERIES_BIN_S,
                                "p99_series_ms": binned_p99_ms(array, start_s,
                                                               scenario.duration_s,
                                                               SERIES_BIN_S)}
    for t_s, what in events:
        print(f"  t={t_s:6.2f} s  {what}")
    _print_point(result)
    return [point]


async def run_slo_search(args: argparse.Namespace,
                         request_bytes: bytes) -> tuple[list[dict[str, Any]], SloGoodput]:
    """The SLO search, one open-loop point per probe; every point is kept for the report."""
    points: list[dict[str, Any]] = []
    view = LiveView()
    settings = SearchSettings(slo_s=args.slo_ms / 1e3, start_per_s=args.start_rate,
                              max_error_fraction=args.max_error_fraction,
                              tolerance=args.tolerance, repeats=args.repeats)

    async def measure(rate_per_s: float, seed: int) -> Probe:
        result = await _run_point(args, request_bytes, view, "rate", rate_per_s, seed,
                                  watch_server=False)
        points.append(result.as_dict() | {"warmup_s": args.warmup_s, "seed": seed})
        return probe_of(result, seed)

    found = await search_goodput(measure, settings, first_seed=args.seed)
    print(f"SLO goodput (p99 <= {args.slo_ms:g} ms, errors <= {args.max_error_fraction:.1%}): "
          f"{found.goodput_per_s:.1f} req/s (range {found.low_per_s:.1f}-"
          f"{found.high_per_s:.1f}, {len(found.probes)} runs)")
    return points, found


def probe_of(result: PointResult, seed: int) -> Probe:
    """One load point as a run of the SLO search."""
    total = sum(result.status_counts.values())
    errors = total - result.status_counts.get("OK", 0)
    latency = result.latency_ms
    return Probe(result.value, seed, latency.get("p50", math.nan) / 1e3,
                 latency.get("p99", math.nan) / 1e3, errors / total if total else 0.0,
                 result.throughput_per_s)


def admin_url(args: argparse.Namespace) -> str | None:
    """Where a scenario's admin actions go (gRPC only): --url when the load is gRPC, else
    --grpc-url (None: not given)."""
    return args.url if args.protocol == "grpc" else args.grpc_url


def check_protocol(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Settle ``args.protocol`` from --protocol and the URL; refuse what HTTP cannot run."""
    try:
        args.protocol = resolve(args.url, args.protocol, credentials_from_args(args)).protocol
    except ValueError as exc:
        p.error(str(exc))
    if args.protocol == "grpc":
        if args.grpc_url is not None:
            p.error("--grpc-url is for --protocol http (gRPC load reads the server at --url)")
        return
    if args.streaming:
        p.error(STREAMING_NEEDS_GRPC)
    if args.scenario is not None and args.grpc_url is None \
            and load_scenario(args.scenario).has_actions:
        p.error(f"{args.scenario} has admin actions, which go over gRPC: give the server's "
                "gRPC address with --grpc-url")


def credentials_from_args(args: argparse.Namespace) -> Credentials | None:
    token = args.token_file.read_text().strip().splitlines()[0] if args.token_file else None
    if not (args.tls or args.tls_ca or args.tls_cert or token):
        return None
    return Credentials(tls=args.tls or args.tls_ca is not None or args.tls_cert is not None,
                       ca_file=args.tls_ca, cert_file=args.tls_cert, key_file=args.tls_key,
                       token=token)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        compare_parser = argparse.ArgumentParser(prog="evenflow loadtest compare")
        compare_parser.add_argument("dirs", nargs="+", type=Path)
        compare_parser.add_argument("--out", type=Path, default=None)
        compare_args = compare_parser.parse_args(argv[1:])
        print(compare(compare_args.dirs, compare_args.out))
        return 0
    p = parser()
    args = p.parse_args(argv)
    check_protocol(p, args)
    try:
        metadata = fetch_metadata(args.url, args.model, credentials=credentials_from_args(args),
                                  protocol=args.protocol)
    except InferenceServerError as exc:
        print(f"evenflow loadtest: cannot read {args.model!r}'s metadata at {args.url} over "
              f"{args.protocol}: {exc}", file=sys.stderr)
        return 2
    arrays = (npz_arrays(args.inputs, metadata) if args.inputs
              else generated_arrays(metadata, args.batch, args.seed))
    request_bytes = build_request(args.model, arrays).SerializeToString()
    print(f"load over {args.protocol} to {args.url}, model {args.model!r}", flush=True)
    payload: dict[str, Any] = {
        "url": args.url, "protocol": args.protocol, "model": args.model, "label": args.label,
        "environment": environment(),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    if args.slo_ms is not None:
        payload["points"], found = asyncio.run(run_slo_search(args, request_bytes))
        payload["slo_search"] = found.as_dict()
    else:
        runner = run_timeline if args.scenario else run_points
        payload["points"] = asyncio.run(runner(args, request_bytes))
    write_results(args.out, payload)
    print(f"results in {args.out}/ (results.json, results.csv, report.md, plots)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
