"""Bad HTTP requests against a live server's REST port, in raw bytes (no client library to fix
them up): every one gets the 4xx it must get with a JSON ``{"error": ...}`` naming the problem
(where a body is due), the server keeps serving (a good request on a new connection succeeds
after each), and its memory stays bounded (printed with ``-s``).

The generated part mirrors the gRPC suite (``test_generated_bad_requests``): each example
starts from a well-formed infer request for ``mlp`` or ``three`` (JSON and binary inputs mixed)
and applies one mutation, which says the status it must get and the words its message must
hold. The hand-written part covers what is not a body: the body limit before the body is read,
the head deadline and size limit, unknown paths and methods, and pipelining.
"""

from __future__ import annotations

import gzip
import io
import json
import select
import socket
import string
import time
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evenflow.server.edge.datatypes import WIRE_TYPES
from evenflow.server.edge.rest.http_port import HEAD_TIMEOUT_S, MAX_HEAD_BYTES
from evenflow.server.models.spec import ModelDefinition, TensorSpec
from tests.integration.test_generated_bad_requests import bytes_elements, rss_kib
from tests.servers import ServerProcess

# slow: thousands of generated requests and a head sent a byte a second, to a subprocess server.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MAX_MESSAGE_BYTES = 1 << 18
MAX_BATCH = 16
EXAMPLES = 2000
GOOD_EXAMPLES = 200
READ_TIMEOUT_S = 30.0  # a generous bound on any one answer on a loaded 2-core machine
MEMORY_GROWTH_BYTES = 200 * 1024 * 1024
MODELS = ("mlp", "three", "bf16")
REQUEST_PARAMETERS = ("priority", "timeout", "binary_data_output",
                      "triton_enable_empty_final_response")


def bf16_input() -> ModelDefinition:
    """A BF16 input (``--model bf16=...``): JSON cannot carry it, only binary data can."""
    return ModelDefinition(module=torch.nn.Identity(), inputs=[TensorSpec("x", "BF16", (-1, 3))],
                           outputs=[TensorSpec("y", "BF16", (-1, 3))], traceable=False)


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory(
        "--model", "mlp", "--model", "three=tests.fixture_models:three_inputs",
        "--model", f"bf16={__name__}:bf16_input",
        "--devices", "cpu", "--max-batch", str(MAX_BATCH), "--max-wait-ms", "0",
        "--max-message-bytes", str(MAX_MESSAGE_BYTES), "--log-level", "WARNING")


@pytest.fixture(scope="module")
def address(server: ServerProcess) -> tuple[str, int]:
    host, port = server.http_url.rsplit(":", 1)
    return host, int(port)


def rss_bytes(pid: int) -> int:
    return rss_kib(pid) * 1024


@pytest.fixture(scope="module")
def rss_at_start_bytes(server: ServerProcess, address: tuple[str, int]) -> int:
    """The server's RSS once it has answered a good request (warm), before any bad one."""
    assert_serves(address)
    return rss_bytes(server.proc.pid)


# --- raw HTTP/1.1 --------------------------------------------------------------------------

@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes

    def error(self) -> str:
        """The ``error`` of a JSON error body (asserting that it is one)."""
        assert self.headers.get("content-type") == "application/json", self
        document = json.loads(self.body)
        assert isinstance(document, dict) and isinstance(document.get("error"), str), self
        return str(document["error"])


