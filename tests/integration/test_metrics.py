"""Prometheus metrics over HTTP from a real server: Triton's per-model counters, the balancer's
per-replica state, and the endpoint's answers to requests it does not serve."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from evenflow.balancer import BalancerConfig
from evenflow.balancer.stats import CPU_PARTS
from evenflow.client import AsyncClient, InvalidInputError, ModelNotFoundError
from evenflow.server.models.spec import SimProfile
from evenflow.server.observability.cpu_accounting import ENV_VAR
from tests.integration.inprocess import running_app

pytestmark = pytest.mark.timeout(60)
FAST = SimProfile(base_ms=1.0, per_sample_ms=0.1)
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


async def http(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one raw request; the status, headers (lower-case names) and body of the answer.
    A request that parses gets ``Connection: close``, so the answer ends with the connection."""
    line, sep, rest = request.partition(b"\r\n")
    if sep and line.endswith(b"HTTP/1.1"):
        request = line + b"\r\nConnection: close\r\n" + rest
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)] of an exposition page; fails on a line it cannot read."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not an exposition line: {line!r}"
        name, labels, value = match.groups()
        samples.setdefault(name, []).append((dict(_LABEL.findall(labels or "")), float(value)))
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    matching = [v for found, v in samples[name] if labels.items() <= found.items()]
    assert len(matching) == 1, (name, labels, samples.get(name))
    return matching[0]


