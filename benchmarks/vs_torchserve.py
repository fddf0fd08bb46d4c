"""evenflow against TorchServe on the same machine: the reference ``mlp`` (the same traced
weights in both), one sample per request, perf_analyzer closed loops, servers alternated.

TorchServe is not a dependency; install it in a virtual environment of its own, outside the
repository (it needs a Java 17 runtime on PATH), and point ``--torchserve`` at its script:

    python3 -m venv /work/ts && /work/ts/bin/python -m pip install torch==2.13.0 \\
        torchserve==0.12.0 torch-model-archiver==0.12.0 pyyaml numpy
    python -m benchmarks.vs_torchserve --torchserve /work/ts/bin/torchserve \\
        [--concurrency 1,16,64] [--repeats 3] [--window-ms 4000] [--protocols grpc,http] \\
        [--evenflow-modes "evenflow=;evenflow-fe2=--frontends 2"] [--streaming] [--with-echo]

``--protocols`` says how perf_analyzer drives each evenflow mode: ``grpc`` (KServe v2 gRPC unary
calls, the series named after the mode), ``http`` (KServe v2 REST on the mode's HTTP port, ``-i
http`` with binary tensors, perf_analyzer's default, as NAME+http) and ``http-json`` (the same
with ``--input-tensor-format json``, as NAME+http-json); the default is ``grpc,http``.
``--evenflow-modes`` alternates several evenflow configurations with TorchServe in one run (the
best mode for a machine is a measurement, not a guess); ``--streaming`` measures each of them over
ModelStreamInfer as well (perf_analyzer ``--streaming``: one stream per concurrency slot, one
request in flight on each, so the same closed loop without gRPC's per-call set-up);
``--with-echo`` adds the bare grpc.aio echo server, the ceiling of any gRPC front-end written on
grpc.aio on the same cores (over unary calls). Within each concurrency, every repeat measures
every series once, in the same order (A B C A B C), so drift on the shared machine hits all.

TorchServe runs as it is usually deployed for this: one worker, ``batchSize`` 64 and
``maxBatchDelay`` 3 ms, one torch thread (``OMP_NUM_THREADS=1``), token authorization off,
driven through its HTTP inference API (perf_analyzer's ``torchserve`` service kind posts the
raw float32 bytes); evenflow with its defaults (admission by time off, as in every closed-loop
benchmark here: perf_analyzer stops at the first refusal), one CPU device, one torch thread.
Before measuring, every answer (TorchServe's; evenflow's over unary, streaming and, with an HTTP
series, HTTP calls) is checked equal to the model called directly. Everything runs on loopback.

Prints infer/s (median, min..max), p50 and p99 (medians) per series and concurrency with the
series / TorchServe ratio; then, for each HTTP series, its infer/s over TorchServe's and over the
same mode's gRPC unary series, each the median and range of the per-repeat ratios (the two points
of a ratio were measured back to back), beside the three p99s; then issue 21's acceptance at
concurrency 64 (evenflow HTTP >= 1.3x TorchServe with a lower p99, >= 0.9x evenflow gRPC). A
point perf_analyzer cannot measure stably is left out and listed. Writes
``.bench/vs_torchserve.json`` (rows with every repeat's point, ratios, acceptance, series, load
averages).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import (
    REPO,
    STREAM,
    PerfPoint,
    Server,
    UnstableMeasurement,
    evenflow_argv,
    median,
    perf_analyzer,
    perf_analyzer_torchserve,
    start,
    write_json,
)
from evenflow.client import Client
from evenflow.server.models.builtin import MLP_WIDTH, build_mlp

MODEL = "mlp"
_START_TIMEOUT_S = 180.0

# The kinds of series: what perf_analyzer drives, and against which server.
TORCHSERVE, ECHO, STREAMING = "torchserve", "echo", "stream"
GRPC, HTTP, HTTP_JSON = "grpc", "http", "http-json"
# --protocols: each evenflow mode's label suffix per protocol (gRPC unary keeps the bare name).
PROTOCOLS = {GRPC: "", HTTP: "+http", HTTP_JSON: "+http-json"}
# Issue 21's performance point for the HTTP series with binary tensors.
ACCEPTANCE_CONCURRENCY = 64
MIN_VS_TORCHSERVE = 1.3  # infer/s over TorchServe's, with a lower p99
MIN_VS_GRPC = 0.9  # infer/s over the same evenflow's gRPC unary

# The TorchServe handler: raw float32 rows in, raw float32 rows out, batched by TorchServe.
HANDLER = '''
import numpy as np
import torch
from ts.torch_handler.base_handler import BaseHandler


class MlpHandler(BaseHandler):
    def preprocess(self, data):
        rows = [np.frombuffer(bytes(row.get("data") or row.get("body")), dtype=np.float32)
                for row in data]
        return torch.from_numpy(np.stack(rows))

    def inference(self, data, *args, **kwargs):
        with torch.inference_mode():
            return self.model(data)

    def postprocess(self, data):
        return [row.tobytes() for row in data.numpy()]
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_archive(torchserve: Path, work: Path) -> Path:
    """The traced ``mlp`` and the handler, packed by TorchServe's archiver into ``store/``."""
    module = build_mlp().module
    traced = torch.jit.trace(module, torch.zeros(8, MLP_WIDTH))
    traced.save(str(work / "mlp.pt"))
    (work / "handler.py").write_text(HANDLER)
    store = work / "store"
    store.mkdir()
    subprocess.run([str(torchserve.parent / "torch-model-archiver"), "--model-name", MODEL,
                    "--version", "1.0", "--serialized-file", str(work / "mlp.pt"),
                    "--handler", str(work / "handler.py"), "--export-path", str(store)],
                   check=True, cwd=work)
    return store


