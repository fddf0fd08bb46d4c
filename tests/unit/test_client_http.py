"""The HTTP transport of ``Client`` and ``AsyncClient`` against the fake Triton-format server:
the wire is Triton's (byte for byte what tritonclient.http sends, answers read as it reads
them), every datatype round-trips, errors are the gRPC path's classes, retries, deadlines,
credentials, the keep-alive pool and ``stream_infer`` as concurrent requests."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
import tritonclient.http as triton_http

from evenflow.client import (
    AsyncClient,
    AuthenticationError,
    ChannelOptions,
    Client,
    Credentials,
    DeadlineExceededError,
    InvalidInputError,
    ModelNotFoundError,
    ServerInternalError,
    ServerOverloadedError,
    ServerUnavailableError,
)
from evenflow.client import _rest_codec as rest
from evenflow.client._endpoint import resolve
from evenflow.client.errors import InferenceServerError
from tests.certs import make_pki
from tests.unit.test_client_rest_server import (
    ECHO_METADATA,
    HEADER_LENGTH,
    FakeTriton,
    encode_response,
    serving,
    triton_request,
)

X = np.arange(8, dtype=np.float32).reshape(2, 4)
EVERY_DATATYPE = {
    "BOOL": np.array([[True, False, True]]), "UINT8": np.arange(6, dtype=np.uint8),
    "UINT16": np.arange(6, dtype=np.uint16), "UINT32": np.arange(6, dtype=np.uint32),
    "UINT64": np.arange(6, dtype=np.uint64).reshape(2, 3), "INT8": np.arange(-3, 3, dtype=np.int8),
    "INT16": np.arange(6, dtype=np.int16), "INT32": np.arange(6, dtype=np.int32),
    "INT64": np.arange(6, dtype=np.int64), "FP16": np.linspace(0, 1, 6, dtype=np.float16),
    "FP32": X, "FP64": np.linspace(0, 1, 6), "BYTES": np.array([[b"a", b""], [b"\x00z", b"q"]],
                                                                dtype=object),
}


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeTriton, str]]:
    server = FakeTriton()
    async with serving(server) as url:
        yield server, url


def test_requests_are_byte_for_byte_tritonclients() -> None:
    for datatype, array in EVERY_DATATYPE.items():
        ours = rest.build_request({"v": array}, None, "r")
        assert (ours.body, int(ours.headers[HEADER_LENGTH])) == \
            triton_request(("v", array, datatype)), datatype
    ours = rest.build_request({"x": X}, ["x"], "r")
    assert (ours.body, int(ours.headers[HEADER_LENGTH])) == \
        triton_request(("x", X, "FP32"), outputs=["x"])


def test_bf16_is_sent_as_tritonclient_sends_it() -> None:
    values = torch.tensor([[1.5, -2.0, 0.0078125]], dtype=torch.bfloat16)
    as_numpy = values.float().numpy().astype(ml_dtypes.bfloat16)  # tritonclient's BF16
    theirs = triton_request(("b", as_numpy, "BF16"))
    for ours in (rest.build_request({"b": values}, None, "r"),
                 rest.build_request({"b": as_numpy}, None, "r")):
        assert (ours.body, int(ours.headers[HEADER_LENGTH])) == theirs
    assert b'"datatype":"BF16"' in ours.body


def test_answers_are_read_as_tritonclient_reads_them() -> None:
    words = np.array([b"ab", b"c"], dtype=object)
    inputs = {"x": ("FP32", X), "w": ("BYTES", words), "i": ("INT64", np.arange(3))}
    mixed = {"inputs": [], "outputs": [{"name": "x", "parameters": {"binary_data": True}},
                                       {"name": "w", "parameters": {"binary_data": False}},
                                       {"name": "i", "parameters": {"binary_data": True}}]}
    for header in ({"inputs": [], "parameters": {"binary_data_output": True}}, mixed,
                   {"inputs": []}):
        response = encode_response(header, inputs)
        assert isinstance(response.body, bytes)
        header_length = response.headers.get(HEADER_LENGTH)
        ours = rest.parse_response(response.body, header_length)
        theirs = triton_http.InferResult.from_response_body(response.body,
                                                            header_length=header_length)
        for name in inputs:
            expected = theirs.as_numpy(name)
            assert ours[name].shape == expected.shape
            if name == "w":  # tritonclient gives JSON BYTES as str, binary ones as bytes
                assert list(ours[name]) == list(words)
            else:
                np.testing.assert_array_equal(ours[name], expected)
                assert ours[name].dtype == expected.dtype


def test_binary_outputs_are_views_of_the_body() -> None:
    response = encode_response({"inputs": [], "parameters": {"binary_data_output": True}},
                               {"x": ("FP32", X)})
    assert isinstance(response.body, bytes)
    y = rest.parse_response(response.body, response.headers[HEADER_LENGTH])["x"]
    assert not y.flags.owndata and not y.flags.writeable
    assert y.base is not None


def binary_answer(shape: list[int], size: int) -> bytes:
    return (b'{"outputs":[{"name":"y","datatype":"FP32","shape":%s,'
            b'"parameters":{"binary_data_size":%d}}]}' % (str(shape).encode(), size))


@pytest.mark.parametrize(("body", "header_length", "why"), [
    (binary_answer([2], 8) + b"abcdefgh", "999", "Inference-Header-Content-Length"),
    (binary_answer([2], 8) + b"abcd", str(len(binary_answer([2], 8))), "runs past the body"),
    (binary_answer([3], 8) + b"abcdefgh", str(len(binary_answer([3], 8))), "needs 12"),
    (b'{"outputs":[{"name":"y","datatype":"FP32","shape":[3],"data":[1,2]}]}', None,
     "needs 3"),
    (b'{"outputs":[{"name":"y","datatype":"BF16","shape":[1],"data":[1]}]}', None,
     "only comes as binary"),
    (b'{"outputs": 3}', None, "infer response"),
])
def test_malformed_answers_are_internal_errors(body: bytes, header_length: str | None,
                                               why: str) -> None:
    with pytest.raises(ServerInternalError, match=why):
        rest.parse_response(body, header_length)


@pytest.mark.parametrize(("url", "protocol", "expected"), [
    ("127.0.0.1:8001", None, ("grpc", "127.0.0.1:8001")),
    ("127.0.0.1:8000", "http", ("http", "http://127.0.0.1:8000")),
    ("http://127.0.0.1:8000/", None, ("http", "http://127.0.0.1:8000")),
    ("https://example.org:8443", "http", ("http", "https://example.org:8443")),
])
def test_urls_choose_the_transport(url: str, protocol: str | None,
                                   expected: tuple[str, str]) -> None:
    endpoint = resolve(url, protocol, None)  # type: ignore[arg-type]
    assert (endpoint.protocol, endpoint.address) == expected
    if url.startswith("https"):
        assert endpoint.credentials is not None and endpoint.credentials.secure


def test_conflicting_urls_are_refused() -> None:
    with pytest.raises(ValueError, match="protocol='grpc'"):
        resolve("http://127.0.0.1:8000", "grpc", None)
    with pytest.raises(ValueError, match="use https"):
        resolve("http://127.0.0.1:8000", None, Credentials(tls=True))
    with pytest.raises(ValueError, match="expected one of"):
        resolve("127.0.0.1:8000", "rest", None)  # type: ignore[arg-type]
    assert resolve("127.0.0.1:8000", "http", Credentials(tls=True)).address.startswith("https")


async def test_every_datatype_round_trips_both_clients(fake: tuple[FakeTriton, str]) -> None:
    server, url = fake
    async with AsyncClient(url) as client:
        for datatype, array in EVERY_DATATYPE.items():
            got = (await client.infer("echo", {"v": array}, request_id="r1"))["v"]
            assert got.shape == array.shape and list(got.reshape(-1)) == list(array.reshape(-1))
            assert got.dtype == array.dtype, datatype
        bf16 = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
        bits = (await client.infer("echo", {"b": bf16}))["b"]
        assert torch.from_numpy(bits.copy()).view(torch.bfloat16).tolist() == [1.5, -2.0]
        words = np.array(["é", "b"])  # str arrays go as UTF-8 BYTES
        assert list((await client.infer("echo", {"w": words}))["w"]) == [b"\xc3\xa9", b"b"]
    assert server.requests[0]["id"] == "r1"

    def blocking() -> None:
        with Client(url) as client:
            assert client.protocol == "http"
            for array in EVERY_DATATYPE.values():
                got = client.infer("echo", {"v": array})["v"]
                assert list(got.reshape(-1)) == list(array.reshape(-1))
                assert got.dtype == array.dtype

    await asyncio.to_thread(blocking)


async def test_requested_outputs_deadline_and_priority_travel(
        fake: tuple[FakeTriton, str]) -> None:
    server, url = fake
    async with AsyncClient(url) as client:
        got = await client.infer("echo", {"x": X, "z": X + 1}, outputs=["z"], timeout_s=2.5,
                                 priority=1)
    assert list(got) == ["z"]
    np.testing.assert_array_equal(got["z"], X + 1)
    assert server.requests[-1]["parameters"] == {"priority": 1, "timeout": 2_500_000}
    assert server.requests[-1]["outputs"] == [{"name": "z", "parameters": {"binary_data": True}}]


async def test_health_metadata_and_readiness(fake: tuple[FakeTriton, str]) -> None:
    server, url = fake
    async with AsyncClient(url) as client:
        assert await client.server_live() and await client.server_ready()
        assert await client.model_ready("echo") and not await client.model_ready("nope")
        metadata = await client.model_metadata("echo")
        with pytest.raises(ModelNotFoundError, match="unknown model"):
            await client.model_metadata("nope")
        server.ready = False
        assert not await client.server_ready()
    assert metadata.name == "echo" and metadata.versions == ("1",)
    assert [(t.name, t.datatype, t.shape) for t in metadata.inputs] == [("x", "FP32", (-1, 4))]
    assert metadata.platform == ECHO_METADATA["platform"]

    def blocking() -> None:
        with Client(url) as client:
            assert client.server_live() and not client.server_ready()
            assert client.model_ready("echo") and not client.model_ready("nope")
            assert client.model_metadata("echo") == metadata

    await asyncio.to_thread(blocking)


ERRORS: list[tuple[str, type[InferenceServerError], str]] = [
    ("missing", ModelNotFoundError, "NOT_FOUND"), ("bad", InvalidInputError, "INVALID_ARGUMENT"),
    ("overloaded", ServerOverloadedError, "RESOURCE_EXHAUSTED"),
    ("draining", ServerUnavailableError, "UNAVAILABLE"),
    ("unready", ServerUnavailableError, "UNAVAILABLE"),
    ("broken", ServerInternalError, "INTERNAL"),
    ("timeout", DeadlineExceededError, "DEADLINE_EXCEEDED"),
]


async def test_http_errors_are_the_grpc_paths_exceptions(fake: tuple[FakeTriton, str]) -> None:
    server, url = fake
    async with AsyncClient(url, retry_backoff_s=0.0) as client:
        for model, kind, code in ERRORS:
            with pytest.raises(kind) as caught:
                await client.infer(model, {"x": X})
            assert caught.value.code.name == code
            assert caught.value.http_status is not None
    # A refusal marked may-resend is sent again (1 + 2 tries); an unmarked 503 may have run,
    # and an overload is a measured refusal: tried once.
    assert server.calls["/v2/models/draining/infer"] == 3
    assert server.calls["/v2/models/unready/infer"] == 1
    assert server.calls["/v2/models/overloaded/infer"] == 1

    def blocking() -> None:
        with Client(url, retry_backoff_s=0.0) as client:
            for model, kind, code in ERRORS:
                with pytest.raises(kind, match=code):
                    client.infer(model, {"x": X})

    await asyncio.to_thread(blocking)


@pytest.mark.parametrize("message", [
    "RESOURCE_EXHAUSTED: queue full",
    "model 'm' is predicted to answer in 90 ms, after the request's deadline (50 ms from now)",
    "model 'm' is predicted to queue the request for 30 ms, over the queueing budget of 20 ms",
    "model 'm' has 3 samples queued; 2 more exceed the limit of 4 (--max-queue-samples)",
    "Exceeds maximum queue size",
])
def test_every_refusal_wording_is_an_overload(message: str) -> None:
    assert isinstance(rest.error_of(503, f'{{"error": "{message}"}}'.encode()),
                      ServerOverloadedError)
    assert isinstance(rest.error_of(429, b""), ServerOverloadedError)
    assert isinstance(rest.error_of(503, b"plain text"), ServerUnavailableError)


async def test_a_server_that_recovers_is_retried_until_it_answers(
        fake: tuple[FakeTriton, str]) -> None:
    server, url = fake
    server.unavailable_first = 2
    async with AsyncClient(url, retry_backoff_s=0.0) as client:
        np.testing.assert_array_equal((await client.infer("echo", {"x": X}))["x"], X)
    assert server.calls["/v2/models/echo/infer"] == 3


async def test_no_server_is_unavailable_after_the_retries() -> None:
    async with serving(FakeTriton()) as url:
        pass  # the port is free again
    async with AsyncClient(url, retries=1, retry_backoff_s=0.0) as client:
        with pytest.raises(ServerUnavailableError, match="cannot reach"):
            await client.server_live()

    def blocking() -> None:
        with Client(url, retries=1, retry_backoff_s=0.0) as client, \
                pytest.raises(ServerUnavailableError, match="cannot reach"):
            client.infer("echo", {"x": X})

    await asyncio.to_thread(blocking)


async def test_timeouts_are_deadline_exceeded(fake: tuple[FakeTriton, str]) -> None:
    _, url = fake
    async with AsyncClient(url) as client:
        with pytest.raises(DeadlineExceededError):
            await client.infer("hang", {"x": X}, timeout_s=0.2)

    def blocking() -> None:
        with Client(url) as client, pytest.raises(DeadlineExceededError):
            client.infer("hang", {"x": X}, timeout_s=0.2)

    await asyncio.to_thread(blocking)


async def test_the_bearer_token_is_sent_and_a_wrong_one_refused() -> None:
    server = FakeTriton(token="s3cret")
    async with serving(server) as url:
        async with AsyncClient(url, credentials=Credentials(token="s3cret")) as client:
            assert await client.server_ready()
        async with AsyncClient(url, credentials=Credentials(token="wrong")) as client:
            with pytest.raises(AuthenticationError, match="bearer token"):
                await client.server_ready()
            with pytest.raises(AuthenticationError):
                await client.infer("echo", {"x": X})

        def blocking() -> None:
            with Client(url, credentials=Credentials(token="s3cret")) as client:
                assert client.infer("echo", {"x": X})["x"].shape == X.shape
            with Client(url, credentials=Credentials(token="wrong")) as client, \
                    pytest.raises(AuthenticationError):
                client.server_live()

        await asyncio.to_thread(blocking)


async def test_tls_with_the_servers_ca_and_a_client_certificate(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=pki.ca)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    tls.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the client must show its certificate
    credentials = Credentials(ca_file=pki.ca, cert_file=pki.client_cert,
                              key_file=pki.client_key)
    async with serving(FakeTriton(), tls=tls) as url:
        assert url.startswith("https://")
        async with AsyncClient(url, credentials=credentials) as client:
            np.testing.assert_array_equal((await client.infer("echo", {"x": X}))["x"], X)
        async with AsyncClient(url, retries=0) as client:  # the system's roots do not know it
            with pytest.raises(ServerUnavailableError):
                await client.server_live()

        def blocking() -> None:
            with Client(url, credentials=credentials) as client:
                assert client.server_ready()
            port = url.rsplit(":", 1)[1]
            with Client(f"127.0.0.1:{port}", protocol="http", credentials=credentials) as client:
                assert client.server_live()

        await asyncio.to_thread(blocking)


async def test_calls_reuse_the_pools_connections(fake: tuple[FakeTriton, str]) -> None:
    server, url = fake
    async with AsyncClient(url) as client:
        for _ in range(20):
            await client.infer("echo", {"x": X})
        assert len(server.peers) == 1
        server.peers.clear()
        await asyncio.gather(*(client.infer("echo", {"x": X}) for _ in range(50)))
        assert 1 <= len(server.peers) <= ChannelOptions().max_connections

    def blocking() -> None:
        server.peers.clear()
        with Client(url) as client:
            for _ in range(20):
                client.server_live()
        assert len(server.peers) == 1

    await asyncio.to_thread(blocking)


async def test_answers_over_the_size_limit_are_refused(fake: tuple[FakeTriton, str]) -> None:
    _, url = fake
    options = ChannelOptions(max_message_bytes=64)
    big = np.zeros((4, 64), np.float32)
    async with AsyncClient(url, options=options) as client:
        with pytest.raises(ServerOverloadedError, match="max_message_bytes"):
            await client.infer("echo", {"x": big})

    def blocking() -> None:
        with Client(url, options=options) as client, \
                pytest.raises(ServerOverloadedError, match="max_message_bytes"):
            client.infer("echo", {"x": big})

    await asyncio.to_thread(blocking)


async def test_stream_infer_runs_requests_concurrently_with_ids(
        fake: tuple[FakeTriton, str]) -> None:
    server, url = fake
    server.gate_width = 4  # no answer until 4 requests are in flight at once
    inputs = [{"x": X + i} for i in range(10)]
    async with AsyncClient(url, options=ChannelOptions(max_connections=4)) as client:
        results = [r async for r in client.stream_infer("gate", inputs, timeout_s=10)]
    assert sorted(int(r.request_id) for r in results) == list(range(10))
    for result in results:
        assert result.error is None and result.outputs is not None
        np.testing.assert_array_equal(result.outputs["x"], X + int(result.request_id))
    assert {h["id"] for h in server.requests} == {str(i) for i in range(10)}

    async def produced() -> AsyncIterator[dict[str, np.ndarray]]:
        for item in inputs[:3]:
            yield item

    async with AsyncClient(url) as client:
        ids = sorted([r.request_id async for r in client.stream_infer("echo", produced())])
    assert ids == ["0", "1", "2"]

    def blocking() -> list[str]:
        server.gate.clear()
        with Client(url, options=ChannelOptions(max_connections=4)) as client:
            return sorted(r.request_id for r in client.stream_infer("gate", inputs,
                                                                    timeout_s=10))

    assert await asyncio.to_thread(blocking) == sorted(str(i) for i in range(10))


async def test_an_input_the_client_cannot_encode_breaks_the_stream(
        fake: tuple[FakeTriton, str]) -> None:
    _, url = fake
    inputs = [{"x": X}, {"x": np.zeros((1, 2), np.complex64)}, {"x": X}]
    async with AsyncClient(url) as client:
        with pytest.raises(TypeError, match="unsupported dtype complex64"):
            async for _ in client.stream_infer("echo", inputs):
                pass


async def test_stream_errors_are_answers_and_the_deadline_ends_it(
        fake: tuple[FakeTriton, str]) -> None:
    _, url = fake
    async with AsyncClient(url) as client:
        results = [r async for r in client.stream_infer("overloaded", [{"x": X}] * 3)]
        assert len(results) == 3
        assert all(isinstance(r.error, ServerOverloadedError) for r in results)
        with pytest.raises(DeadlineExceededError):
            async for _ in client.stream_infer("hang", [{"x": X}] * 2, timeout_s=0.2):
                pass

    def blocking() -> None:
        with Client(url) as client:
            errors = [r.error for r in client.stream_infer("bad", [{"x": X}] * 2)]
            assert all(isinstance(e, InvalidInputError) for e in errors) and len(errors) == 2
            with pytest.raises(DeadlineExceededError):
                list(client.stream_infer("hang", [{"x": X}], timeout_s=0.2))

    await asyncio.to_thread(blocking)


def test_evenflow_status_header_decides_what_a_503_means() -> None:
    from evenflow.client import ServerOverloadedError, ServerUnavailableError
    from evenflow.client._rest_codec import error_of

    body = b'{"error": "words that name neither case"}'
    assert isinstance(error_of(503, body, "", "RESOURCE_EXHAUSTED"), ServerOverloadedError)
    assert isinstance(error_of(503, body, "", "UNAVAILABLE"), ServerUnavailableError)
    assert isinstance(error_of(503, body), ServerUnavailableError)  # another server: words
    assert error_of(503, body, "", "NOT_A_STATUS").http_status == 503
