"""A fake KServe v2 REST server that speaks Triton's wire format (binary tensor data, the
``{"error": ...}`` bodies, Triton's status codes), for the HTTP client and load generator tests,
and the checks that it decodes what ``tritonclient.http`` sends as Triton would.

Models: ``echo`` answers each input as the output of the same name (binary, or JSON ``data``
when the request asks for it); the others fail as their names say, or wait (``gate``: until
``gate_width`` requests are in flight; ``hang``: until the client gives up)."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.http as triton_http
import tritonclient.utils as triton_utils
from aiohttp import web
from tritonclient.http._utils import _get_inference_request

from evenflow.proto import metadata

ECHO_METADATA = {"name": "echo", "versions": ["1"], "platform": "pytorch",
                 "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                 "outputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]}
OVERLOADED = ("model 'overloaded' has 16 requests queued (limit 16, --max-queued-requests)")
FAILURES = {  # model -> (status, error message)
    "missing": (404, "Request for unknown model: 'missing' is not found"),
    "bad": (400, "input 'x': expected FP32, got INT64"),
    "overloaded": (503, OVERLOADED),
    "draining": (503, "the server is shutting down"),  # marked may-resend, as evenflow's
    "unready": (503, "Server not ready"),  # unmarked, as Triton's: it may have run
    "broken": (500, "internal server error (RuntimeError); see the server log"),
    "timeout": (504, "the request's deadline passed before it ran"),
}
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class FakeTriton:
    token: str | None = None
    ready: bool = True
    gate_width: int = 4
    unavailable_first: int = 0  # the first this many requests hear 503 (not an overload)
    calls: dict[str, int] = field(default_factory=dict)
    peers: set[Any] = field(default_factory=set)  # client connections seen
    requests: list[dict[str, Any]] = field(default_factory=list)  # JSON headers received
    in_flight: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    hang: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._checks])
        app.router.add_get("/v2/health/live", self._live)
        app.router.add_get("/v2/health/ready", self._ready)
        app.router.add_get("/v2/models/{model}", self._metadata)
        app.router.add_get("/v2/models/{model}/ready", self._model_ready)
        app.router.add_post("/v2/models/{model}/infer", self._infer)
        return app

    @web.middleware
    async def _checks(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.peers.add(request.transport.get_extra_info("peername") if request.transport
                       else None)
        path = request.path
        self.calls[path] = self.calls.get(path, 0) + 1
        if self.token is not None and \
                request.headers.get("Authorization") != f"Bearer {self.token}":
            return error(401, "no or wrong bearer token")
        if self.calls[path] <= self.unavailable_first:
            return error(503, "the server is shutting down")
        response: web.StreamResponse = await handler(request)
        return response

    async def _live(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def _metadata(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != "echo":
            return error(404, f"Request for unknown model: '{request.match_info['model']}'")
        return web.json_response(ECHO_METADATA)

    async def _model_ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if request.match_info["model"] == "echo" else 400)

    async def _infer(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model in FAILURES:
            return error(*FAILURES[model])
        header, inputs = decode_request(await request.read(),
                                        request.headers.get(HEADER_LENGTH))
        self.requests.append(header)
        self.in_flight += 1
        try:
            if model == "gate":
                if self.in_flight >= self.gate_width:
                    self.gate.set()
                await self.gate.wait()
            elif model == "hang":
                await self.hang.wait()
            elif model not in ("echo", "gate"):
                return error(404, f"Request for unknown model: '{model}' is not found")
        finally:
            self.in_flight -= 1
        return encode_response(header, inputs)


def error(status: int, message: str) -> web.Response:
    # evenflow marks the UNAVAILABLE of a request it did not run (``proto/metadata.py``).
    marked = status == 503 and message == "the server is shutting down"
    return web.json_response({"error": message}, status=status,
                             headers={metadata.MAY_RESEND: "1"} if marked else None)


def decode_request(body: bytes, header_length: str | None
                   ) -> tuple[dict[str, Any], dict[str, tuple[str, np.ndarray]]]:
    """The JSON header and each input (datatype, array), as Triton reads them."""
    json_end = len(body) if header_length is None else int(header_length)
    header = json.loads(body[:json_end])
    offset = json_end
    inputs = {}
    for tensor in header["inputs"]:
        datatype, shape = tensor["datatype"], tensor["shape"]
        size = tensor.get("parameters", {}).get("binary_data_size")
        if size is None:
            data = tensor["data"]
            array = (np.array([d.encode() for d in data], dtype=object) if datatype == "BYTES"
                     else np.array(data, dtype=triton_utils.triton_to_np_dtype(datatype)))
        else:
            raw = body[offset:offset + size]
            offset += size
            if datatype == "BYTES":
                array = triton_utils.deserialize_bytes_tensor(raw)
            elif datatype == "BF16":
                array = np.frombuffer(raw, dtype=np.uint16)
            else:
                array = np.frombuffer(raw, dtype=triton_utils.triton_to_np_dtype(datatype))
        inputs[tensor["name"]] = (datatype, array.reshape(shape))
    assert offset == len(body), "bytes left after the inputs"
    return header, inputs


def encode_response(header: dict[str, Any],
                    inputs: dict[str, tuple[str, np.ndarray]]) -> web.Response:
    """The echo model's answer: binary where the request asked for it, else JSON data."""
    wanted = {o["name"]: o.get("parameters", {}).get("binary_data", False)
              for o in header.get("outputs", [])}
    all_binary = header.get("parameters", {}).get("binary_data_output", False)
    outputs, chunks = [], []
    for name, (datatype, array) in inputs.items():
        if wanted and name not in wanted:
            continue
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if wanted.get(name, all_binary):
            raw = (triton_utils.serialize_byte_tensor(array).item() if datatype == "BYTES"
                   else array.tobytes())
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = ([v.decode() for v in array.reshape(-1)] if datatype == "BYTES"
                             else array.reshape(-1).tolist())
        outputs.append(entry)
    body = json.dumps({"model_name": "echo", "model_version": "1",
                       "id": header.get("id", ""), "outputs": outputs}).encode()
    headers = {HEADER_LENGTH: str(len(body))} if chunks else {}
    return web.Response(body=b"".join([body, *chunks]), headers=headers,
                        content_type="application/octet-stream" if chunks
                        else "application/json")


