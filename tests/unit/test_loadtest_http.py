"""``evenflow loadtest --protocol http`` against the fake Triton-format server: the HTTP target
sends Triton's binary request, tells its failures by the gRPC path's status names, keeps one
connection per request in flight; the CLI runs a closed loop over HTTP, says so in its report,
and refuses what HTTP cannot run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from evenflow.loadtest.cli import main
from evenflow.loadtest.http_target import HttpTarget
from evenflow.loadtest.inputs import build_request
from evenflow.loadtest.runner import Target, closed_loop, open_loop
from evenflow.loadtest.sweep import LoadSpec
from evenflow.loadtest.targets import make_target
from evenflow.proto import grpc_service_pb2 as pb
from tests.unit.test_client_rest_server import FakeTriton, serving

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def request_for(model: str) -> pb.ModelInferRequest:
    return build_request(model, {"x": (X, "FP32"), "w": (np.arange(3, dtype=np.int64), "INT64")})


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeTriton, str]]:
    server = FakeTriton()
    async with serving(server) as url:
        yield server, url


async def test_the_target_sends_the_request_and_names_failures(
        fake: tuple[FakeTriton, str]) -> None:
    server, url = fake
    statuses = {}
    for model in ("echo", "overloaded", "draining", "bad", "missing", "broken", "hang"):
        target = HttpTarget(url, request_for(model), timeout_s=0.3)
        try:
            statuses[model] = await target.send(0)
        finally:
            await target.close()
    assert statuses == {"echo": "OK", "overloaded": "RESOURCE_EXHAUSTED",
                        "draining": "UNAVAILABLE", "bad": "INVALID_ARGUMENT",
                        "missing": "NOT_FOUND", "broken": "INTERNAL",
                        "hang": "DEADLINE_EXCEEDED"}
    header = server.requests[0]
    assert [(t["name"], t["datatype"], t["shape"]) for t in header["inputs"]] == \
        [("x", "FP32", [2, 4]), ("w", "INT64", [3])]
    assert header["parameters"] == {"binary_data_output": True, "timeout": 300_000}
    assert "id" not in header  # the load's one request carries none, as over gRPC


async def test_no_server_is_unavailable() -> None:
    async with serving(FakeTriton()) as url:
        pass
    target = HttpTarget(url, request_for("echo"))
    try:
        assert await target.send(0) == "UNAVAILABLE"
    finally:
        await target.close()


async def test_a_closed_loop_holds_one_connection_per_request_in_flight(
        fake: tuple[FakeTriton, str]) -> None:
    server, url = fake
    server.gate_width = 4  # nothing is answered until 4 requests are in flight at once
    target = make_target(url, None, request_for("gate"), timeout_s=10.0, credentials=None,
                         connections=4)
    assert isinstance(target, HttpTarget)
    try:
        records = await closed_loop(target, concurrency=4, duration_s=0.3)
        dropped_free = await open_loop(target, [0.0] * 8)
    finally:
        await target.close()
    assert {r.status for r in records} == {"OK"} and len(records) >= 4
    assert len(server.peers) == 4  # kept alive: the same 4 connections all along
    assert dropped_free[1] == 0 and {r.status for r in dropped_free[0]} == {"OK"}


async def test_targets_follow_the_url_and_protocol() -> None:
    request = request_for("echo")
    grpc_target = make_target("127.0.0.1:1", None, request, timeout_s=1.0, credentials=None)
    assert isinstance(grpc_target, Target)
    await grpc_target.close()
    for url, protocol in (("127.0.0.1:1", "http"), ("http://127.0.0.1:1", None)):
        target = make_target(url, protocol, request, timeout_s=1.0, credentials=None)
        assert isinstance(target, HttpTarget) and target.url == "http://127.0.0.1:1"


def test_streaming_over_http_is_refused() -> None:
    with pytest.raises(ValueError, match=r"HTTP/1\.1 has no streams"):
        LoadSpec("http://127.0.0.1:1", b"", "concurrency", 1, 1.0, streaming=True,
                 protocol="http")


@pytest.mark.parametrize(("flags", "why"), [
    (["--protocol", "http", "--streaming"], "HTTP/1.1 has no streams"),
    (["--url", "http://127.0.0.1:1", "--protocol", "grpc"], "protocol='grpc'"),
    (["--grpc-url", "127.0.0.1:2"], "--grpc-url is for --protocol http"),
    (["--protocol", "http", "--scenario", "ACTIONS"], "admin actions"),
])
def test_the_cli_refuses_what_http_cannot_run(flags: list[str], why: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "actions.toml"
    scenario.write_text('duration_s = 1\n[[step]]\nat_s = 0\nrate = 10\n[[step]]\nat_s = 0.5\n'
                        'action = "set_device_speed"\ndevice = "sim0"\nspeed = 0.5\n')
    flags = [str(scenario) if f == "ACTIONS" else f for f in flags]
    load = [] if "--scenario" in flags else ["--concurrency", "1"]
    url = [] if "--url" in flags else ["--url", "127.0.0.1:1"]
    with pytest.raises(SystemExit) as exited:
        main([*url, "--model", "m", *load, "--out", str(tmp_path / "out"), *flags])
    assert exited.value.code == 2
    assert why in capsys.readouterr().err


@pytest.mark.timeout(120)
async def test_a_closed_loop_over_http_from_the_command_line(
        fake: tuple[FakeTriton, str], tmp_path: Path) -> None:
    server, url = fake
    out = tmp_path / "http"
    code = await asyncio.to_thread(main, [
        "--url", url.removeprefix("http://"), "--protocol", "http", "--model", "echo",
        "--concurrency", "1,3", "--duration-s", "0.4", "--warmup-s", "0.1", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["protocol"] == "http"
    assert [p["value"] for p in results["points"]] == [1, 3]
    for point in results["points"]:
        assert set(point["status_counts"]) == {"OK"} and point["status_counts"]["OK"] > 5
        assert not point["server"]["is_evenflow"]  # the fake has no /evenflow/v1/stats
    assert "over HTTP/REST" in (out / "report.md").read_text()
    assert server.requests[-1]["inputs"][0]["shape"] == [1, 4]  # from the model's metadata


async def test_the_cli_says_when_the_model_cannot_be_read(
        fake: tuple[FakeTriton, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, url = fake
    code = await asyncio.to_thread(main, ["--url", url, "--model", "nope", "--concurrency", "1",
                                          "--out", str(tmp_path)])
    assert code == 2
    assert "cannot read 'nope'" in capsys.readouterr().err