def http_request(method: str, path: str, body: bytes = b"",
                 headers: list[tuple[str, str]] | None = None, *,
                 content_length: bool = True) -> bytes:
    """One request's bytes: Host, then ``headers``, then Content-Length (unless told not to)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers or []]
    if content_length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def connect(address: tuple[str, int], timeout_s: float = READ_TIMEOUT_S) -> socket.socket:
    return socket.create_connection(address, timeout=timeout_s)


def read_response(reader: io.BufferedReader, *, head_only: bool = False) -> Response:
    """One response from ``reader`` (a socket's binary file); the server always sends a
    Content-Length."""
    status_line = reader.readline(65536)
    assert status_line, "the connection closed before an answer"
    version, status, _ = status_line.decode("latin-1").split(" ", 2)
    assert version == "HTTP/1.1", status_line
    headers: dict[str, str] = {}
    while (line := reader.readline(65536)) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head_only else int(headers.get("content-length", "0"))
    body = reader.read(length) if length else b""
    assert len(body) == length, f"the answer's body was cut: {len(body)} of {length} bytes"
    return Response(int(status), headers, body)


def exchange(address: tuple[str, int], request: bytes, *, head_only: bool = False) -> Response:
    """``request`` on a new connection, and its answer."""
    with connect(address) as sock, sock.makefile("rb") as reader:
        sock.sendall(request)
        return read_response(reader, head_only=head_only)


def assert_closed(sock: socket.socket, reader: io.BufferedReader) -> None:
    """The server closed the connection: nothing more comes, and the read ends (no hang)."""
    sock.settimeout(5.0)
    assert reader.read() == b""


# --- good infer requests -------------------------------------------------------------------

@dataclass
class Infer:
    """An infer request being built: ``inputs`` are JSON header entries, ``binary`` each one's
    binary bytes (None: its data is JSON). ``body`` and ``header_length`` override what the
    parts would give (a mutation of the bytes), ``send_header_length`` False leaves
    Inference-Header-Content-Length out; ``headers`` are sent as they are."""

    model: str
    document: dict[str, Any]
    binary: list[bytes | None]
    path: str = ""
    body: bytes | None = None
    header_length: str | None = None  # None: the JSON header's length when binary is sent
    send_header_length: bool = True
    headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def inputs(self) -> list[dict[str, Any]]:
        inputs: list[dict[str, Any]] = self.document["inputs"]
        return inputs

    def header(self) -> bytes:
        return json.dumps(self.document).encode()

    def binary_section(self) -> bytes:
        return b"".join(part for part in self.binary if part is not None)

    def encode(self) -> bytes:
        header = self.header()
        body = self.body if self.body is not None else header + self.binary_section()
        headers = list(self.headers)
        length = self.header_length
        if length is None and any(part is not None for part in self.binary):
            length = str(len(header))
        if length is not None and self.send_header_length:
            headers.append(("Inference-Header-Content-Length", length))
        return http_request("POST", self.path or f"/v2/models/{self.model}/infer", body,
                            headers)


def tensor(name: str, datatype: str, array: np.ndarray, as_binary: bool, nested: bool
           ) -> tuple[dict[str, Any], bytes | None]:
    """A header entry and its binary bytes (None: JSON data, flat or nested as the shape)."""
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    if as_binary:
        raw = bytes_elements(list(array.reshape(-1))) if datatype == "BYTES" else array.tobytes()
        entry["parameters"] = {"binary_data_size": len(raw)}
        return entry, raw
    values = array.tolist() if nested else array.reshape(-1).tolist()
    if datatype == "BYTES":
        values = [[v.decode() for v in row] for row in values] if nested \
            else [v.decode() for v in values]
    entry["data"] = values
    return entry, None


@st.composite
def good_infers(draw: st.DrawFn) -> Infer:
    """A request the server answers 200, for ``mlp`` or ``three``, its inputs each JSON (flat or
    nested) or binary, its outputs asked for or not, as JSON or binary."""
    three = draw(st.booleans())
    batch = draw(st.integers(1, 4 if three else MAX_BATCH))
    arrays: list[tuple[str, str, np.ndarray]]
    if three:
        length = draw(st.integers(1, 6))
        arrays = [("x", "FP32", np.full((batch, 4), 0.5, np.float32)),
                  ("ids", "INT64", np.arange(batch * length, dtype=np.int64)
                   .reshape(batch, length)),
                  ("text", "BYTES", np.array([[b"ab", b""]] * batch, dtype=object))]
    else:
        arrays = [("x", "FP32", np.linspace(-1, 1, batch * 256, dtype=np.float32)
                   .reshape(batch, 256))]
    entries, binary = [], []
    for name, datatype, array in arrays:
        entry, raw = tensor(name, datatype, array, draw(st.booleans()), draw(st.booleans()))
        entries.append(entry)
        binary.append(raw)
    document: dict[str, Any] = {"inputs": entries}
    if draw(st.booleans()):
        document["id"] = draw(st.text(max_size=20))
    if draw(st.booleans()):
        document["outputs"] = [{"name": "y", "parameters": {"binary_data": draw(st.booleans())}}]
    if draw(st.booleans()):
        document["parameters"] = {"binary_data_output": draw(st.booleans())}
    return Infer("three" if three else "mlp", document, binary)


# --- mutations: each takes a good request and returns what it did, the status it must get
# and words of which the error message must hold one (case-insensitive) ---------------------

Result = tuple[str, int, tuple[str, ...]]
Mutation = Callable[[Infer, st.DataObject], Result]

# JSON values of each kind, to put where another kind belongs.
_STRINGS = st.text(max_size=8)
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)  # (JSON has no NaN nor infinity)
_NUMBERS = st.integers(-5, 5) | _FLOATS
_LISTS = st.lists(st.integers(0, 3), max_size=3)
_OBJECTS = st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2)
_NOT_A = {
    "string": st.none() | st.booleans() | _NUMBERS | _LISTS | _OBJECTS,
    "list": st.none() | st.booleans() | _NUMBERS | _STRINGS | _OBJECTS,
    "object": st.none() | st.booleans() | _NUMBERS | _STRINGS | _LISTS,
    "integer": st.none() | st.booleans() | _FLOATS | _STRINGS | _LISTS | _OBJECTS,
    "boolean": st.none() | _NUMBERS | _STRINGS | _LISTS | _OBJECTS,
}


def pick(infer: Infer, data: st.DataObject) -> int:
    return data.draw(st.integers(0, len(infer.inputs) - 1))


def as_json(infer: Infer, i: int) -> None:
    """Input ``i`` with JSON data (zeros of its shape) in place of binary data."""
    if infer.binary[i] is None:
        return
    entry = infer.inputs[i]
    count = int(np.prod(entry["shape"]))
    entry.pop("parameters")
    entry["data"] = [""] * count if entry["datatype"] == "BYTES" else [0] * count
    infer.binary[i] = None


def malformed_json(infer: Infer, data: st.DataObject) -> Result:
    header = infer.header()
    kind = data.draw(st.sampled_from(["truncated", "leading", "trailing", "comma", "quotes",
                                      "utf-8", "empty", "deep"]))
    if kind == "truncated":
        header = header[:data.draw(st.integers(0, len(header) - 1))]
    elif kind == "leading":
        header = data.draw(st.sampled_from([b"x", b"]", b"\x00", b"{"])) + header
    elif kind == "trailing":
        header += data.draw(st.sampled_from([b"x", b"}", b",", b"{}", b"\x00"]))
    elif kind == "comma":
        header = header[:-1] + b",}"
    elif kind == "quotes":
        header = header.replace(b'"', b"'")
    elif kind == "utf-8":
        header = header.replace(b'"inputs"', b'"in\xff\xfeputs"')
    elif kind == "empty":
        header = b""
    else:
        depth = data.draw(st.integers(1000, 100_000))  # (parameters are any JSON)
        header = b'{"inputs": [], "parameters": {"k": ' + b"[" * depth + b"]" * depth + b"}}"
    infer.body = header + infer.binary_section()
    if any(part is not None for part in infer.binary):
        infer.header_length = str(len(header))
    return f"JSON {kind}", 400, ("JSON", "nested") if kind == "deep" else ("JSON",)


def wrong_json_type(infer: Infer, data: st.DataObject) -> Result:
    """A value of the wrong JSON type (or an unknown field) somewhere in the header."""
    document = infer.document
    i = pick(infer, data)
    entry = infer.inputs[i]
    # (where, the container, the key, what belongs there)
    places: list[tuple[str, Any, Any, str]] = [
        ("inputs", document, "inputs", "list"), ("inputs[i]", document["inputs"], i, "object"),
        ("name", entry, "name", "string"), ("datatype", entry, "datatype", "string"),
        ("shape", entry, "shape", "list"), ("shape[k]", entry["shape"],
                                            data.draw(st.integers(0, len(entry["shape"]) - 1)),
                                            "integer"),
        ("input parameters", entry, "parameters", "object"),
        ("parameters", document, "parameters", "object"), ("outputs", document, "outputs", "list"),
    ]
    if "id" in document:  # (null is a valid id: no id)
        places.append(("id", document, "id", "string"))
    if "outputs" in document:
        output = document["outputs"][0]
        places += [("outputs[j]", document["outputs"], 0, "object"),
                   ("output name", output, "name", "string"),
                   ("output parameters", output, "parameters", "object")]
    where, container, key, kind = data.draw(st.sampled_from(places))
    if data.draw(st.integers(0, 9)) == 0 and isinstance(container, dict):
        container[data.draw(st.sampled_from(["zzz", "Name", "shapes", "binary_data"]))] = 1
        return f"unknown field beside {where!r}", 400, ("unknown field",)
    value = data.draw(_NOT_A[kind].filter(lambda v: not (where == "id" and v is None)))
    container[key] = value
    return f"{where} = {value!r}", 400, ("protocol",)


def header_length(infer: Infer, data: st.DataObject) -> Result:
    """A wrong, missing or malformed Inference-Header-Content-Length."""
    header = infer.header()
    body = header + infer.binary_section()
    has_binary = any(part is not None for part in infer.binary)
    kinds = ["past the body", "negative", "not a number", "empty", "inside the header"]
    if has_binary:
        kinds += ["missing", "inside the binary data"]
    kind = data.draw(st.sampled_from(kinds))
    if kind == "past the body":
        value = str(len(body) + data.draw(st.integers(1, 2**70)))
    elif kind == "negative":
        value = str(-data.draw(st.integers(1, 2**40)))
    elif kind == "not a number":
        value = data.draw(st.text(string.ascii_letters + string.digits + "+-.,_", min_size=1,
                                  max_size=12).filter(lambda t: not t.isdigit()))
    elif kind == "empty":
        value = ""
    elif kind == "inside the header":
        value = str(data.draw(st.integers(0, len(header) - 1)))
    elif kind == "missing":
        infer.send_header_length = False
        return kind, 400, ("JSON", "binary")
    else:
        value = str(len(header) + data.draw(st.integers(1, len(body) - len(header))))
    infer.header_length = value
    return f"Inference-Header-Content-Length {value!r} ({kind})", 400, (
        "Inference-Header-Content-Length", "JSON", "binary")


def binary_data_size(infer: Infer, data: st.DataObject) -> Result:
    """binary_data_size past the body, not adding up to it, not an integer >= 0, or on an
    input that also has JSON data."""
    binary_inputs = [i for i, part in enumerate(infer.binary) if part is not None]
    kind = data.draw(st.sampled_from(["past", "short", "negative", "not an integer",
                                      "beside JSON data"]))
    if kind == "beside JSON data" or not binary_inputs:
        i = pick(infer, data)
        as_json(infer, i)
        infer.inputs[i]["parameters"] = {"binary_data_size": 0}
        return f"binary_data_size 0 beside JSON data on {infer.inputs[i]['name']}", 400, (
            "both",)
    i = data.draw(st.sampled_from(binary_inputs))
    parameters = infer.inputs[i]["parameters"]
    size = parameters["binary_data_size"]
    if kind == "past":
        parameters["binary_data_size"] = size + data.draw(st.integers(1, 2**70))
    elif kind == "short":
        parameters["binary_data_size"] = data.draw(st.integers(0, size - 1)) if size else 1
    elif kind == "negative":
        parameters["binary_data_size"] = -data.draw(st.integers(1, 2**40))
    else:
        parameters["binary_data_size"] = data.draw(_NOT_A["integer"])
    return f"binary_data_size {parameters['binary_data_size']!r} for {size} ({kind})", 400, (
        "binary_data_size", "binary data", "raw data", "bytes")


def shape_disagrees(infer: Infer, data: st.DataObject) -> Result:
    """A shape that disagrees with the data sent (JSON or binary) or with the model."""
    i = pick(infer, data)
    shape = list(infer.inputs[i]["shape"])
    kind = data.draw(st.sampled_from(["other", "zero", "huge", "rank+", "rank-", "negative"]))
    position = data.draw(st.integers(0, len(shape) - 1))
    if kind == "other":
        shape[position] = data.draw(st.integers(1, 300).filter(lambda d: d != shape[position]))
    elif kind == "zero":
        shape[position] = 0
    elif kind == "huge":
        shape[position] = data.draw(st.integers(2**20, 2**80))
    elif kind == "rank+":
        shape.append(data.draw(st.integers(1, 4)))
    elif kind == "rank-":
        shape.pop()
    else:
        shape[position] = -data.draw(st.integers(1, 2**62))
    infer.inputs[i]["shape"] = shape
    return f"shape {shape} ({kind}, {'binary' if infer.binary[i] else 'JSON'})", 400, (
        "shape", "batch", "elements")


def ragged_rows(infer: Infer, data: st.DataObject) -> Result:
    """Nested JSON data with a row too short or too long for the shape."""
    i = pick(infer, data)
    as_json(infer, i)
    entry = infer.inputs[i]
    rows, columns = entry["shape"]
    flat = entry["data"] if not isinstance(entry["data"][0], list) else \
        [v for row in entry["data"] for v in row]
    nested = [flat[r * columns:(r + 1) * columns] for r in range(rows)]
    row = data.draw(st.integers(0, rows - 1))
    nested[row] = nested[row][:-1] if data.draw(st.booleans()) else nested[row] + nested[row][:1]
    entry["data"] = nested
    return f"ragged row {row} of {entry['name']}", 400, ("ragged", "shape")


def wrong_data_values(infer: Infer, data: st.DataObject) -> Result:
    """JSON data elements that do not fit the input's datatype."""
    i = pick(infer, data)
    as_json(infer, i)
    entry = infer.inputs[i]
    bad = {"FP32": st.sampled_from([1e39, -1e39, "1", True, None, [1.0], {"a": 1}]),
           "INT64": st.sampled_from([1.5, 2**63, -(2**63) - 1, "1", True, None, [1]]),
           "BYTES": st.sampled_from([1, 1.5, True, None, ["a"], {"a": "b"}])}[entry["datatype"]]
    flat = entry["data"] if not isinstance(entry["data"][0], list) else \
        [v for row in entry["data"] for v in row]
    # A one-element tensor's only element as a list is the nested form of the same data
    # (`[[1]]` for shape [1, 1]), which the protocol allows; beside other elements it is ragged.
    value = data.draw(bad if len(flat) > 1 else bad.filter(lambda v: not isinstance(v, list)))
    flat[data.draw(st.integers(0, len(flat) - 1))] = value
    entry["data"] = flat
    return f"{entry['datatype']} element {value!r}", 400, ("data",)


def not_a_list_of_data(infer: Infer, data: st.DataObject) -> Result:
    i = pick(infer, data)
    as_json(infer, i)
    value = data.draw(_NOT_A["list"])
    infer.inputs[i]["data"] = value
    return f"data = {value!r}", 400, ("data",)


def wrong_datatype(infer: Infer, data: st.DataObject) -> Result:
    i = pick(infer, data)
    current = infer.inputs[i]["datatype"]
    new = data.draw(st.sampled_from(sorted(set(WIRE_TYPES) - {current}))
                    | st.text(max_size=40).filter(lambda t: t != current))
    infer.inputs[i]["datatype"] = new
    return f"datatype {new!r}", 400, ("datatype",)


def bf16_as_json(infer: Infer, data: st.DataObject) -> Result:
    batch = data.draw(st.integers(1, 4))
    infer.model, infer.binary = "bf16", [None]
    infer.document = {"inputs": [{"name": "x", "datatype": "BF16", "shape": [batch, 3],
                                  "data": [1.0] * (3 * batch)}]}
    return f"BF16 [{batch}, 3] as JSON", 400, ("BF16",)


def wrong_names(infer: Infer, data: st.DataObject) -> Result:
    """Unknown, missing or repeated inputs; unknown, repeated or badly parameterized outputs."""
    kind = data.draw(st.sampled_from(["unknown input", "missing input", "input twice",
                                      "unknown output", "output twice", "output parameter",
                                      "binary_data not a boolean"]))
    i = pick(infer, data)
    names = {entry["name"] for entry in infer.inputs}
    if kind == "unknown input":
        infer.inputs[i]["name"] = data.draw(st.text(max_size=100).filter(lambda n: n not in names))
    elif kind == "missing input":
        del infer.inputs[i]
        del infer.binary[i]
    elif kind == "input twice":
        infer.inputs.append(dict(infer.inputs[i]))
        infer.binary.append(infer.binary[i])
    elif kind == "unknown output":
        infer.document["outputs"] = [{"name": data.draw(st.text(max_size=100)
                                                        .filter(lambda n: n != "y"))}]
    elif kind == "output twice":
        infer.document["outputs"] = [{"name": "y"}, {"name": "y"}]
    elif kind == "output parameter":
        infer.document["outputs"] = [{"name": "y", "parameters": {"classification": 3}}]
    else:
        value = data.draw(_NOT_A["boolean"].filter(lambda v: v is not None))
        infer.document["outputs"] = [{"name": "y", "parameters": {"binary_data": value}}]
    return kind, 400, ("output" if "output" in kind or "binary_data" in kind else "input",)


def bad_parameters(infer: Infer, data: st.DataObject) -> Result:
    kind = data.draw(st.sampled_from(["unknown", "priority", "timeout", "binary_data_output",
                                      "tensor", "not an object"]))
    parameters = infer.document.setdefault("parameters", {})
    value: Any  # a JSON value of the wrong kind
    if kind == "unknown":
        key = data.draw(st.text(min_size=1, max_size=50).filter(
            lambda k: k not in REQUEST_PARAMETERS))
        parameters[key] = data.draw(st.booleans() | st.integers() | _STRINGS)
        return f"parameter {key!r}", 400, ("parameter",)
    if kind == "priority":
        # Not a large one: past the levels is the default level, as on Triton.
        value = data.draw(st.integers(-(2**63), -1) | _STRINGS
                          | st.booleans() | _FLOATS | _LISTS)
        parameters["priority"] = value
        return f"priority {value!r}", 400, ("priority",)
    if kind == "timeout":
        value = data.draw(st.integers(-(2**63), -1) | _STRINGS | st.booleans() | _FLOATS
                          | _OBJECTS)
        parameters["timeout"] = value
        return f"timeout {value!r}", 400, ("timeout",)
    if kind == "binary_data_output":
        value = data.draw(_NOT_A["boolean"].filter(lambda v: v is not None))
        parameters["binary_data_output"] = value
        return f"binary_data_output {value!r}", 400, ("binary_data_output",)
    if kind == "tensor":
        i = pick(infer, data)
        key = data.draw(st.sampled_from(["shared_memory_region", "shared_memory_byte_size",
                                         "binary_data"]))
        infer.inputs[i].setdefault("parameters", {})[key] = "region"
        return f"tensor parameter {key!r}", 400, ("parameters",)
    value = data.draw(_NOT_A["object"])
    infer.document["parameters"] = value
    return f"parameters = {value!r}", 400, ("protocol",)


def unknown_model(infer: Infer, data: st.DataObject) -> Result:
    """An unknown model or version (a '/' in the name would make it another path)."""
    if data.draw(st.booleans()):
        name = data.draw(st.text(max_size=100).filter(lambda n: n not in MODELS and "/" not in n))
        infer.path = f"/v2/models/{urllib.parse.quote(name, safe='')}/infer"
        return f"model {name[:20]!r}", 404, ("model", "endpoint")
    version = data.draw(st.text(min_size=1, max_size=20).filter(
        lambda v: v != "1" and "/" not in v))
    infer.path = f"/v2/models/{infer.model}/versions/{urllib.parse.quote(version, safe='')}/infer"
    return f"version {version!r}", 404, ("version",)


def over_max_batch(infer: Infer, data: st.DataObject) -> Result:
    batch = data.draw(st.integers(MAX_BATCH + 1, 4 * MAX_BATCH))
    entry, raw = tensor("x", "FP32", np.zeros((batch, 256), np.float32),
                        data.draw(st.booleans()), False)
    infer.model, infer.document, infer.binary = "mlp", {"inputs": [entry]}, [raw]
    return f"batch {batch} > max batch {MAX_BATCH}", 400, ("batch",)


def bad_compression(infer: Infer, data: st.DataObject) -> Result:
    """Content-Encoding gzip or deflate over what is not (all of) that, a body that inflates
    past the limit, or an encoding the server does not know."""
    body = infer.header() + infer.binary_section()
    kind = data.draw(st.sampled_from(["not compressed", "random bytes", "truncated", "trailing",
                                      "bomb", "unknown encoding"]))
    encoding = data.draw(st.sampled_from(["gzip", "deflate"]))
    compress = gzip.compress if encoding == "gzip" else zlib.compress
    if kind == "unknown encoding":
        encoding = data.draw(st.sampled_from(["br", "zstd", "compress", "x-gzip", "gzip, gzip"])
                             | st.text(string.ascii_letters + string.digits + "-", min_size=1,
                                       max_size=16).filter(lambda t: t.lower() not in (
                                           "gzip", "deflate", "identity")))
        keywords: tuple[str, ...] = ("Content-Encoding",)
    elif kind == "not compressed":
        keywords = (encoding, "JSON")  # (JSON text can be a valid start of raw deflate)
    elif kind == "random bytes":
        body = data.draw(st.binary(min_size=1, max_size=64))
        keywords = (encoding, "JSON")  # (a few random bytes can be a valid empty stream)
    elif kind == "truncated":
        compressed = compress(body)
        body = compressed[:data.draw(st.integers(1, len(compressed) - 1))]
        keywords = (encoding,)
    elif kind == "trailing":
        body = compress(body) + data.draw(st.binary(min_size=1, max_size=16))
        keywords = (encoding, "follow")
    else:
        body = compress(bytes(MAX_MESSAGE_BYTES + data.draw(st.integers(1, 1 << 20))))
        keywords = ("limit",)
    infer.body = body
    infer.headers.append(("Content-Encoding", encoding))
    return f"{kind} ({encoding})", 413 if kind == "bomb" else 400, keywords


MUTATIONS: list[Mutation] = [
    malformed_json, wrong_json_type, header_length, binary_data_size, shape_disagrees,
    ragged_rows, wrong_data_values, not_a_list_of_data, wrong_datatype, bf16_as_json,
    wrong_names, bad_parameters, unknown_model, over_max_batch, bad_compression]


@dataclass(repr=False)
class Case:
    request: bytes
    expected: int
    keywords: tuple[str, ...]
    what: str

    def __repr__(self) -> str:  # (the request's start: hypothesis prints failing cases)
        return f"Case({self.what!r}, {self.expected}, {self.request[:400]!r})"


@st.composite
def bad_requests(draw: st.DrawFn) -> Case:
    data = draw(st.data())
    infer = draw(good_infers())
    mutation = draw(st.sampled_from(MUTATIONS))
    what, expected, keywords = mutation(infer, data)
    return Case(infer.encode(), expected, keywords, f"{mutation.__name__}: {what}")


def good_request(request_id: str = "good") -> bytes:
    document = {"id": request_id, "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 256], "data": [0.25] * 256}]}
    return http_request("POST", "/v2/models/mlp/infer", json.dumps(document).encode())


def assert_answered(response: Response, request_id: str = "good") -> None:
    assert response.status == 200, response
    document = json.loads(response.body)
    assert document["id"] == request_id
    assert document["outputs"][0]["shape"] == [1, 256]


def assert_serves(address: tuple[str, int]) -> None:
    """A good request on a new connection is answered."""
    assert_answered(exchange(address, good_request()))


def assert_refused(response: Response, status: int, *keywords: str) -> str:
    """``response`` is ``status`` with a JSON error that holds one of ``keywords``."""
    assert response.status == status, response
    message = response.error()
    assert any(word.lower() in message.lower() for word in keywords), (keywords, message)
    return message


# --- the generated suite -------------------------------------------------------------------

def test_the_requests_the_mutations_start_from_are_answered(address: tuple[str, int]) -> None:
    """So a refusal in the suite below is the mutation's doing, not the base request's."""

    @settings(max_examples=GOOD_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(good_infers())
    def check(infer: Infer) -> None:
        response = exchange(address, infer.encode())
        assert response.status == 200, response
        length = response.headers.get("inference-header-content-length")
        header = json.loads(response.body[:int(length)] if length else response.body)
        assert [output["name"] for output in header["outputs"]] == ["y"]

    check()


@pytest.mark.timeout(300)
def test_generated_bad_infer_requests_get_a_4xx_naming_the_problem(
        server: ServerProcess, address: tuple[str, int], rss_at_start_bytes: int) -> None:
    seen: dict[str, int] = {}
    started_s = time.monotonic()

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(bad_requests())
    def check(case: Case) -> None:
        kind = case.what.split(":")[0]
        seen[kind] = seen.get(kind, 0) + 1
        response = exchange(address, case.request)
        assert response.status == case.expected, f"{case.what}: {response}"
        message = response.error()
        assert len(message) > 10, f"{case.what}: {message!r}"
        assert any(word.lower() in message.lower() for word in case.keywords), \
            f"{case.what}: {message!r} names none of {case.keywords}"
        assert_serves(address)

    check()
    took_s = time.monotonic() - started_s
    rss = rss_bytes(server.proc.pid)
    print(f"\n{sum(seen.values())} bad requests in {took_s:.0f} s by mutation: "
          f"{dict(sorted(seen.items()))}; server RSS {rss_at_start_bytes / 2**20:.0f} -> "
          f"{rss / 2**20:.0f} MiB")
    assert set(seen) == {mutation.__name__ for mutation in MUTATIONS}  # every kind ran
    assert sum(seen.values()) >= 0.9 * EXAMPLES
    assert rss - rss_at_start_bytes < MEMORY_GROWTH_BYTES, "server memory grew past the bound"


# --- the body limit ------------------------------------------------------------------------

def test_a_content_length_far_beyond_the_limit_is_refused_before_the_body_is_sent(
        address: tuple[str, int]) -> None:
    head = http_request("POST", "/v2/models/mlp/infer", content_length=False,
                        headers=[("Content-Length", str(10**12))])
    started_s = time.monotonic()
    with connect(address, timeout_s=2.0) as sock, sock.makefile("rb") as reader:
        sock.sendall(head)  # the head only: the answer must not wait for a body
        response = read_response(reader)
        took_s = time.monotonic() - started_s
        assert_refused(response, 413, str(MAX_MESSAGE_BYTES))
        assert response.headers.get("connection") == "close"
        assert_closed(sock, reader)
    assert took_s < 2.0
    assert_serves(address)


def test_a_chunked_body_growing_past_the_limit_gets_413(address: tuple[str, int]) -> None:
    chunk = b"a" * 16384
    chunks = (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * (MAX_MESSAGE_BYTES // len(chunk) + 1)
    request = http_request("POST", "/v2/models/mlp/infer", chunks, content_length=False,
                           headers=[("Transfer-Encoding", "chunked")])
    with connect(address) as sock, sock.makefile("rb") as reader:
        sock.sendall(request)  # no last chunk: the refusal cannot wait for the body's end
        response = read_response(reader)
        assert_refused(response, 413, "limit")
        assert_closed(sock, reader)
    assert_serves(address)


# --- the request head ----------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_head_sent_a_byte_a_second_is_cut_at_the_head_deadline(address: tuple[str, int]
                                                                 ) -> None:
    # HEAD_TIMEOUT_S is not configurable (neither flag nor config), so the test takes ~10 s.
    head = http_request("GET", "/v2", headers=[("X-Slow", "a" * 64)])
    started_s = time.monotonic()
    with connect(address) as sock, sock.makefile("rb") as reader:
        for byte in head[:-4]:  # never the end of the head
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            # A second between bytes, ended early by the server's answer.
            if select.select([sock], [], [], 1.0)[0]:
                break
            assert time.monotonic() - started_s < HEAD_TIMEOUT_S + 5, "the head was not cut"
        response = read_response(reader)
        took_s = time.monotonic() - started_s
        assert_refused(response, 408, "head")
        assert_closed(sock, reader)
    print(f"\nhead sent a byte a second: {response.status} after {took_s:.1f} s "
          f"(deadline {HEAD_TIMEOUT_S} s)")
    assert HEAD_TIMEOUT_S - 1 <= took_s <= HEAD_TIMEOUT_S + 2
    assert_serves(address)


def test_a_head_over_64_kib_gets_431(address: tuple[str, int]) -> None:
    head = b"GET /v2 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 1024)
    with connect(address, timeout_s=3.0) as sock, sock.makefile("rb") as reader:
        sock.sendall(head)  # not ended: the server reads all of it, then must refuse
        response = read_response(reader)
        assert_refused(response, 431, "head")
        assert_closed(sock, reader)
    assert_serves(address)


def test_a_1_mib_head_is_never_served(address: tuple[str, int]) -> None:
    """Sent at once, a 1 MiB head is refused (431) or cut, never answered 200 nor waited on
    until the head deadline. (The server may close before reading it all: a reset.)"""
    head = b"GET /v2 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (1 << 20)
    started_s = time.monotonic()
    with connect(address, timeout_s=5.0) as sock, sock.makefile("rb") as reader:
        try:
            sock.sendall(head + b"\r\n\r\n")
            status_line = reader.readline()
        except (BrokenPipeError, ConnectionResetError):
            status_line = b""
    assert status_line in (b"", b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), status_line
    assert time.monotonic() - started_s < HEAD_TIMEOUT_S / 2
    assert_serves(address)


# --- malformed HTTP ------------------------------------------------------------------------

@pytest.mark.parametrize("request_bytes", [
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n",
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n",
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n"
    b"Content-Length: 3\r\n\r\nabc",
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nabc\r\n0\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: a\r\nno colon\r\n\r\n",
    b"GET /v2 HTTP/9.x\r\n\r\n",
    b"\x00\x01\x02\x03\r\n\r\n",
], ids=["length-not-a-number", "negative-length", "two-lengths", "bad-chunk-size",
        "space-in-name", "nul-in-value", "no-colon", "bad-version", "binary"])
def test_malformed_http_gets_400_and_a_close(address: tuple[str, int], request_bytes: bytes
                                             ) -> None:
    with connect(address) as sock, sock.makefile("rb") as reader:
        sock.sendall(request_bytes)
        assert_refused(read_response(reader), 400, "invalid", "Content-Length")
        assert_closed(sock, reader)
    assert_serves(address)


# --- paths, methods --------------------------------------------------------------------

@pytest.mark.parametrize("method", ["GET", "POST", "HEAD"])
@pytest.mark.parametrize("path", ["/nope", "/v2/model/mlp/infer", "/v2/models/mlp/infer/more",
                                  "/v2/models/mlp/versions", "/v2/repository/models/mlp/drop",
                                  "/v3", "/v2/models//infer", "/%ff%fe"])
def test_unknown_paths_get_404_as_json(address: tuple[str, int], method: str, path: str
                                       ) -> None:
    head_only = method == "HEAD"
    response = exchange(address, http_request(method, path), head_only=head_only)
    assert response.status == 404, response
    if head_only:  # the same head as GET's, no body
        assert response.headers["content-type"] == "application/json"
        assert int(response.headers["content-length"]) > 10
    else:
        assert_refused(response, 404, "no such endpoint")


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/v2/models/mlp/infer", "POST"), ("PUT", "/v2/models/mlp/infer", "POST"),
    ("DELETE", "/v2/models/mlp", "GET"), ("POST", "/v2/health/live", "GET"),
    ("PATCH", "/v2", "GET"), ("GET", "/v2/repository/index", "POST"),
    ("GET", "/v2/repository/models/mlp/load", "POST"), ("OPTIONS", "/v2/models/mlp/ready", "GET"),
    ("HEAD", "/v2/models/mlp/infer", "POST")])
def test_wrong_methods_get_405_with_allow(address: tuple[str, int], method: str, path: str,
                                          allowed: str) -> None:
    head_only = method == "HEAD"
    response = exchange(address, http_request(method, path), head_only=head_only)
    assert response.status == 405, response
    assert response.headers["allow"] == allowed
    if not head_only:
        assert_refused(response, 405, method)
    assert_serves(address)


# --- pipelining ----------------------------------------------------------------------------

def test_pipelined_garbage_after_a_good_request_is_answered_after_it(
        address: tuple[str, int]) -> None:
    with connect(address) as sock, sock.makefile("rb") as reader:
        sock.sendall(good_request("first") + b"GARBAGE GARBAGE\r\n\r\n")
        assert_answered(read_response(reader), "first")
        assert_refused(read_response(reader), 400, "invalid")
        assert_closed(sock, reader)
    assert_serves(address)


def test_garbage_after_a_good_request_on_one_connection_gets_400_and_a_close(
        address: tuple[str, int]) -> None:
    with connect(address) as sock, sock.makefile("rb") as reader:
        sock.sendall(good_request("first"))
        assert_answered(read_response(reader), "first")
        sock.sendall(b"\x16\x03\x01 not http\r\n\r\n")  # (a TLS hello's first bytes)
        assert_refused(read_response(reader), 400, "invalid")
        assert_closed(sock, reader)
    assert_serves(address)


def test_many_pipelined_good_requests_are_answered_in_order(address: tuple[str, int]) -> None:
    ids = [f"r{i}" for i in range(64)]
    with connect(address) as sock, sock.makefile("rb") as reader:
        sock.sendall(b"".join(good_request(request_id) for request_id in ids))
        for request_id in ids:
            assert_answered(read_response(reader), request_id)


# --- memory --------------------------------------------------------------------------------

def test_the_servers_memory_stayed_bounded_over_the_suite(
        server: ServerProcess, address: tuple[str, int], rss_at_start_bytes: int) -> None:
    assert_serves(address)
    rss = rss_bytes(server.proc.pid)
    print(f"\nserver RSS over the suite: {rss_at_start_bytes / 2**20:.0f} -> "
          f"{rss / 2**20:.0f} MiB")
    assert rss - rss_at_start_bytes < MEMORY_GROWTH_BYTES, "server memory grew past the bound"
    # No bad request reached a code path that failed: nothing was logged as a crash.
    assert "Traceback" not in server.log(), server.log()[-3000:]