async def test_metrics_count_requests_per_model_and_show_each_replica() -> None:
    async with running_app((("sim", "sim"),), devices="sim:1,sim:0.5", sim_profile=FAST,
                           balancer=BalancerConfig(max_wait_s=0.0),
                           metrics_port=0) as (app, url), AsyncClient(url) as client:
        x = np.ones((2, 256), np.float32)
        await asyncio.gather(*(client.infer("sim", {"x": x}) for _ in range(12)))
        with pytest.raises(InvalidInputError):
            await client.infer("sim", {"x": np.ones((2, 3), np.float32)})
        with pytest.raises(ModelNotFoundError):
            await client.infer("nosuch", {"x": x})
        status, headers, body = await http(
            app.metrics_port, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    assert int(headers["content-length"]) == len(body)
    samples = parse(body.decode())
    assert value(samples, "nv_inference_request_success", model="sim", version="1") == 12
    assert value(samples, "nv_inference_request_failure", model="sim", version="1") == 0
    assert value(samples, "evenflow_request_failures_total", model="sim",
                 code="INVALID_ARGUMENT") == 1
    assert value(samples, "evenflow_request_failures_total", model="", code="NOT_FOUND") == 1
    assert value(samples, "evenflow_request_duration_seconds_count", model="sim") == 12
    buckets = sorted((float(labels["le"]), v) for labels, v
                     in samples["evenflow_request_duration_seconds_bucket"])
    assert buckets[-1] == (float("inf"), 12)
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert value(samples, "nv_inference_count", model="sim") == 24
    assert value(samples, "nv_inference_request_duration_us", model="sim") > 0
    replicas = {labels["replica"]: v for labels, v in samples["evenflow_replica_samples_total"]}
    assert set(replicas) == {"sim@sim0", "sim@sim1"}  # worker names: model@device
    assert sum(replicas.values()) == 24
    batches = sum(v for _, v in samples["evenflow_replica_batches_total"])
    assert value(samples, "nv_inference_exec_count", model="sim") == batches
    by_size = samples["evenflow_replica_batches_by_size_total"]
    assert sum(v for _, v in by_size) == batches
    assert sum(int(labels["batch_size"]) * v for labels, v in by_size) == 24
    assert value(samples, "evenflow_latency_target_seconds", model="sim") == 0.05
    assert "nv_gpu_utilization" not in samples  # no GPU here: no GPU metrics, not zeros


async def test_two_models_on_one_device_show_what_their_turns_cost() -> None:
    # 20 ms batches of two models, both loaded at once: each waits for the other's batches.
    async with running_app((("a", "sim"), ("b", "sim")), devices="sim:1",
                           sim_profile=SimProfile(base_ms=20.0, per_sample_ms=0.1),
                           metrics_port=0) as (app, url), AsyncClient(url) as client:
        x = np.ones((1, 256), np.float32)
        await asyncio.gather(*(client.infer(model, {"x": x}) for model in "ab" for _ in range(8)))
        status, _, body = await http(
            app.metrics_port, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert status == 200
    waits = {labels["model"]: v for labels, v
             in parse(body.decode())["evenflow_replica_turn_wait_seconds_total"]}
    assert set(waits) == {"a", "b"}
    assert sum(waits.values()) >= 0.02  # at least one whole batch of the other's was waited out


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET / HTTP/1.1\r\n\r\n", 404),
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
    (b"hello\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 10000 + b"\r\n\r\n", 431),
])
async def test_requests_other_than_a_scrape_get_a_clear_status(request_bytes: bytes,
                                                               status: int) -> None:
    async with running_app((("sim", "sim"),), devices="sim:1", sim_profile=FAST,
                           metrics_port=0) as (app, url), AsyncClient(url) as client:
        got, _, _ = await http(app.metrics_port, request_bytes)
        assert got == status
        # The endpoint and the server keep serving.
        assert (await http(app.metrics_port, b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 200
        await client.infer("sim", {"x": np.ones((1, 256), np.float32)})


async def test_head_has_no_body_and_the_port_closes_with_the_server() -> None:
    async with running_app((("sim", "sim"),), devices="sim:1", sim_profile=FAST,
                           metrics_port=0) as (app, _):
        port = app.metrics_port
        status, headers, body = await http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    with pytest.raises(ConnectionError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_no_metrics_port_unless_asked_for() -> None:
    async with running_app((("sim", "sim"),), devices="sim:1", sim_profile=FAST) as (app, _):
        assert app.metrics_port == 0


async def test_slow_clients_get_a_deadline_and_a_connection_cap() -> None:
    from evenflow.server.edge.rest.http_port import HttpPort, HttpSettings
    from evenflow.server.observability.metrics_app import MetricsApp

    endpoint = HttpPort(MetricsApp(lambda: b"up 1\n", "text/plain"), name="metrics")
    port = await endpoint.start(HttpSettings("127.0.0.1", 0, head_timeout_s=0.2,
                                             max_connections=2))
    try:
        slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        for _, writer in slow:
            writer.write(b"GET /metr")  # half a request line, then nothing
            await writer.drain()
        try:  # both slots are held by the slow clients: refused at once
            status, _, _ = await http(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        except ConnectionResetError:  # the 503 and close raced our request bytes
            status = 503
        assert status == 503
        for reader, writer in slow:
            answer = await reader.read()  # the deadline closes them
            assert answer.startswith(b"HTTP/1.1 408"), answer
            writer.close()
            await writer.wait_closed()
        assert (await http(port, b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 200
    finally:
        await endpoint.close()


async def test_cpu_by_part_is_counted_only_when_asked_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for asked in (False, True):
        if asked:
            monkeypatch.setenv(ENV_VAR, "1")
        async with running_app((("mlp", "mlp"),), devices="cpu",
                               metrics_port=0) as (app, url), AsyncClient(url) as client:
            x = np.ones((1, 256), np.float32)
            for _ in range(5):
                await client.infer("mlp", {"x": x})
            _, _, body = await http(app.metrics_port, b"GET /metrics HTTP/1.1\r\n\r\n")
        samples = parse(body.decode())
        if not asked:
            assert "evenflow_cpu_seconds_total" not in samples
            continue
        parts = {labels["part"]: v for labels, v in samples["evenflow_cpu_seconds_total"]}
        assert set(parts) == set(CPU_PARTS)
        # Every part of the path ran five times on its thread; each took some CPU.
        assert all(seconds > 0.0 for seconds in parts.values()), parts