@contextmanager
def torchserve_running(torchserve: Path, work: Path, store: Path, *, batch_size: int,
                       max_batch_delay_ms: int) -> Iterator[str]:
    """TorchServe in the foreground, in a session of its own (Java front-end and Python worker
    are stopped together); yields its inference address."""
    inference, management, metrics = free_port(), free_port(), free_port()
    models = {MODEL: {"1.0": {"marName": f"{MODEL}.mar", "minWorkers": 1, "maxWorkers": 1,
                              "batchSize": batch_size, "maxBatchDelay": max_batch_delay_ms,
                              "responseTimeout": 120}}}
    config = work / "config.properties"
    config.write_text("\n".join([
        f"inference_address=http://127.0.0.1:{inference}",
        f"management_address=http://127.0.0.1:{management}",
        f"metrics_address=http://127.0.0.1:{metrics}",
        "disable_token_authorization=true", "enable_envvars_config=false",
        "install_py_dep_per_model=false", f"model_store={store}",
        f"load_models={MODEL}.mar", f"models={json.dumps(models)}", ""]))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PATH=f"{torchserve.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    log = (work / "torchserve.log").open("w")
    proc = subprocess.Popen([str(torchserve), "--start", "--foreground", "--ncs", "--ts-config",
                             str(config), "--model-store", str(store)], cwd=work, env=env,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"127.0.0.1:{inference}"
    try:
        _wait_until(proc, lambda: _predict(url, np.zeros(MLP_WIDTH, np.float32)) is not None,
                    f"TorchServe did not serve {MODEL} (log: {work / 'torchserve.log'})")
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        _stop_group(proc)
        log.close()


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM went to the session; wait for every process in it (the Java front-end outlives
    the script that started it), then SIGKILL whatever is left after 30 s."""
    deadline_s = time.monotonic() + 30.0
    try:
        proc.wait(timeout=30.0)
        while time.monotonic() < deadline_s:
            os.killpg(proc.pid, 0)  # raises ProcessLookupError once the group is empty
            time.sleep(0.2)  # waiting for an external server to exit
        os.killpg(proc.pid, signal.SIGKILL)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _predict(url: str, row: np.ndarray) -> np.ndarray | None:
    request = urllib.request.Request(f"http://{url}/predictions/{MODEL}", data=row.tobytes(),
                                     headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return np.frombuffer(answer.read(), np.float32)
    except OSError:
        return None


def _wait_until(proc: subprocess.Popen[bytes], ready: Callable[[], bool], message: str) -> None:
    deadline_s = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline_s and proc.poll() is None:
        if ready():
            return
        time.sleep(0.5)  # polling an external server's start-up, not synchronizing a test
    raise SystemExit(message)


def check_answers(torchserve_url: str, evenflow: Server, row: np.ndarray, *,
                  http: bool) -> None:
    """Both servers answer ``row`` as the model called directly does (evenflow over unary and
    streaming gRPC calls, and over HTTP when ``http``)."""
    with torch.inference_mode():
        expected = build_mlp().module(torch.from_numpy(row[None, :])).numpy()[0]
    served = _predict(torchserve_url, row)
    with Client(evenflow.url) as client:
        ours = client.infer(MODEL, {"x": row[None, :]})["y"][0]
        (streamed,) = client.stream_infer(MODEL, [{"x": row[None, :]}])
    answers = [("TorchServe", served), ("evenflow", ours),
               ("evenflow over ModelStreamInfer",
                None if streamed.outputs is None else streamed.outputs["y"][0])]
    if http:
        with Client(evenflow.http_url, protocol="http") as client:
            answers.append(("evenflow over HTTP", client.infer(MODEL, {"x": row[None, :]})["y"][0]))
    for name, got in answers:
        if got is None or not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
            raise SystemExit(f"{name} answered differently from the model called directly")


@dataclass(frozen=True)
class Series:
    """One line of the table: what perf_analyzer drives (``kind``) against which server."""

    label: str
    kind: str  # TORCHSERVE, GRPC, STREAMING, HTTP, HTTP_JSON or ECHO
    server: str  # the key of its server in ``servers``; "" for TorchServe


def plan_series(modes: dict[str, str], protocols: list[str], *, streaming: bool,
                echo: bool) -> list[Series]:
    """TorchServe first, then each evenflow mode over each protocol, in the order measured in
    every repeat."""
    series = [Series(TORCHSERVE, TORCHSERVE, "")]
    for name in modes:
        series += [Series(f"{name}{PROTOCOLS[protocol]}", protocol, name)
                   for protocol in protocols]
    if streaming:
        series += [Series(f"{name}{STREAM}", STREAMING, name) for name in modes]
    if echo:
        series.append(Series(ECHO, ECHO, ECHO))
    return series


def measure(series: Series, servers: dict[str, Server], ts_url: str, concurrency: int,
            input_data: Path, args: argparse.Namespace) -> PerfPoint:
    if series.kind == TORCHSERVE:
        return perf_analyzer_torchserve(ts_url, MODEL, concurrency, args.out,
                                        input_data=input_data, window_ms=args.window_ms)
    server = servers[series.server]
    if series.kind in (HTTP, HTTP_JSON):
        # Binary tensors are perf_analyzer's default over HTTP, as tritonclient.http's.
        return perf_analyzer(server.http_url, MODEL, concurrency, args.out,
                             window_ms=args.window_ms, protocol="http",
                             extra=("--input-tensor-format", "json")
                             if series.kind == HTTP_JSON else ())
    return perf_analyzer(server.url, MODEL, concurrency, args.out, window_ms=args.window_ms,
                         streaming=series.kind == STREAMING)


def load_average() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


# What each repeat measured: one point per series (None where perf_analyzer found no window
# stable enough to report on this shared machine), by concurrency, in the order measured.
Results = dict[str, dict[int, list[PerfPoint | None]]]


def run(args: argparse.Namespace, all_series: list[Series], modes: dict[str, str],
        concurrencies: list[int], loads: list[str]) -> Results:
    results: Results = {s.label: {c: [] for c in concurrencies} for s in all_series}
    http = any(s.kind in (HTTP, HTTP_JSON) for s in all_series)
    with tempfile.TemporaryDirectory(prefix="evenflow-ts-") as tmp:
        work = Path(tmp)
        store = build_archive(args.torchserve.resolve(), work)
        row = np.random.default_rng(0).standard_normal(MLP_WIDTH).astype(np.float32)
        (work / "x.bin").write_bytes(row.tobytes())
        input_data = work / "data.json"
        input_data.write_text(json.dumps({"data": [{"TORCHSERVE_INPUT": [str(work / "x.bin")]}]}))
        with torchserve_running(args.torchserve.resolve(), work, store,
                                batch_size=args.batch_size,
                                max_batch_delay_ms=args.max_batch_delay_ms) as ts_url:
            servers: dict[str, Server] = {}
            try:
                for name, flags in modes.items():
                    servers[name] = start(evenflow_argv("--model", MODEL, "--devices", "cpu",
                                                        *args.evenflow_args.split(),
                                                        *flags.split()),
                                          args.out / f"vs_torchserve_{name}.log")
                    check_answers(ts_url, servers[name], row, http=http)
                if any(s.kind == ECHO for s in all_series):
                    servers[ECHO] = start([sys.executable, "-m", "benchmarks.echo_server"],
                                          args.out / "vs_torchserve_echo.log")
                for concurrency in concurrencies:
                    for repeat in range(args.repeats):
                        for series in all_series:  # A B C A B C: drift hits all alike
                            loads.append(load_average())
                            point = _point(series, servers, ts_url, concurrency, input_data,
                                           args)
                            results[series.label][concurrency].append(point)
                            print(f"  {series.label:22s} c={concurrency:<3d} rep {repeat}: "
                                  f"{_describe(point)} load {loads[-1]}", flush=True)
            finally:
                for server in servers.values():
                    server.stop()
    return results


def _point(series: Series, servers: dict[str, Server], ts_url: str, concurrency: int,
           input_data: Path, args: argparse.Namespace) -> PerfPoint | None:
    try:
        return measure(series, servers, ts_url, concurrency, input_data, args)
    except UnstableMeasurement as error:  # no stable window in -r trials: left out, goes on
        print(f"  {series.label} c={concurrency}: {str(error).splitlines()[-1]}", flush=True)
        return None


def _describe(point: PerfPoint | None) -> str:
    if point is None:
        return "no stable measurement; left out"
    return (f"{point.infer_per_s:8.0f} infer/s p50 {point.p50_ms:6.2f} ms p99 "
            f"{point.p99_ms:6.2f} ms{'' if point.stable else ' (unstable)'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchserve", type=Path, required=True,
                        help="the torchserve script of an environment that has it")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=64, help="TorchServe's batchSize")
    parser.add_argument("--max-batch-delay-ms", type=int, default=3,
                        help="TorchServe's maxBatchDelay")
    parser.add_argument("--evenflow-args", default="", help="extra evenflow serve flags")
    parser.add_argument("--evenflow-modes", default="evenflow=",
                        help="evenflow servers to alternate with TorchServe, ';'-separated "
                             "NAME=FLAGS, e.g. 'evenflow=;evenflow-fe2=--frontends 2'")
    parser.add_argument("--protocols", default=f"{GRPC},{HTTP}",
                        help=f"how perf_analyzer drives each evenflow mode, comma-separated "
                             f"from {', '.join(PROTOCOLS)}: gRPC unary, HTTP with binary "
                             "tensors, HTTP with JSON tensors")
    parser.add_argument("--streaming", action="store_true",
                        help="measure each evenflow mode over ModelStreamInfer too (perf_analyzer "
                             "--streaming: one stream per concurrency slot), as NAME+stream")
    parser.add_argument("--with-echo", action="store_true",
                        help="alternate the bare grpc.aio echo server too (benchmarks."
                             "echo_server): what a gRPC server that does nothing reaches here")
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    modes = dict(mode.split("=", 1) for mode in args.evenflow_modes.split(";"))
    protocols = args.protocols.split(",")
    if unknown := [p for p in protocols if p not in PROTOCOLS]:
        parser.error(f"unknown protocols {unknown}; choose from {', '.join(PROTOCOLS)}")
    all_series = plan_series(modes, protocols, streaming=args.streaming, echo=args.with_echo)
    loads: list[str] = []
    load_before = load_average()
    print(f"load average before: {load_before}", flush=True)
    results = run(args, all_series, modes, concurrencies, loads)
    load_after = load_average()
    rows = report(results, concurrencies)
    ratio_rows = report_ratios(results, all_series, concurrencies)
    verdicts = acceptance(ratio_rows, all_series)
    print(f"load average before: {load_before}, after: {load_after}")
    write_json(args.out / "vs_torchserve.json",
               {"rows": rows, "ratios": ratio_rows, "acceptance": verdicts,
                "series": [asdict(s) for s in all_series],
                "failed_points": [f"{label} c={c} rep {i}" for label, by_c in results.items()
                                  for c, points in by_c.items()
                                  for i, point in enumerate(points) if point is None],
                "load_average": {"before": load_before, "after": load_after,
                                 "before_each_point": loads},
                "torchserve": {"batch_size": args.batch_size,
                               "max_batch_delay_ms": args.max_batch_delay_ms}})


def _measured(points: list[PerfPoint | None]) -> list[PerfPoint]:
    return [p for p in points if p is not None]


def report(results: Results, concurrencies: list[int]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    print(f"\n{'conc':>4} {'server':>22} {'infer/s (min..max)':>24} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'p99/p50':>7} {'/ TorchServe':>12}")
    for concurrency in concurrencies:
        reference_points = _measured(results[TORCHSERVE][concurrency])
        reference = (median([p.infer_per_s for p in reference_points])
                     if reference_points else float("nan"))
        for name, by_concurrency in results.items():
            points = _measured(by_concurrency[concurrency])
            if not points:
                print(f"{concurrency:>4} {name:>22} no stable measurement")
                continue
            tput = [p.infer_per_s for p in points]
            p50_ms, p99_ms = median([p.p50_ms for p in points]), median([p.p99_ms for p in points])
            row = {"concurrency": concurrency, "server": name, "repeats": len(points),
                   "infer_per_s": median(tput),
                   "infer_per_s_min": min(tput), "infer_per_s_max": max(tput),
                   "p50_ms": p50_ms, "p99_ms": p99_ms,
                   "all_stable": all(p.stable for p in points),
                   "ratio_vs_torchserve": median(tput) / reference,
                   "points": [asdict(p) for p in points]}
            rows.append(row)
            print(f"{concurrency:>4} {name:>22} {median(tput):>8.0f} ({min(tput):.0f}.."
                  f"{max(tput):.0f}){'':>3} {p50_ms:>7.2f} {p99_ms:>7.2f} {p99_ms / p50_ms:>7.2f} "
                  f"{median(tput) / reference:>12.2f}{'' if row['all_stable'] else ' *'}")
    print("* = perf_analyzer reported an unstable window for at least one repeat")
    return rows


def paired_ratios(points: list[PerfPoint | None],
                  references: list[PerfPoint | None]) -> list[float]:
    """infer/s over the reference's, repeat by repeat: the two were measured back to back, so
    each ratio sees the same state of the shared machine."""
    return [p.infer_per_s / r.infer_per_s for p, r in zip(points, references, strict=True)
            if p is not None and r is not None]


def _ratio_figures(ratios: list[float]) -> dict[str, float] | None:
    if not ratios:
        return None
    return {"median": median(ratios), "min": min(ratios), "max": max(ratios)}


def _p99_ms(points: list[PerfPoint | None]) -> float | None:
    measured = _measured(points)
    return median([p.p99_ms for p in measured]) if measured else None


def report_ratios(results: Results, all_series: list[Series],
                  concurrencies: list[int]) -> list[dict[str, object]]:
    """Each evenflow HTTP series over TorchServe and over the same mode's gRPC unary series:
    median and range of the per-repeat ratios, with the three p99s."""
    rows: list[dict[str, object]] = []
    http_series = [s for s in all_series if s.kind in (HTTP, HTTP_JSON)]
    if not http_series:
        return rows
    print(f"\n{'conc':>4} {'series':>22} {'/ TorchServe (min..max)':>24} "
          f"{'/ gRPC (min..max)':>20} {'p99 ms':>7} {'TS p99':>7} {'gRPC p99':>8}")
    for concurrency in concurrencies:
        for series in http_series:
            points = results[series.label][concurrency]
            grpc_label = f"{series.server}{PROTOCOLS[GRPC]}"
            grpc_points = results.get(grpc_label, {}).get(concurrency, [])
            row = {"concurrency": concurrency, "series": series.label,
                   "vs_torchserve": _ratio_figures(
                       paired_ratios(points, results[TORCHSERVE][concurrency])),
                   "vs_grpc": (_ratio_figures(paired_ratios(points, grpc_points))
                               if grpc_points else None),
                   "grpc_series": grpc_label if grpc_points else None,
                   "p99_ms": _p99_ms(points),
                   "torchserve_p99_ms": _p99_ms(results[TORCHSERVE][concurrency]),
                   "grpc_p99_ms": _p99_ms(grpc_points)}
            rows.append(row)
            print(f"{concurrency:>4} {series.label:>22} {_range(row['vs_torchserve']):>24} "
                  f"{_range(row['vs_grpc']):>20} {_ms(row['p99_ms']):>7} "
                  f"{_ms(row['torchserve_p99_ms']):>7} {_ms(row['grpc_p99_ms']):>8}")
    return rows


def _range(figures: object) -> str:
    if not isinstance(figures, dict):
        return "-"
    return f"{figures['median']:.2f} ({figures['min']:.2f}..{figures['max']:.2f})"


def _ms(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "-"


def acceptance(ratio_rows: list[dict[str, object]],
               all_series: list[Series]) -> list[dict[str, object]]:
    """Issue 21's performance point at concurrency ACCEPTANCE_CONCURRENCY, for each evenflow
    HTTP series with binary tensors: infer/s >= 1.3x TorchServe's with a lower p99, and
    >= 0.9 of the same mode's gRPC unary infer/s (median per-repeat ratios)."""
    verdicts: list[dict[str, object]] = []
    binary = {s.label for s in all_series if s.kind == HTTP}
    for row in ratio_rows:
        if row["concurrency"] != ACCEPTANCE_CONCURRENCY or row["series"] not in binary:
            continue
        vs_ts, vs_grpc = row["vs_torchserve"], row["vs_grpc"]
        p99_ms, ts_p99_ms = row["p99_ms"], row["torchserve_p99_ms"]
        checks = {
            f"infer/s >= {MIN_VS_TORCHSERVE}x TorchServe":
                None if not isinstance(vs_ts, dict) else vs_ts["median"] >= MIN_VS_TORCHSERVE,
            "p99 below TorchServe's":
                None if not (isinstance(p99_ms, float) and isinstance(ts_p99_ms, float))
                else p99_ms < ts_p99_ms,
            f"infer/s >= {MIN_VS_GRPC}x gRPC unary":
                None if not isinstance(vs_grpc, dict) else vs_grpc["median"] >= MIN_VS_GRPC}
        verdicts.append({"series": row["series"], "concurrency": ACCEPTANCE_CONCURRENCY,
                         "checks": checks})
        print(f"\nissue 21 at c={ACCEPTANCE_CONCURRENCY}, {row['series']}:")
        for check, held in checks.items():
            print(f"  {check}: {'not measured' if held is None else 'holds' if held else 'FAILS'}")
    if not verdicts and binary:
        print(f"\nissue 21's acceptance is checked at concurrency {ACCEPTANCE_CONCURRENCY} "
              "with the http protocol: not in this run")
    return verdicts


if __name__ == "__main__":
    main()
