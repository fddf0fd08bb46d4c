"""The REST API alone: the ASGI application driven by hand (scope, receive, send) over the real
edge with a hand-written model directory and control calls; no HTTP server, no sockets."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import msgspec
import numpy as np
import pytest

from evenflow.proto import evenflow_pb2
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.server.edge.rest import api
from evenflow.server.edge.rest.api import RestApi, route_of
from evenflow.server.edge.rest.http_port import HttpPort, HttpSettings
from evenflow.server.edge.rest.proto_json import to_json
from evenflow.server.edge.rest.replies import HttpError
from tests.unit.test_edge_servicer import Edge, FakeModel, make_edge

pytestmark = pytest.mark.timeout(10)

TOKEN = "a-token-of-sixteen-chars"
LIMIT_BYTES = 4096
X = np.arange(8, dtype=np.float32).reshape(2, 4)


@dataclass
class FakeControl:
    """ControlCalls that records each call and answers what the test set for its path."""

    answers: dict[str, tuple[int, str, bytes]] = field(default_factory=dict)
    calls: list[tuple[str, bytes]] = field(default_factory=list)

    async def call(self, path: str, request: bytes, deadline_s: float, /
                   ) -> tuple[int, str, bytes]:
        self.calls.append((path, request))
        return self.answers.get(path, (grpc.StatusCode.UNIMPLEMENTED.value[0], "no", b""))


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


@dataclass
class Harness:
    edge: Edge
    control: FakeControl
    api: RestApi
    received: list[int] = field(default_factory=list)  # body chunks handed out

    async def request(self, method: str, path: str, body: bytes | Sequence[bytes] = b"",
                      headers: Sequence[tuple[bytes, bytes]] = ()) -> Answer:
        start, *bodies = await self.exchange(method, path, body, headers)
        return Answer(start["status"], dict(start["headers"]),
                      b"".join(bytes(m["body"]) for m in bodies))

    async def exchange(self, method: str, path: str, body: bytes | Sequence[bytes] = b"",
                       headers: Sequence[tuple[bytes, bytes]] = (),
                       gone: asyncio.Event | None = None) -> list[dict[str, Any]]:
        """The ASGI messages the application sent. As an ASGI server does, ``receive`` after
        the body blocks until the client goes away: until ``gone`` is set (never without)."""
        chunks = [body] if isinstance(body, bytes) else list(body)
        if isinstance(body, bytes) and not any(k == b"content-length" for k, _ in headers):
            headers = [*headers, (b"content-length", str(len(body)).encode())]
        sent: list[dict[str, Any]] = []
        body_read = False

        async def receive() -> dict[str, Any]:
            nonlocal body_read
            if body_read:
                await (gone or asyncio.Event()).wait()
                return {"type": "http.disconnect"}
            self.received.append(len(chunks))
            chunk = chunks.pop(0) if chunks else b""
            body_read = not chunks
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "headers": list(headers)}
        await self.api(scope, receive, send)
        return sent


def harness(*, token: str | None = None, model: FakeModel | None = None) -> Harness:
    edge = make_edge(model)
    control = FakeControl()
    api = RestApi(edge=edge.servicer, control=control, max_body_bytes=LIMIT_BYTES,
                  max_tensor_elements=1 << 16, token=token,
                  auth_groups=("inference", "statistics"), page=b"<html>page</html>")
    return Harness(edge, control, api)


def infer_body(x: np.ndarray = X, **extra: Any) -> bytes:
    return msgspec.json.encode({"id": "r1", "inputs": [
        {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.reshape(-1).tolist()}],
        **extra})


@pytest.mark.parametrize(("method", "path", "kind", "model", "version"), [
    ("GET", "/v2", "server", "", ""),
    ("GET", "/v2/health/live", "live", "", ""),
    ("GET", "/v2/health/ready/", "server_ready", "", ""),
    ("GET", "/v2/models/m", "metadata", "m", ""),
    ("GET", "/v2/models/m/versions/1", "metadata", "m", "1"),
    ("GET", "/v2/models/m/versions/1/ready", "ready", "m", "1"),
    ("GET", "/v2/models/m/config", "config", "m", ""),
    ("GET", "/v2/models/m/stats", "stats", "m", ""),
    ("GET", "/v2/models/stats", "stats", "", ""),
    ("HEAD", "/v2/models/m", "metadata", "m", ""),
    ("POST", "/v2/models/m/versions/1/infer", "infer", "m", "1"),
    ("POST", "/v2/repository/index", "index", "", ""),
    ("POST", "/v2/repository/models/m/load", "load", "m", ""),
    ("POST", "/v2/repository/models/m/unload", "unload", "m", ""),
    ("GET", "/", "page", "", ""),
    ("GET", "/evenflow/v1/stats", "evenflow_stats", "", ""),
])
def test_each_path_has_its_route(method: str, path: str, kind: str, model: str,
                                 version: str) -> None:
    route = route_of(method, path)
    assert (route.kind, route.model, route.version) == (kind, model, version)


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v3", 404), ("GET", "/v2/models", 404), ("GET", "/v2/models/m/nope", 404),
    ("GET", "/v2/models/m/versions/1/2/infer", 404), ("GET", "/v2/repository/models/m/x", 404),
    ("POST", "/v2/models/m", 405), ("GET", "/v2/models/m/infer", 405),
    ("DELETE", "/v2/health/live", 405),
])
def test_unknown_paths_and_wrong_methods_are_refused(method: str, path: str,
                                                     status: int) -> None:
    with pytest.raises(HttpError) as info:
        route_of(method, path)
    assert info.value.status == status
    if status == 405:
        assert info.value.headers[0][0] == b"allow"


async def test_json_inference_is_answered_by_the_model_as_json() -> None:
    h = harness()
    answer = await h.request("POST", "/v2/models/m/infer", infer_body())
    assert answer.status == 200, answer.body
    document = answer.json()
    assert document["id"] == "r1" and document["model_name"] == "m"
    (output,) = document["outputs"]
    assert output["shape"] == [2, 4] and output["data"] == (X * 2).reshape(-1).tolist()
    assert h.edge.failures == []


async def test_binary_outputs_carry_the_header_length() -> None:
    h = harness()
    body = infer_body(outputs=[{"name": "y", "parameters": {"binary_data": True}}])
    answer = await h.request("POST", "/v2/models/m/infer", body)
    assert answer.status == 200
    length = int(answer.headers[b"inference-header-content-length"])
    header = msgspec.json.decode(answer.body[:length])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == X.nbytes
    np.testing.assert_array_equal(np.frombuffer(answer.body[length:], np.float32),
                                  (X * 2).reshape(-1))


@pytest.mark.parametrize(("path", "body", "status", "label", "code", "words"), [
    ("/v2/models/m/infer", b"{not json", 400, "m", "INVALID_ARGUMENT", "not valid JSON"),
    ("/v2/models/m/infer", infer_body(X[:, :3]), 400, "m", "INVALID_ARGUMENT", "shape"),
    ("/v2/models/nosuch/infer", infer_body(), 404, "", "NOT_FOUND", "nosuch"),
])
async def test_a_failed_inference_is_a_json_error_and_is_counted(
        path: str, body: bytes, status: int, label: str, code: str, words: str) -> None:
    h = harness()
    answer = await h.request("POST", path, body)
    assert answer.status == status
    assert words in answer.json()["error"]
    assert h.edge.failures == [(label, code)]  # unknown names are not labels


async def test_a_body_over_the_limit_is_refused_before_it_is_read() -> None:
    h = harness()
    answer = await h.request("POST", "/v2/models/m/infer", [b"x"],
                             headers=[(b"content-length", str(10 * LIMIT_BYTES).encode())])
    assert answer.status == 413 and "limit" in answer.json()["error"]
    assert answer.headers[b"connection"] == b"close"
    assert h.received == []  # not one chunk of the body was asked for


async def test_a_chunked_body_is_cut_once_it_grows_past_the_limit() -> None:
    h = harness()
    chunks = [b"x" * 1024] * 8
    answer = await h.request("POST", "/v2/models/m/infer", chunks,
                             headers=[(b"transfer-encoding", b"chunked")])
    assert answer.status == 413
    assert len(h.received) == 5  # refused at the fifth KiB, the rest never read


async def test_a_compressed_body_inflating_past_the_limit_is_413_not_400() -> None:
    h = harness()
    body = gzip.compress(bytes(LIMIT_BYTES + 1))
    assert len(body) < LIMIT_BYTES
    answer = await h.request("POST", "/v2/models/m/infer", body,
                             headers=[(b"content-encoding", b"gzip")])
    assert answer.status == 413 and "inflates past" in answer.json()["error"]
    fits = await h.request("POST", "/v2/models/m/infer", gzip.compress(infer_body()),
                           headers=[(b"content-encoding", b"gzip")])
    assert fits.status == 200


async def test_draining_refuses_new_inference_with_503_and_readiness_follows() -> None:
    h = harness()
    h.edge.servicer.drain()
    answer = await h.request("POST", "/v2/models/m/infer", infer_body())
    assert answer.status == 503 and "shutting down" in answer.json()["error"]
    assert (await h.request("GET", "/v2/health/ready")).status == 503
    assert (await h.request("GET", "/v2/health/live")).status == 200


async def test_a_drain_waits_for_the_http_answer_being_computed() -> None:
    h = harness(model=FakeModel(auto=False))
    call = asyncio.create_task(h.request("POST", "/v2/models/m/infer", infer_body()))
    submitted = await h.edge.model.next_request()
    h.edge.servicer.drain()
    assert await h.edge.servicer.answered(0.0) == 1  # admitted: counted until written
    submitted.double()
    assert (await call).status == 200
    assert await h.edge.servicer.answered(1.0) == 0


async def test_the_token_guards_its_groups_and_leaves_health_and_the_page_open() -> None:
    h = harness(token=TOKEN)
    refused = await h.request("POST", "/v2/models/m/infer", infer_body())
    assert refused.status == 401 and refused.headers[b"www-authenticate"] == b"Bearer"
    bearer = [(b"authorization", f"Bearer {TOKEN}".encode())]
    assert (await h.request("POST", "/v2/models/m/infer", infer_body(),
                            headers=bearer)).status == 200
    assert (await h.request("GET", "/evenflow/v1/stats")).status == 401  # statistics
    assert (await h.request("GET", "/v2/health/ready")).status == 200
    page = await h.request("GET", "/")
    assert page.status == 200 and page.body == b"<html>page</html>"
    # model control is not in this server's guarded groups
    h.control.answers["/inference.GRPCInferenceService/RepositoryIndex"] = (
        0, "", pb.RepositoryIndexResponse().SerializeToString())
    assert (await h.request("POST", "/v2/repository/index")).status == 200


async def test_control_calls_run_the_grpc_method_and_keep_its_status_and_words() -> None:
    h = harness()
    metadata = pb.ModelMetadataResponse(name="m", versions=["1"], platform="pytorch_libtorch")
    h.control.answers["/inference.GRPCInferenceService/ModelMetadata"] = (
        0, "", metadata.SerializeToString())
    answer = await h.request("GET", "/v2/models/m/versions/1")
    assert answer.status == 200 and answer.json()["versions"] == ["1"]
    path, request = h.control.calls[-1]
    assert path == "/inference.GRPCInferenceService/ModelMetadata"
    assert pb.ModelMetadataRequest.FromString(request) == pb.ModelMetadataRequest(name="m",
                                                                                  version="1")
    h.control.answers["/inference.GRPCInferenceService/ModelConfig"] = (
        grpc.StatusCode.NOT_FOUND.value[0], "unknown model 'm'", b"")
    missing = await h.request("GET", "/v2/models/m/config")
    assert missing.status == 404 and missing.json() == {"error": "unknown model 'm'"}


async def test_model_control_parameters_travel_as_grpc_repository_parameters() -> None:
    h = harness()
    path = "/inference.GRPCInferenceService/RepositoryModelLoad"
    h.control.answers[path] = (0, "", b"")
    answer = await h.request("POST", "/v2/repository/models/m/load",
                             b'{"parameters": {"config": "{\\"source\\": \\"mlp\\"}"}}')
    assert answer.status == 200
    request = pb.RepositoryModelLoadRequest.FromString(h.control.calls[-1][1])
    assert request.model_name == "m"
    assert request.parameters["config"].string_param == '{"source": "mlp"}'
    bad = await h.request("POST", "/v2/repository/models/m/load", b'{"parameters": [1]}')
    assert bad.status == 400


def test_statistics_json_has_numbers_defaults_and_names() -> None:
    stats = pb.ModelStatisticsResponse(model_stats=[pb.ModelStatistics(
        name="m", version="1", inference_count=2**40)])
    document = to_json(stats)["model_stats"][0]
    assert document["inference_count"] == 2**40  # a number, not "1099511627776"
    assert document["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}  # present
    replica = evenflow_pb2.ReplicaStats(name="r", batch_size_counts={8: 3})
    assert to_json(replica)["batch_size_counts"] == {"8": 3}
    parameter = to_json(pb.InferParameter(bool_param=False))
    assert parameter == {"bool_param": False}  # the oneof member set, and only it


async def test_every_error_names_the_grpc_status_it_stands_for() -> None:
    h = harness()
    bad = await h.request("POST", "/v2/models/m/infer", b"{not json")
    assert bad.headers[b"evenflow-status"] == b"INVALID_ARGUMENT"
    h.edge.servicer.drain()
    draining = await h.request("POST", "/v2/models/m/infer", infer_body())
    assert draining.status == 503 and draining.headers[b"evenflow-status"] == b"UNAVAILABLE"
    assert draining.headers[b"evenflow-may-resend"] == b"1"  # refused before it ran
    h.control.answers["/inference.GRPCInferenceService/ModelConfig"] = (
        grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], "busy", b"")
    busy = await h.request("GET", "/v2/models/m/config")
    assert busy.status == 503 and busy.headers[b"evenflow-status"] == b"RESOURCE_EXHAUSTED"


async def test_an_inference_whose_client_goes_away_is_cancelled_and_not_answered() -> None:
    h = harness(model=FakeModel(auto=False))
    gone = asyncio.Event()
    call = asyncio.create_task(h.exchange("POST", "/v2/models/m/infer", infer_body(),
                                          gone=gone))
    submitted = await h.edge.model.next_request()
    gone.set()  # uvicorn's receive() says http.disconnect
    assert await asyncio.wait_for(call, 2.0) == []  # nothing sent to the dead connection
    assert submitted.answer.cancelled()  # the balancer drops it: slot and batch share freed
    assert h.edge.failures == []  # not a failure, as a cancelled gRPC call is not
    assert await h.edge.servicer.answered(0.0) == 0  # a drain does not wait for it


async def test_an_answer_that_beats_the_disconnect_is_sent() -> None:
    h = harness(model=FakeModel(auto=False))
    call = asyncio.create_task(h.request("POST", "/v2/models/m/infer", infer_body()))
    (await h.edge.model.next_request()).double()
    answer = await asyncio.wait_for(call, 2.0)
    assert answer.status == 200 and answer.json()["outputs"][0]["shape"] == [2, 4]


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/v2/repository/models/m/load", b'{"parameters": {"x": 9223372036854775808}}', "int64"),
    ("/v2/repository/models/m/unload", b'{"parameters": {"x": -9223372036854775809}}', "int64"),
    ("/v2/repository/index", b"[" * 1000, "nested"),
])
async def test_control_bodies_that_protobuf_or_json_cannot_take_are_400(
        path: str, body: bytes, words: str) -> None:
    h = harness()
    h.control.answers["/inference.GRPCInferenceService/RepositoryModelLoad"] = (0, "", b"")
    answer = await h.request("POST", path, body)
    assert answer.status == 400 and words in answer.json()["error"]
    assert answer.headers[b"content-type"] == b"application/json"


async def test_a_bug_is_a_json_500_with_the_internal_status(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    h = harness()

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(api, "to_json", broken)
    answer = await h.request("GET", "/v2")
    assert answer.status == 500 and "internal" in answer.json()["error"]
    assert answer.headers[b"evenflow-status"] == b"INTERNAL"
    assert [r.exc_info[0] for r in caplog.records if r.exc_info] == [RuntimeError]  # once


async def test_over_a_real_port_a_client_that_hangs_up_cancels_its_inference() -> None:
    """uvicorn tells of the disconnect only through receive(): the API must be listening."""
    h = harness(model=FakeModel(auto=False))
    port = HttpPort(h.api, name="test")
    number = await port.start(HttpSettings("127.0.0.1", 0))
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", number)
        body = infer_body()
        writer.write(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n"
                     b"\r\n%s" % (len(body), body))
        submitted = await h.edge.model.next_request()
        writer.close()
        await writer.wait_closed()
        await asyncio.wait_for(asyncio.gather(submitted.answer, return_exceptions=True), 2.0)
        assert submitted.answer.cancelled()
    finally:
        await port.close(0.5)
