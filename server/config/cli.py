"""``evenflow`` command line: ``serve``, ``demo``, ``check-config`` and ``loadtest``.

Flags and the configuration file (``--config``) set the same keys; a flag overrides the file.
Flags default to "not given" so that the file and the defaults in ``server.config`` show
through; the help texts read those defaults rather than restating them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evenflow.balancer import BalancerConfig, Policy
from evenflow.server.config.deployment_file import ConfigError, Problem, file_defaults, load
from evenflow.server.config.server_config import DTYPES, PARTITIONS, PLACEMENTS, ServerConfig
from evenflow.server.edge import event_loop
from evenflow.server.models.builtin import ENCODER_SIZES
from evenflow.server.models.repository import parse_model_arg
from evenflow.server.observability.logs import configure_logging


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag and the file key it sets (``section.key``)."""

    flag: str
    key: str
    help: str
    type: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    const: Any = None  # set: a switch that stores this value

    @property
    def dest(self) -> str:
        return self.key.replace(".", "__")


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers: {text!r}") from None


def _port_or_off(text: str) -> int | str:
    if text == "off":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number or off: {text!r}") from None


def _memory(text: str) -> dict[str, str]:
    pairs = {}
    for part in _names(text):
        device, sep, size = part.partition("=")
        if not sep or not device or not size:
            raise argparse.ArgumentTypeError(f"expected DEVICE=SIZE pairs: {text!r}")
        pairs[device.strip()] = size.strip()
    return pairs


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",")]


_QUEUE_BUDGET = BalancerConfig()  # where the default queueing budget is stated