@asynccontextmanager
async def serving(fake: FakeTriton, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """The fake on 127.0.0.1 (a free port); yields its URL."""
    runner = web.AppRunner(fake.app(), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        fake.hang.set()
        fake.gate.set()
        await runner.cleanup()


def triton_request(*tensors: tuple[str, np.ndarray, str], outputs: list[str] | None = None,
                   binary: bool = True) -> tuple[bytes, int | None]:
    """What tritonclient.http sends for these inputs (name, array, datatype)."""
    infer_inputs = []
    for name, array, datatype in tensors:
        infer_input = triton_http.InferInput(name, list(array.shape), datatype)
        infer_input.set_data_from_numpy(array, binary_data=binary)
        infer_inputs.append(infer_input)
    requested = [triton_http.InferRequestedOutput(name, binary_data=binary)
                 for name in outputs or ()]
    return _get_inference_request(infer_inputs, "r", requested, 0, False, False, 0, None, None)


def test_the_fake_reads_tritonclients_binary_and_json_requests() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    words = np.array([b"a", b"", b"\xff\x00"], dtype=object)
    body, json_size = triton_request(("x", x, "FP32"), ("w", words, "BYTES"))
    header, inputs = decode_request(body, str(json_size))
    np.testing.assert_array_equal(inputs["x"][1], x)
    assert list(inputs["w"][1]) == list(words)
    assert header["parameters"] == {"binary_data_output": True}
    body, json_size = triton_request(("x", x, "FP32"), outputs=["x"], binary=False)
    assert json_size is None
    _, inputs = decode_request(body, None)
    np.testing.assert_array_equal(inputs["x"][1], x)


def test_tritonclient_reads_the_fakes_answers() -> None:
    x = np.arange(8, dtype=np.int32).reshape(2, 4)
    words = np.array([b"ab", b"c"], dtype=object)
    inputs = {"x": ("INT32", x), "w": ("BYTES", words)}
    for header in ({"parameters": {"binary_data_output": True}},
                   {"outputs": [{"name": "x", "parameters": {"binary_data": False}},
                                {"name": "w", "parameters": {"binary_data": True}}]}):
        response = encode_response({"inputs": [], **header}, inputs)
        assert isinstance(response.body, bytes)
        result = triton_http.InferResult.from_response_body(
            response.body, header_length=response.headers.get(HEADER_LENGTH))
        np.testing.assert_array_equal(result.as_numpy("x"), x)
        assert list(result.as_numpy("w")) == list(words)
