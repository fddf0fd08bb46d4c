"""``evenflow`` command line: ``serve``, ``demo`` and ``loadtest``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from evenflow.balancer import BalancerConfig, Policy
from evenflow.server.config import DTYPES, ServerConfig
from evenflow.server.models.builtin import DEFAULT_SIM_LAYER_MS, ENCODER_SIZES
from evenflow.server.models.repository import BuiltinOptions, parse_model_arg
from evenflow.server.models.spec import SimProfile
from evenflow.server.workers.devices import parse_devices


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    net = parser.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    net.add_argument("--port", type=int, default=8001,
                     help="port (default 8001; 0 picks a free one and prints it)")
    net.add_argument("--max-message-bytes", type=int, default=64 * 1024 * 1024,
                     help="largest gRPC message in either direction (default 64 MiB)")
    models = parser.add_argument_group("models and devices")
    models.add_argument("--model", action="append", default=[], metavar="NAME[=SOURCE]",
                        help="built-in (mlp, encoder, sim), NAME=package.module:factory or "
                             "NAME=path/to/file.pt; repeat for several (default: mlp)")
    models.add_argument("--devices", default=None,
                        help="comma list of cuda:N, cpu[:N], sim:SPEED (default: every GPU, "
                             "else cpu)")
    models.add_argument("--cpu-threads", type=int, default=1, help="torch threads (default 1)")
    models.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="precision on GPUs (default float32)")
    models.add_argument("--encoder-size", choices=sorted(ENCODER_SIZES), default="small",
                        help="built-in encoder size (bert-base: 12 layers, 768 wide, seq 128)")
    models.add_argument("--sim-base-ms", type=float, default=10.0,
                        help="sim model: fixed cost per batch at speed 1 (default 10)")
    models.add_argument("--sim-per-sample-ms", type=float, default=2.0,
                        help="sim model: cost per sample at speed 1 (default 2)")
    models.add_argument("--sim-layer-ms", default=",".join(f"{v:g}" for v in DEFAULT_SIM_LAYER_MS),
                        help="simlayers model: per-layer cost at batch 1, speed 1 (comma list)")
    pipe = parser.add_argument_group("pipeline parallelism")
    pipe.add_argument("--pipeline-stages", type=int, default=1,
                      help="devices per replica: each replica is a pipeline of this many stages")
    pipe.add_argument("--pipeline-partition", choices=("optimal", "even"), default="optimal",
                      help="cut layers by the exact partitioner or by equal layer counts")
    pipe.add_argument("--no-repartition", action="store_true",
                      help="keep the first plan even when stage times drift apart")
    sched = parser.add_argument_group("balancing and batching")
    sched.add_argument("--policy", choices=[p.value for p in Policy], default="least-work")
    sched.add_argument("--batch-policy", choices=("adaptive", "fixed"), default="adaptive")
    sched.add_argument("--max-batch", type=int, default=64, help="largest batch (default 64)")
    sched.add_argument("--max-wait-ms", type=float, default=2.0,
                       help="longest a request waits for its batch to fill (default 2)")
    sched.add_argument("--latency-target-ms", type=float, default=50.0,
                       help="per-request latency the batch sizes aim for (default 50)")
    sched.add_argument("--max-queued-requests", type=int, default=4096,
                       help="admission bound per model; beyond it RESOURCE_EXHAUSTED")
    sched.add_argument("--no-work-stealing", action="store_true",
                       help="least-work without moving queued work to idle replicas")
    ops = parser.add_argument_group("operations")
    ops.add_argument("--admin", action="store_true",
                     help="serve the admin service (set sim device speeds while serving)")
    ops.add_argument("--metrics-port", type=int, default=None,
                     help="serve Prometheus metrics at http://HOST:PORT/metrics (0: any free "
                          "port); off unless given")
    ops.add_argument("--shutdown-grace-s", type=float, default=30.0,
                     help="on SIGTERM, how long in-flight requests get (default 30)")
    ops.add_argument("--gil-switch-interval-us", type=float, default=200.0,
                     help="Python GIL switch interval (default 200; Python's own is 5000)")
    ops.add_argument("--log-level", default="INFO")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    models = tuple(parse_model_arg(m) for m in args.model) or (("mlp", "mlp"),)
    names = [name for name, _ in models]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must be unique: {names}")
    if args.devices is not None:
        devices = parse_devices(args.devices)  # fail here, with usage, not after loading
        if args.pipeline_stages < 1 or len(devices) % args.pipeline_stages:
            raise ValueError(f"{len(devices)} devices cannot form pipelines of "
                             f"{args.pipeline_stages} stages")
    balancer = BalancerConfig(
        policy=Policy(args.policy), adaptive_batching=args.batch_policy == "adaptive",
        max_batch=args.max_batch, max_wait_s=args.max_wait_ms / 1000.0,
        latency_target_s=args.latency_target_ms / 1000.0,
        max_queued_requests=args.max_queued_requests, work_stealing=not args.no_work_stealing)
    return ServerConfig(
        host=args.host, port=args.port, max_message_bytes=args.max_message_bytes, models=models,
        devices=args.devices, cpu_threads=args.cpu_threads, dtype=args.dtype, balancer=balancer,
        builtins=BuiltinOptions(encoder_size=args.encoder_size,
                                sim_profile=SimProfile(args.sim_base_ms, args.sim_per_sample_ms),
                                sim_layer_ms=tuple(float(v) for v in args.sim_layer_ms.split(","))),
        pipeline_stages=args.pipeline_stages, pipeline_partition=args.pipeline_partition,
        repartition=not args.no_repartition,
        admin=args.admin, metrics_port=args.metrics_port,
        shutdown_grace_s=args.shutdown_grace_s,
        gil_switch_interval_s=args.gil_switch_interval_us / 1e6)


def _run(coroutine: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it installs
        return asyncio.run(coroutine())
    return uvloop.run(coroutine())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evenflow", description="evenflow inference server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="serve models over KServe v2 gRPC")
    add_serve_arguments(serve_parser)
    demo_parser = commands.add_parser(
        "demo", help="serve a built-in model on a free port, call it, check the answer, stop")
    add_serve_arguments(demo_parser)
    demo_parser.add_argument("--requests", type=int, default=200,
                             help="requests sent after the correctness check (default 200)")
    commands.add_parser("loadtest", help="measure a KServe v2 server (see evenflow loadtest -h)",
                        add_help=False)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["loadtest"]:
        from evenflow.loadtest.cli import main as loadtest_main

        return loadtest_main(argv[1:])
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.command == "demo":
        from evenflow.server.demo import run_demo

        return int(_run(lambda: run_demo(config, num_requests=args.requests)))
    from evenflow.server.app import serve

    _run(lambda: serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