FLAGS: dict[str, list[Flag]] = {
    "network": [
        Flag("--host", "server.host", "address to bind"),
        Flag("--port", "server.port", "gRPC port (0 picks a free one and prints it)", int),
        Flag("--http-port", "server.http_port",
             "serve the KServe v2 REST API and the devices page (/) on this port beside "
             "gRPC (0: any free port, printed; off: no HTTP)", _port_or_off),
        Flag("--max-message-bytes", "server.max_message_bytes",
             "largest gRPC message in either direction, and largest HTTP request body", int),
        Flag("--max-tensor-elements", "server.max_tensor_elements",
             "most elements one input tensor of a request may have", int),
    ],
    "models and devices": [
        Flag("--devices", "devices.list", "comma list of cuda:N, cpu[:N], sim:SPEED "
             "(default: every GPU, else cpu)", _names),
        Flag("--cpu-threads", "devices.cpu_threads", "torch threads", int),
        Flag("--dtype", "devices.dtype", "precision on GPUs", choices=DTYPES),
        Flag("--warmup-batches", "devices.warmup_batches",
             "batches (sizes 1 up to --max-batch) each replica runs before its model is "
             "READY, kept out of the latency fit and the statistics; 0: none", int),
        Flag("--no-warmup", "devices.warmup_batches", "skip the warm-up batches", const=0),
        Flag("--placement", "server.placement",
             "all: every model a replica on every device; auto: replicas placed and moved "
             "within each device's memory as the demand changes", choices=PLACEMENTS),
        Flag("--device-memory", "devices.memory",
             "memory replicas may use per device, e.g. sim0=16GiB,sim2=8GiB (default: a GPU's "
             "free memory at start less a tenth of its total, or where free memory is not "
             "known its total less a tenth; the machine's RAM for cpu; no limit for sim)",
             _memory),
        Flag("--encoder-size", "builtins.encoder_size",
             "built-in encoder size (bert-base: 12 layers, 768 wide, seq 128)",
             choices=tuple(sorted(ENCODER_SIZES))),
        Flag("--sim-base-ms", "builtins.sim_base_ms",
             "sim model: fixed cost per batch at speed 1", float),
        Flag("--sim-per-sample-ms", "builtins.sim_per_sample_ms",
             "sim model: cost per sample at speed 1", float),
        Flag("--sim-layer-ms", "builtins.sim_layer_ms",
             "simlayers model: per-layer cost at batch 1, speed 1 (comma list)", _floats),
    ],
    "pipeline parallelism": [
        Flag("--pipeline-stages", "balancing.pipeline_stages",
             "devices per replica: each replica is a pipeline of this many stages", int),
        Flag("--pipeline-partition", "balancing.pipeline_partition",
             "cut layers by the exact partitioner or by equal layer counts", choices=PARTITIONS),
        Flag("--no-repartition", "balancing.repartition",
             "keep the first plan even when stage times drift apart", const=False),
    ],
    "balancing and batching (every model's default)": [
        Flag("--policy", "balancing.policy", "how a request picks a replica",
             choices=tuple(p.value for p in Policy)),
        Flag("--batch-policy", "balancing.batch_policy", "batch sizes from latency, or always "
             "--max-batch", choices=("adaptive", "fixed")),
        Flag("--max-batch", "balancing.max_batch", "largest batch", int),
        Flag("--max-wait-ms", "balancing.max_wait_ms",
             "longest a request waits for its batch to fill", float),
        Flag("--latency-target-ms", "balancing.latency_target_ms",
             "per-request latency the batch sizes aim for (not a refusal bound: see --slo-ms)",
             float),
        Flag("--slo-ms", "balancing.slo_ms",
             "declare a latency SLO: refuse at once a request predicted to answer later than "
             "this (RESOURCE_EXHAUSTED); also the latency target unless --latency-target-ms "
             "is given", float),
        Flag("--max-queued-requests", "balancing.max_queued_requests",
             "admission bound per model, in requests; beyond it RESOURCE_EXHAUSTED", int),
        Flag("--max-queue-samples", "balancing.max_queued_samples",
             "admission bound per model, in samples (default: none)", int),
        Flag("--max-queue-delay-ms", "balancing.max_queue_delay_ms",
             "refuse at once a request predicted to wait longer than this for its batch "
             f"(default: {_QUEUE_BUDGET.queue_budget_targets:g} x the latency target, at least "
             f"{_QUEUE_BUDGET.queue_budget_floor_s * 1000:g} ms; none with --slo-ms; inf: "
             "refuse only what would miss its own deadline or the SLO)", float),
        Flag("--no-work-stealing", "balancing.work_stealing",
             "least-work without moving queued work to idle replicas", const=False),
        Flag("--no-late-binding", "balancing.late_binding",
             "least-work without moving a starting batch's jobs to a replica predicted to "
             "finish them sooner", const=False),
        Flag("--watchdog-s", "balancing.watchdog_s",
             "before a replica's latency fit has measured a batch: a worker that has not "
             "finished one after this long (or 10x its predicted time) is lost: out of "
             "routing, its work re-run elsewhere, restarted", float),
        Flag("--watchdog-floor-s", "balancing.watchdog_floor_s",
             "once measured: the watchdog is 10x the batch's predicted time, at least this",
             float),
        Flag("--priority-levels", "balancing.priority_levels",
             "priority levels requests may ask for (parameter 'priority', 1 most urgent)", int),
        Flag("--default-priority-level", "balancing.default_priority_level",
             "level of a request that asks for none (default: the least urgent)", int),
    ],
    "operations": [
        Flag("--admin", "security.admin",
             "serve the admin service (set sim device speeds while serving)", const=True),
        Flag("--allow-any-model-source", "security.allow_any_model_source",
             "model control may load sources the configuration does not name (loading a "
             "source runs its code)", const=True),
        Flag("--tls-cert", "security.tls_cert",
             "serve gRPC, HTTP and metrics over TLS: certificate (PEM)"),
        Flag("--tls-key", "security.tls_key", "the certificate's private key (PEM)"),
        Flag("--tls-client-ca", "security.tls_client_ca",
             "mutual TLS: accept only clients with a certificate signed by this CA (PEM)"),
        Flag("--auth-token-file", "security.auth_token_file",
             "require 'authorization: Bearer TOKEN' (the file's first line; else "
             "$EVENFLOW_AUTH_TOKEN when set); health stays open"),
        Flag("--auth-groups", "security.auth_groups",
             "RPC groups the token guards, comma list of inference, statistics, "
             "model-control, admin", _names),
        Flag("--metrics-port", "server.metrics_port",
             "serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port; "
             "not given: no metrics are served)", int),
        Flag("--frontends", "server.frontends",
             "gRPC front-end processes sharing the port around one engine process (decode "
             "and encode spread over cores; 1: one process serves everything)", int),
        Flag("--workers", "server.workers",
             "where device workers run: thread (in the engine process) or process (one "
             "process per replica: a crash or hang stays there and is restarted) or ray (one "
             "Ray actor per replica, on any node of a Ray cluster; pip install evenflow[ray])",
             choices=("thread", "process", "ray")),
        Flag("--ray-address", "server.ray_address",
             "with --workers ray: the cluster to join (auto, HOST:PORT, ray://...), or local: "
             "a private Ray instance on this machine, bound to 127.0.0.1"),
        Flag("--ray-placement-timeout-s", "server.ray_placement_timeout_s",
             "with --workers ray: how long start-up waits for the cluster to place a "
             "replica's actor before failing with what it asked for and what the cluster has",
             float),
        Flag("--shutdown-grace-s", "server.shutdown_grace_s",
             "on SIGTERM, how long in-flight requests get", float),
        Flag("--gil-switch-interval-us", "server.gil_switch_interval_us",
             "Python GIL switch interval (Python's own is 5000)", float),
        Flag("--log-level", "server.log_level", "logging threshold",
             choices=("DEBUG", "INFO", "WARNING", "ERROR")),
        Flag("--log-format", "server.log_format",
             "text, or json: one object a line with the request id where there is one",
             choices=("text", "json")),
    ],
}


