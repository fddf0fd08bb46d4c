"""evenflow against TorchServe on the same machine: the reference ``mlp`` (the same traced
weights in both), one sample per request, perf_analyzer closed loops, servers alternated.

TorchServe is not a dependency; install it in a virtual environment of its own (it needs a
Java 17 runtime on PATH) and point ``--torchserve`` at its ``torchserve`` script:

    python3 -m venv .ts && .ts/bin/pip install torch==2.13.0 torchserve==0.12.0 \\
        torch-model-archiver==0.12.0 pyyaml numpy
    python -m benchmarks.vs_torchserve --torchserve .ts/bin/torchserve \\
        [--concurrency 1,16,64] [--repeats 3] [--window-ms 4000] \\
        [--evenflow-modes "evenflow=;evenflow-fe2=--frontends 2"] [--streaming] [--with-echo]

``--evenflow-modes`` alternates several evenflow configurations with TorchServe in one run (the
best mode for a machine is a measurement, not a guess); ``--streaming`` measures each of them over
ModelStreamInfer as well (perf_analyzer ``--streaming``: one stream per concurrency slot, one
request in flight on each, so the same closed loop without gRPC's per-call set-up);
``--with-echo`` adds the bare grpc.aio echo server, the ceiling of any gRPC front-end written on
grpc.aio on the same cores (over unary calls).

TorchServe runs as it is usually deployed for this: one worker, ``batchSize`` 64 and
``maxBatchDelay`` 3 ms, one torch thread (``OMP_NUM_THREADS=1``), token authorization off,
driven through its HTTP inference API (perf_analyzer's ``torchserve`` service kind posts the
raw float32 bytes); evenflow with its defaults (admission by time off, as in every closed-loop
benchmark here: perf_analyzer stops at the first refusal) over KServe v2 gRPC, one CPU device,
one torch thread. Before measuring, both answers are checked equal to the model called directly.
Each protocol is the server's own; both run on loopback. Prints infer/s (median, min..max), p50
and p99 (medians) per server and concurrency and evenflow / TorchServe; writes
``.bench/vs_torchserve.json``.
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
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import (
    REPO,
    STREAM,
    PerfPoint,
    Server,
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


def check_answers(torchserve_url: str, evenflow_url: str, row: np.ndarray) -> None:
    """Both servers answer ``row`` as the model called directly does (evenflow over unary and
    streaming calls)."""
    with torch.inference_mode():
        expected = build_mlp().module(torch.from_numpy(row[None, :])).numpy()[0]
    served = _predict(torchserve_url, row)
    with Client(evenflow_url) as client:
        ours = client.infer(MODEL, {"x": row[None, :]})["y"][0]
        (streamed,) = client.stream_infer(MODEL, [{"x": row[None, :]}])
    for name, got in (("TorchServe", served), ("evenflow", ours),
                      ("evenflow over ModelStreamInfer",
                       None if streamed.outputs is None else streamed.outputs["y"][0])):
        if got is None or not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
            raise SystemExit(f"{name} answered differently from the model called directly")


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
    streams = tuple(f"{name}{STREAM}" for name in modes) if args.streaming else ()
    names = ("torchserve", *modes, *streams, *(("echo",) if args.with_echo else ()))
    results: dict[str, dict[int, list[PerfPoint]]] = {n: {c: [] for c in concurrencies}
                                                      for n in names}
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
                    check_answers(ts_url, servers[name].url, row)
                if args.with_echo:
                    servers["echo"] = start([sys.executable, "-m", "benchmarks.echo_server"],
                                            args.out / "vs_torchserve_echo.log")
                for concurrency in concurrencies:
                    for repeat in range(args.repeats):
                        for name in names:  # A B A B: drift hits all alike
                            server, streamed = name.removesuffix(STREAM), name.endswith(STREAM)
                            point = (perf_analyzer_torchserve(
                                ts_url, MODEL, concurrency, args.out, input_data=input_data,
                                window_ms=args.window_ms) if name == "torchserve"
                                else perf_analyzer(servers[server].url, MODEL, concurrency,
                                                   args.out, window_ms=args.window_ms,
                                                   streaming=streamed))
                            results[name][concurrency].append(point)
                            print(f"  {name:18s} c={concurrency:<3d} rep {repeat}: "
                                  f"{point.infer_per_s:8.0f} infer/s p50 {point.p50_ms:6.2f} "
                                  f"ms p99 {point.p99_ms:6.2f} ms"
                                  f"{'' if point.stable else ' (unstable)'}", flush=True)
            finally:
                for server in servers.values():
                    server.stop()
    rows = report(results, concurrencies)
    write_json(args.out / "vs_torchserve.json",
               {"rows": rows, "torchserve": {"batch_size": args.batch_size,
                                             "max_batch_delay_ms": args.max_batch_delay_ms}})


def report(results: dict[str, dict[int, list[PerfPoint]]],
           concurrencies: list[int]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    print(f"\n{'conc':>4} {'server':>18} {'infer/s (min..max)':>24} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'p99/p50':>7} {'/ TorchServe':>12}")
    for concurrency in concurrencies:
        reference = median([p.infer_per_s for p in results["torchserve"][concurrency]])
        for name, by_concurrency in results.items():
            points = by_concurrency[concurrency]
            tput = [p.infer_per_s for p in points]
            p50_ms, p99_ms = median([p.p50_ms for p in points]), median([p.p99_ms for p in points])
            row = {"concurrency": concurrency, "server": name, "infer_per_s": median(tput),
                   "infer_per_s_min": min(tput), "infer_per_s_max": max(tput),
                   "p50_ms": p50_ms, "p99_ms": p99_ms,
                   "all_stable": all(p.stable for p in points),
                   "ratio_vs_torchserve": median(tput) / reference}
            rows.append(row)
            print(f"{concurrency:>4} {name:>18} {median(tput):>8.0f} ({min(tput):.0f}.."
                  f"{max(tput):.0f}){'':>3} {p50_ms:>7.2f} {p99_ms:>7.2f} {p99_ms / p50_ms:>7.2f} "
                  f"{median(tput) / reference:>12.2f}{'' if row['all_stable'] else ' *'}")
    print("* = perf_analyzer reported an unstable window for at least one repeat")
    return rows


if __name__ == "__main__":
    main()
