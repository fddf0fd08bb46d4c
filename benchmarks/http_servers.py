"""The HTTP server candidates for evenflow's KServe v2 REST API, side by side under perf_analyzer
``-i http``: uvicorn+httptools serving a raw ASGI app, aiohttp's low-level server, and granian's
embedded server (ASGI).

Each candidate runs in its own process on a uvloop event loop that also carries an idle grpc.aio
server (the do-nothing ``benchmarks.echo_server`` servicer), as evenflow's front-end would: the
HTTP server must share the loop with grpc.aio. All three answer through the same function
(``answer``: method, path, headers, body in; status, headers, body parts out) behind a thin
adapter each: just what perf_analyzer needs for one model ``mlp`` (input ``x`` FP32 [-1, 256]),
the infer call echoing ``x`` back as ``y`` with Triton's binary tensor data extension.

    python -m benchmarks.http_servers [--servers uvicorn,aiohttp,granian] [--concurrency 1,16,64]
                                      [--repeats 3] [--window-ms 2000]

Candidates are alternated within each repeat (A B C A B C) so drift hits them all; each also gets
one ``--input-tensor-format json`` point at the highest concurrency, and the gRPC echo server is
measured at that concurrency in every repeat as the reference line. Prints infer/s and p99
(median over repeats, min..max), the server's CPU per request, and the load averages; writes the
JSON to .bench/http_servers.json.

``python -m benchmarks.http_servers --serve NAME --port 0`` runs one candidate alone and prints
``NAME grpc on HOST:PORT`` then ``NAME listening on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import time
from array import array
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import uvloop

from benchmarks.echo_server import EchoServicer, build_server
from benchmarks.harness import (
    REPO,
    PerfPoint,
    Protocol,
    Server,
    UnstableMeasurement,
    median,
    perf_analyzer,
    start,
    write_json,
)

MODEL = "mlp"
CANDIDATES = ("uvicorn", "aiohttp", "granian")
ECHO = "grpc-echo"  # the reference line's name
JSON_INPUT = "+json-in"  # suffix of a series sent with --input-tensor-format json
HEADER_LENGTH = b"inference-header-content-length"
INFER_PATH = f"/v2/models/{MODEL}/infer"


# --- the handler every candidate serves --------------------------------------------------------

class Answer(NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]  # without Content-Length: each server frames the body
    body: list[bytes | memoryview]


class InferInput(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    data: list[float] | None = None


class RequestedOutput(msgspec.Struct):
    name: str
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


class InferRequest(msgspec.Struct):
    inputs: list[InferInput]
    id: str | None = None
    outputs: list[RequestedOutput] = msgspec.field(default_factory=list)
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


_decode_request = msgspec.json.Decoder(InferRequest).decode
_encode = msgspec.json.Encoder().encode
_JSON = [(b"content-type", b"application/json")]


def _json(status: int, payload: Any) -> Answer:
    return Answer(status, _JSON, [_encode(payload)])


def _error(status: int, message: str) -> Answer:
    return _json(status, {"error": message})


def _tensor(name: str) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": [-1, 256]}


def _config_tensor(name: str) -> dict[str, Any]:
    return {"name": name, "data_type": "TYPE_FP32", "dims": [256]}


# What perf_analyzer reads before it sends load: the same model the gRPC echo server describes.
_FIXED: dict[str, Answer] = {
    "/v2/health/live": Answer(200, [], []),
    "/v2/health/ready": Answer(200, [], []),
    f"/v2/models/{MODEL}/ready": Answer(200, [], []),
    "/v2": _json(200, {"name": "echo", "version": "0", "extensions": ["binary_tensor_data"]}),
    f"/v2/models/{MODEL}": _json(200, {"name": MODEL, "versions": ["1"], "platform": "echo",
                                       "inputs": [_tensor("x")], "outputs": [_tensor("y")]}),
    f"/v2/models/{MODEL}/config": _json(200, {
        "name": MODEL, "max_batch_size": 64, "input": [_config_tensor("x")],
        "output": [_config_tensor("y")]}),
}


def answer(method: str, path: str, headers: Iterable[tuple[bytes, bytes]],
           body: bytes) -> Answer:
    """One KServe v2 HTTP request, answered by the echo model: the logic all candidates share."""
    if method == "POST" and path == INFER_PATH:
        return _infer(headers, body)
    if method == "GET" and (fixed := _FIXED.get(path)) is not None:
        return fixed
    return _error(404, f"no route for {method} {path}")


def _infer(headers: Iterable[tuple[bytes, bytes]], body: bytes) -> Answer:
    header_length = len(body)
    for name, value in headers:
        if name.lower() == HEADER_LENGTH:
            header_length = int(value)
            break
    if not 0 < header_length <= len(body):
        return _error(400, f"Inference-Header-Content-Length {header_length} is not within the "
                           f"body's {len(body)} bytes")
    try:
        request = _decode_request(body[:header_length])
    except msgspec.DecodeError as exc:
        return _error(400, f"invalid inference request JSON: {exc}")
    if len(request.inputs) != 1 or request.inputs[0].datatype != "FP32":
        return _error(400, "the echo model takes one FP32 input 'x'")
    tensor = request.inputs[0]
    elements = 1
    for dim in tensor.shape:
        elements *= dim
    raw: bytes | memoryview
    if tensor.data is not None:
        raw = array("f", tensor.data).tobytes()
    else:
        raw = memoryview(body)[header_length:header_length + elements * 4]  # no copy
    if len(raw) != elements * 4:
        return _error(400, f"input 'x' has {len(raw)} bytes for shape {tensor.shape}")
    binary = request.parameters.get("binary_data_output", False) or any(
        out.parameters.get("binary_data", False) for out in request.outputs)
    output: dict[str, Any] = {"name": "y", "datatype": "FP32", "shape": tensor.shape}
    head: dict[str, Any] = {"model_name": MODEL, "model_version": "1", "outputs": [output]}
    if request.id is not None:
        head["id"] = request.id
    if not binary:
        output["data"] = array("f", raw).tolist()
        return _json(200, head)
    output["parameters"] = {"binary_data_size": len(raw)}
    encoded = _encode(head)
    return Answer(200, [(b"content-type", b"application/octet-stream"),
                        (HEADER_LENGTH, str(len(encoded)).encode())], [encoded, raw])


# --- one thin adapter per candidate ------------------------------------------------------------

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def asgi_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The raw ASGI callable uvicorn and granian serve (no framework)."""
    if scope["type"] != "http":
        return
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    # One joined body: the answers are a few KB, and one ASGI send is cheaper than two.
    reply = answer(scope["method"], scope["path"], scope["headers"], b"".join(chunks))
    payload = b"".join(reply.body)
    await send({"type": "http.response.start", "status": reply.status,
                "headers": [*reply.headers, (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def aiohttp_handler(request: Any) -> Any:
    from aiohttp import web

    reply = answer(request.method, request.path, request.raw_headers, await request.read())
    return web.Response(status=reply.status, body=b"".join(reply.body),
                        headers={k.decode(): v.decode() for k, v in reply.headers})


@dataclass
class Running:
    port: int
    stop: Callable[[], Awaitable[None]]


async def run_uvicorn(host: str, port: int) -> Running:
    import uvicorn

    config = uvicorn.Config(asgi_app, host=host, port=port, http="httptools", loop="none",
                            lifespan="off", access_log=False, log_level="warning")
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup()  # not serve(): that installs its own signal handlers
    # main_loop refreshes the Date header each second and returns once should_exit is set.
    ticking = asyncio.create_task(server.main_loop())

    async def stop() -> None:
        server.should_exit = True
        await ticking
        await server.shutdown()

    return Running(server.servers[0].sockets[0].getsockname()[1], stop)


async def run_aiohttp(host: str, port: int) -> Running:
    from aiohttp import web

    handler = web.Server(aiohttp_handler, access_log=None)
    listener = await asyncio.get_running_loop().create_server(handler, host, port)

    async def stop() -> None:
        listener.close()
        await listener.wait_closed()
        await handler.shutdown(5)

    return Running(listener.sockets[0].getsockname()[1], stop)


async def run_granian(host: str, port: int) -> Running:
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server as Granian

    if port == 0:
        # granian's listener reports no bound port: take a free one (a benchmark-only race).
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
    server = Granian(asgi_app, address=host, port=port, interface=Interfaces.ASGINL,
                     http=HTTPModes.http1, websockets=False, runtime_threads=1,
                     log_enabled=False)
    # Python callbacks run on this loop; granian's Rust runtime thread does the socket I/O.
    serving = asyncio.create_task(server.serve())
    await _until_accepting(host, port, serving)

    async def stop() -> None:
        server.stop()
        await serving

    return Running(port, stop)


async def _until_accepting(host: str, port: int, serving: asyncio.Task[None],
                           timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if serving.done():
            serving.result()
            raise RuntimeError("granian stopped before it listened")
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.05)  # polls a listener another thread opens; no event to await
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise RuntimeError(f"granian did not listen on {host}:{port} within {timeout_s} s")


RUNNERS: dict[str, Callable[[str, int], Awaitable[Running]]] = {
    "uvicorn": run_uvicorn, "aiohttp": run_aiohttp, "granian": run_granian}


async def serve(name: str, host: str, port: int) -> None:
    """One candidate beside an idle grpc.aio server on this process's loop, until SIGTERM."""
    grpc_server, grpc_port = build_server(EchoServicer(), host, 0)
    await grpc_server.start()
    running = await RUNNERS[name](host, port)
    print(f"{name} grpc on {host}:{grpc_port}", flush=True)
    print(f"{name} listening on {host}:{running.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.stop()
    await grpc_server.stop(5)


# --- the measurement ---------------------------------------------------------------------------

@dataclass
class Sample:
    point: PerfPoint
    cpu_per_request_us: float  # the server's CPU over the whole run / requests in it


def _grpc_port(server: Server) -> str:
    (line,) = [line for line in server.banner if " grpc on " in line]
    return line.split()[-1]


def _check_shared_loop(name: str, server: Server) -> None:
    """The idle gRPC server on the candidate's loop still answers while HTTP serves."""
    import grpc

    from evenflow.proto import grpc_service_pb2 as pb
    from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

    with grpc.insecure_channel(_grpc_port(server)) as channel:
        ready = pb_grpc.GRPCInferenceServiceStub(channel).ServerReady(
            pb.ServerReadyRequest(), timeout=10)
    if not ready.ready:
        raise RuntimeError(f"{name}'s gRPC server is not ready")


def measure(server: Server, concurrency: int, out: Path, window_ms: int,
            extra: tuple[str, ...], protocol: Protocol) -> Sample:
    cpu_before_s, wall_before_s = server.cpu_s(), time.monotonic()
    point = perf_analyzer(server.url, MODEL, concurrency, out, window_ms=window_ms, extra=extra,
                          protocol=protocol)
    cpu_s, wall_s = server.cpu_s() - cpu_before_s, time.monotonic() - wall_before_s
    # perf_analyzer keeps the load on from its first window to its last: requests ~ rate x wall.
    return Sample(point, cpu_s / max(point.infer_per_s * wall_s, 1.0) * 1e6)


def _loadavg() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def summarize(series: dict[str, dict[int, list[Sample]]]) -> list[dict[str, Any]]:
    rows = []
    concurrencies = sorted({c for by_concurrency in series.values() for c in by_concurrency})
    for concurrency in concurrencies:  # then in the order measured: candidates, echo, JSON
        for name, by_concurrency in series.items():
            if not (samples := by_concurrency.get(concurrency)):
                continue
            tput = [s.point.infer_per_s for s in samples]
            p99 = [s.point.p99_ms for s in samples]
            rows.append({"server": name, "concurrency": concurrency, "repeats": len(samples),
                         "infer_per_s": median(tput), "infer_per_s_min": min(tput),
                         "infer_per_s_max": max(tput), "p99_ms": median(p99),
                         "p99_ms_min": min(p99), "p99_ms_max": max(p99),
                         "cpu_per_request_us": median([s.cpu_per_request_us for s in samples]),
                         "generator_cpu_s": median([s.point.generator_cpu_s for s in samples]),
                         "all_stable": all(s.point.stable for s in samples)})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\n| server | conc | runs | infer/s median (min..max) | p99 ms median (min..max) "
          "| server CPU us/req |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['server']}{'' if row['all_stable'] else ' *'} | {row['concurrency']} "
              f"| {row['repeats']} | {row['infer_per_s']:.0f} ({row['infer_per_s_min']:.0f}.."
              f"{row['infer_per_s_max']:.0f}) | {row['p99_ms']:.2f} ({row['p99_ms_min']:.2f}.."
              f"{row['p99_ms_max']:.2f}) | {row['cpu_per_request_us']:.0f} |")
    print("* = perf_analyzer reported an unstable window in at least one repeat")


def run_benchmark(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.servers.split(",")
    if unknown := set(names) - set(CANDIDATES):
        raise SystemExit(f"unknown servers {sorted(unknown)}; choose from {CANDIDATES}")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    top = max(concurrencies)
    print(f"load average before: {_loadavg()}", flush=True)
    servers: dict[str, Server] = {}
    try:
        for name in names:
            servers[name] = start([sys.executable, "-m", "benchmarks.http_servers", "--serve",
                                   name], args.out / f"http-{name}.log")
            _check_shared_loop(name, servers[name])
        if args.echo:
            servers[ECHO] = start([sys.executable, "-m", "benchmarks.echo_server"],
                                  args.out / "echo.log")
        series: dict[str, dict[int, list[Sample]]] = {}
        loads: list[str] = []
        failed: list[str] = []

        def point(label: str, server: Server, concurrency: int, extra: tuple[str, ...]) -> None:
            loads.append(_loadavg())
            try:
                sample = measure(server, concurrency, args.out, args.window_ms, extra,
                                 "grpc" if label == ECHO else "http")
            except UnstableMeasurement:  # no figure, the machine is shared; a failure raises
                failed.append(f"{label} c={concurrency}")
                print(f"  {label:18s} c={concurrency:<3d} no stable measurement "
                      f"(load {loads[-1]}); left out", flush=True)
                return
            series.setdefault(label, {}).setdefault(concurrency, []).append(sample)
            print(f"  {label:18s} c={concurrency:<3d} {sample.point.infer_per_s:8.0f} infer/s "
                  f"p99 {sample.point.p99_ms:6.2f} ms cpu {sample.cpu_per_request_us:5.0f} us/req"
                  f"{'' if sample.point.stable else ' (unstable)'} load {loads[-1]}", flush=True)

        for repeat in range(args.repeats):
            print(f"repeat {repeat}", flush=True)
            for concurrency in concurrencies:
                for name in names:  # A B C A B C: drift hits every candidate alike
                    point(name, servers[name], concurrency, ())
                if concurrency == top and args.echo:
                    point(ECHO, servers[ECHO], concurrency, ())
        for name in names:
            point(name + JSON_INPUT, servers[name], top,
                  ("--input-tensor-format", "json"))
    finally:
        for server in servers.values():
            server.stop()
    rows = summarize(series)
    print_table(rows)
    print(f"load average after: {_loadavg()}")
    if failed:
        print(f"left out (perf_analyzer found no stable window): {', '.join(failed)}")
    write_json(args.out / "http_servers.json",
               {"rows": rows, "failed_points": failed, "load_average_before_points": loads})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=CANDIDATES,
                        help="run one candidate (with its idle gRPC server) until SIGTERM")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--servers", default=",".join(CANDIDATES))
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--no-echo", dest="echo", action="store_false",
                        help="leave out the gRPC echo reference line")
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    if args.serve:
        uvloop.run(serve(args.serve, args.host, args.port))
    else:
        run_benchmark(args)


if __name__ == "__main__":
    main()
