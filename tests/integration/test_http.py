"""The KServe v2 REST API of a real ``evenflow serve`` process, in one process and behind
front-end processes: Triton's HTTP clients bit for bit against gRPC, perf_analyzer over HTTP,
model control through tritonclient.http, and what draining does to HTTP calls."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import subprocess
import sys
from typing import Any

import pytest

from tests.servers import TESTS_DIR, perf_analyzer_runs_at, serving_in

# slow: `evenflow serve` processes, tritonclient probe processes and perf_analyzer.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_tritonclient_http_matches_grpc_bit_for_bit_for_every_datatype(types_server) -> None:
    """Sync, gevent ``async_infer`` and ``tritonclient.http.aio``; JSON and binary inputs and
    outputs, mixed in one request; gzip and deflate both ways (see the probe)."""
    if importlib.util.find_spec("tritonclient.http") is None:
        pytest.skip("tritonclient[http] is not installed")
    probe = subprocess.run([sys.executable, str(TESTS_DIR / "triton_http_probe.py"),
                            types_server.http_url, types_server.url],
                           check=False, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-3000:]
    assert "triton http probe: ok" in probe.stdout
    assert probe.stdout.count("bit for bit") >= 20


@pytest.fixture(scope="module", params=["single", "frontends"])
def mlp_server(request, server_factory):  # type: ignore[no-untyped-def]
    # The defaults: perf_analyzer's closed loop must be queued, not refused, over HTTP too.
    with serving_in(request.param):
        return server_factory("--model", "mlp", "--devices", "cpu")


@pytest.mark.perf_analyzer
@pytest.mark.parametrize("tensor_format", ["binary", "json"])
def test_perf_analyzer_over_http_runs_at_1_16_and_64(mlp_server, tensor_format: str) -> None:
    """Each concurrency a short run of its own; the stability window is wide (-s 400) as this
    checks that perf_analyzer works over HTTP end to end, not the numbers."""
    for concurrency in (1, 16, 64):
        output = perf_analyzer_runs_at(
            concurrency, ["-i", "http", "-u", mlp_server.http_url, "-m", "mlp",
                          "--shape", "x:256", "--input-tensor-format", tensor_format,
                          "--output-tensor-format", tensor_format], timeout_s=40)
        assert "Server:" in output  # it read our statistics JSON for the breakdown


async def test_sigterm_answers_admitted_http_calls_and_refuses_new_ones_with_503(
        server_factory) -> None:  # type: ignore[no-untyped-def]
    import aiohttp

    server = server_factory("--model", "sim", "--devices", "sim:1", "--sim-base-ms", "600",
                            "--max-wait-ms", "0", "--latency-target-ms", "5000", "--no-warmup")
    base = f"http://{server.http_url}"
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 256],
                        "data": [3.0] * 256}]}
    async with aiohttp.ClientSession() as session:
        async def infer() -> tuple[int, dict[str, Any]]:
            async with session.post(f"{base}/v2/models/sim/infer", json=body) as response:
                return response.status, await response.json()

        in_flight = asyncio.create_task(infer())
        for _ in range(10_000):  # poll the server's own view until the request is running
            async with session.get(f"{base}/evenflow/v1/stats") as response:
                stats = await response.json()
            if stats["models"][0]["replicas"][0]["running_requests"]:
                break
        else:
            pytest.fail("request never started")
        server.proc.send_signal(signal.SIGTERM)
        for _ in range(10_000):  # until the drain has begun: readiness turns 503
            async with session.get(f"{base}/v2/health/ready") as response:
                if response.status == 503:
                    break
        status, refusal = await infer()
        assert status == 503 and "shutting down" in refusal["error"], refusal
        status, answer = await in_flight
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [3.0] * 256
    assert await asyncio.to_thread(server.proc.wait, 30) == 0


@pytest.mark.parametrize(("flag", "what"), [("--http-port", "HTTP"), ("--port", "gRPC")])
def test_a_taken_port_is_one_clear_line_not_a_traceback(flag: str, what: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        ports = {"--port": "0", "--http-port": "0", flag: port}
        run = subprocess.run([sys.executable, "-m", "evenflow.server.config.cli", "serve",
                              "--model", "sim", "--devices", "sim:1", "--no-warmup",
                              *(arg for pair in ports.items() for arg in pair)],
                             check=False, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    assert f"cannot listen for {what} on 127.0.0.1:{port}" in run.stderr
    assert f"choose another port with {flag}" in run.stderr