def _default_text(key: str) -> str:
    section, name = key.split(".")
    value = file_defaults()[section][name]
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def add_serve_arguments(parser: argparse.ArgumentParser, *, config_flag: bool = True) -> None:
    if config_flag:
            parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                            help="a TOML configuration file (flags override it); see "
                                 "deploy/evenflow.toml")
    parser.add_argument("--model", action="append", default=[], metavar="NAME[=SOURCE]",
                        help="built-in (mlp, encoder, sim, simlayers), NAME=package.module:"
                             "factory, NAME=file.pt (TorchScript) or NAME=file.pt2 "
                             "(torch.export); repeat for several (default: mlp)")
    for title, flags in FLAGS.items():
        group = parser.add_argument_group(title)
        for flag in flags:
            default = _default_text(flag.key)
            help_text = f"{flag.help} (default {default})" if default and flag.const is None \
                else flag.help
            if flag.const is not None:
                group.add_argument(flag.flag, dest=flag.dest, action="store_const",
                                   const=flag.const, default=None, help=help_text)
            else:
                group.add_argument(flag.flag, dest=flag.dest, type=flag.type,
                                   choices=flag.choices, default=None, help=help_text,
                                   metavar=None if flag.choices else flag.key.split(".")[1].upper())


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keys the command line sets, as nested tables laid over the file."""
    overrides: dict[str, Any] = {}
    for flags in FLAGS.values():
        for flag in flags:
            value = getattr(args, flag.dest)
            if value is not None:
                section, name = flag.key.split(".")
                overrides.setdefault(section, {})[name] = value
    models: dict[str, Any] = {}
    for arg in args.model:
        name, source = parse_model_arg(arg)
        if name in models:
            raise ConfigError("command line", [Problem(
                "--model", arg, f"model {name!r} given twice: one --model per name")])
        models[name] = {"source": source}
    if models:
        overrides["models"] = models
    return overrides


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The configuration file (if any) with the flags over it; raises ConfigError."""
    return load(args.config, overrides_from_args(args))


def _check_config(args: argparse.Namespace) -> int:
    try:
        config = load(args.file, overrides_from_args(args))
    except (ConfigError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    models = ", ".join(f"{m.name}={m.source}{'' if m.load_at_start else ' (not loaded)'}"
                       for m in config.model_configs())
    print(f"{args.file}: ok; models: {models}; devices: {config.devices or 'default'}")
    if note := config.unused_placement_note():
        print(f"{args.file}: note: {note}")
    return 0


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
    check_parser = commands.add_parser(
        "check-config", help="validate a configuration file (and flags) without serving")
    check_parser.add_argument("file", type=Path, help="the TOML file")
    add_serve_arguments(check_parser, config_flag=False)
    commands.add_parser("loadtest", help="measure a KServe v2 server (see evenflow loadtest -h)",
                        add_help=False)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["loadtest"]:
        from evenflow.loadtest.cli import main as loadtest_main

        return loadtest_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "check-config":
        return _check_config(args)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"evenflow {args.command}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        parser.error(str(exc))
    configure_logging(config.log_level, config.log_format)
    if args.command == "demo":
        from evenflow.server.engine.demo import run_demo

        return int(event_loop.run(run_demo(config, num_requests=args.requests)))
    from evenflow.server.edge.port_errors import PortUnavailable
    from evenflow.server.engine.app import serve

    try:
        event_loop.run(serve(config))
    except PortUnavailable as exc:
        print(f"evenflow serve: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
