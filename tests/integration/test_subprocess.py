"""A real ``evenflow serve`` process: Triton's clients, perf_analyzer, our sync client, SIGTERM."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from evenflow.client import AsyncClient, Client
from evenflow.proto import evenflow_pb2, evenflow_pb2_grpc
from tests.integration.test_infer import mlp_reference
from tests.servers import TESTS_DIR, perf_analyzer_command

# slow: `evenflow serve` processes, perf_analyzer and the CLI. The tests that serve run in every
# process model (``server_mode``, through ``mlp_server`` or marked); the bad command lines exit
# before anything is served, the same in every mode, so they run once.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
in_every_mode = pytest.mark.usefixtures("server_mode")


@pytest.fixture(scope="module")
def mlp_server(server_mode, server_factory):  # type: ignore[no-untyped-def]
    # Compatibility, not admission: no time bound that a loaded machine could trip.
    return server_factory("--model", "mlp", "--devices", "cpu", "--max-wait-ms", "0",
                          "--max-queue-delay-ms", "inf", "--metrics-port", "0")


def test_tritonclient_calls_evenflow_unchanged(mlp_server, tmp_path: Path) -> None:
    # Only look: importing tritonclient here would clash with our protos (same package names).
    if importlib.util.find_spec("tritonclient") is None:
        pytest.skip("tritonclient is not installed")
    out = tmp_path / "triton.npz"
    probe = subprocess.run([sys.executable, str(TESTS_DIR / "triton_probe.py"), mlp_server.url,
                            str(out)], check=False, capture_output=True, text=True, timeout=90)
    assert probe.returncode == 0, probe.stderr[-3000:]
    saved = np.load(out)
    for case in ("raw_b1", "raw_b8", "typed_b1", "typed_b8", "aio_b8"):
        x, y = saved[f"{case}_x"], saved[f"{case}_y"]
        np.testing.assert_array_equal(y, mlp_reference(x), err_msg=case)  # bit for bit
    for i in range(3):  # streamed requests may share a batch: same values, maybe not same bits
        x, y = saved[f"stream_{i}_x"], saved[f"stream_{i}_y"]
        np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-5, atol=1e-6)


@pytest.mark.perf_analyzer
def test_perf_analyzer_completes(mlp_server) -> None:
    """The README's perf_analyzer command completes. The stability window is wide (-s 100) on
    purpose: this checks compatibility on a shared 2-core CI machine, not the numbers."""
    command = perf_analyzer_command()
    if command is None:
        pytest.skip("perf_analyzer not found (set EVENFLOW_PERF_ANALYZER; see README)")
    run = subprocess.run(
        [*command, "-i", "grpc", "-u", mlp_server.url, "-m", "mlp", "--shape", "x:256",
         "--concurrency-range", "1:9:8", "-p", "500", "-s", "100", "-r", "6"],
        check=False, capture_output=True, text=True, timeout=110)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Concurrency: 9" in run.stdout
    assert "Server:" in run.stdout  # it read our ModelStatistics for the server breakdown


def test_sync_client(mlp_server) -> None:
    x = np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)
    with Client(mlp_server.url) as client:
        assert client.server_live() and client.server_ready()
        meta = client.model_metadata("mlp")
        assert meta.inputs[0].shape == (-1, 256)
        np.testing.assert_array_equal(client.infer("mlp", {"x": x}, timeout_s=10)["y"],
                                      mlp_reference(x))
        results = list(client.stream_infer("mlp", [{"x": x[:1]}, {"x": x[1:]}], timeout_s=10))
    assert sorted(r.request_id for r in results) == ["0", "1"]
    assert all(r.error is None for r in results)


@in_every_mode
async def test_sigterm_drains_in_flight_work_then_exits_zero(server_factory) -> None:
    server = server_factory("--model", "sim", "--devices", "sim:1", "--sim-base-ms", "600",
                            "--max-wait-ms", "0", "--latency-target-ms", "5000", "--no-warmup")
    x = np.ones((1, 256), np.float32)
    async with AsyncClient(server.url) as client:
        await client.infer("sim", {"x": x}, timeout_s=10)  # warm
        in_flight = asyncio.create_task(client.infer("sim", {"x": x * 3}, timeout_s=10))
        channel = grpc.aio.insecure_channel(server.url)
        stats = evenflow_pb2_grpc.EvenflowStatsStub(channel)
        for _ in range(10_000):  # poll the server's own view until the request is running
            response = await stats.GetStats(evenflow_pb2.GetStatsRequest(model_name="sim"))
            if response.models[0].replicas[0].running_requests:
                break
        else:
            pytest.fail("request never started")
        await channel.close()
        server.proc.send_signal(__import__("signal").SIGTERM)
        y = await in_flight
    np.testing.assert_array_equal(y["y"], x * 3)
    assert await asyncio.to_thread(server.proc.wait, 30) == 0


def fetch_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # loopback only
        return response.read().decode()


async def test_metrics_port_flag_serves_prometheus_text(mlp_server) -> None:
    (line,) = [b for b in mlp_server.banner if b.startswith("evenflow metrics on ")]
    metrics_url = line.split()[-1]
    assert metrics_url.startswith("http://127.0.0.1:") and metrics_url.endswith("/metrics")

    async def counts() -> tuple[float, float]:
        """mlp's successful requests and samples (0 before its first request)."""
        lines = (await asyncio.to_thread(fetch_text, metrics_url)).splitlines()
        values = []
        for metric in ("nv_inference_request_success", "nv_inference_count"):
            prefix = f'{metric}{{model="mlp",version="1"}} '
            values.append(next((float(li.removeprefix(prefix)) for li in lines
                                if li.startswith(prefix)), 0.0))
        return values[0], values[1]

    # The server is shared with the module's other tests: count this test's request only.
    requests, samples = await counts()
    async with AsyncClient(mlp_server.url) as client:
        await client.infer("mlp", {"x": np.ones((3, 256), np.float32)})
    assert await counts() == (requests + 1.0, samples + 3.0)


@pytest.mark.parametrize(("args", "message"), [
    (["--devices", "tpu:0"], "unknown device 'tpu:0'"),
    (["--devices", "cpu:0,cpu:1,cpu:2", "--pipeline-stages", "2"], "cannot form pipelines"),
    (["--model", "nosuch"], "unknown built-in model")])
def test_bad_command_lines_exit_with_usage(args: list[str], message: str) -> None:
    run = subprocess.run([sys.executable, "-m", "evenflow.server.config.cli", "serve",
                          "--port", "0", *args],
                         check=False, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert message in run.stderr


@in_every_mode
async def test_json_logs_carry_the_request_id(server_factory) -> None:
    import json

    from evenflow.client import ServerInternalError

    server = server_factory("--model", "bad=tests.fixture_models:failing", "--devices", "cpu",
                            "--log-format", "json")
    poisoned = np.full((1, 4), 13.0, np.float32)
    async with AsyncClient(server.url) as client:
        with pytest.raises(ServerInternalError):
            await client.infer("bad", {"x": poisoned}, request_id="req-42")
    assert server.terminate() == 0
    entries = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    assert entries, server.log()[-2000:]
    assert all({"ts", "level", "logger", "message"} <= set(e) for e in entries)
    (failure,) = [e for e in entries if e.get("request_id") == "req-42"]
    assert failure["model"] == "bad" and failure["code"] == "INTERNAL"
    assert "poisoned input" in failure["message"]

