"""The HTTP port's own limits over real sockets on localhost: the request-body deadline,
refusals of a pipelined request written after the answer before it, the head deadline that
passes while an answer is being written, and ``close`` cutting a client that does not read.
The deadlines are injected (tenths of a second); the test waits on events the server side
sets, never on a sleep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from evenflow.server.edge.rest import http_port
from evenflow.server.edge.rest.http_port import HttpPort, HttpSettings

pytestmark = pytest.mark.timeout(10)

DEADLINE_S = 0.2
WAIT_S = 3.0  # a generous bound on anything the test waits for
MAX_HEAD_BYTES = 1024
BIG_BYTES = 32 << 20  # more than localhost's socket buffers hold


@dataclass
class App:
    """Reads each request's body, then answers its path (``/slow`` once ``release`` is set,
    ``/big`` with BIG_BYTES); records what arrived and who went away."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    gone: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                return
            if not message.get("more_body", False):
                break
        path = scope["path"]
        self.arrived.put_nowait(path)
        if path == "/slow":
            await self.release.wait()
        body = bytes(BIG_BYTES) if path == "/big" else path.encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


@dataclass
class Port:
    app: App
    port: HttpPort
    number: int
    consumed: list[int]  # bytes the server has read (its data_received calls ended)
    fed: asyncio.Event  # set after each data_received call
    timed_out: asyncio.Event  # set after each deadline that passed

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.number)

    async def read_all(self, total: int) -> None:
        """Wait until the server has read ``total`` bytes on its connections."""
        while sum(self.consumed) < total:
            self.fed.clear()
            await asyncio.wait_for(self.fed.wait(), WAIT_S)


def _after(method: Callable[..., Any], event: asyncio.Event,
           record: Callable[..., None] = lambda *_: None) -> Callable[..., Any]:
    def wrapped(self: Any, *args: Any) -> Any:
        try:
            return method(self, *args)
        finally:
            record(*args)
            event.set()
    return wrapped


@pytest.fixture
async def port(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Port]:
    consumed: list[int] = []
    fed, timed_out = asyncio.Event(), asyncio.Event()
    protocol = http_port._Protocol
    monkeypatch.setattr(protocol, "data_received", _after(
        protocol.data_received, fed, lambda data: consumed.append(len(data))))
    monkeypatch.setattr(protocol, "_input_timed_out", _after(protocol._input_timed_out, timed_out))
    app = App()
    server = HttpPort(app, name="test")
    number = await server.start(HttpSettings(
        "127.0.0.1", 0, head_timeout_s=DEADLINE_S, body_timeout_s=DEADLINE_S,
        max_head_bytes=MAX_HEAD_BYTES))
    try:
        yield Port(app, server, number, consumed, fed, timed_out)
    finally:
        app.release.set()
        await server.close(0.5)


@dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    status_line, *lines = head[:-4].split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines)
    body = await asyncio.wait_for(reader.readexactly(int(headers[b"content-length"])), WAIT_S)
    return Response(int(status_line.split()[1]), headers, body)


async def assert_refused(reader: asyncio.StreamReader, status: int, words: str) -> None:
    response = await read_response(reader)
    assert response.status == status, response
    assert response.headers[b"connection"] == b"close"
    assert words in msgspec.json.decode(response.body)["error"]
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""  # and closed


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n".encode()


async def test_a_body_that_stops_coming_gets_408_at_its_deadline(port: Port) -> None:
    reader, writer = await port.connect()
    started_s = asyncio.get_running_loop().time()
    writer.write(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n" + b"{")
    await assert_refused(reader, 408, "body")
    assert asyncio.get_running_loop().time() - started_s < DEADLINE_S + 2.0
    await asyncio.wait_for(port.app.gone.wait(), WAIT_S)  # its application heard it
    writer.close()


async def test_a_body_that_comes_in_time_is_answered(port: Port) -> None:
    reader, writer = await port.connect()
    writer.write(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}" + get("/y"))
    assert [(await read_response(reader)).body for _ in range(2)] == [b"/x", b"/y"]
    writer.close()


@pytest.mark.parametrize(("bad", "status", "words"), [
    (b"GET /b HTTP/1.1\r\nX: " + b"a" * 2 * MAX_HEAD_BYTES, 431, "head"),  # never ended
    (b"GET /b HTTP/1.1\r\nX: " + b"a" * 2 * MAX_HEAD_BYTES + b"\r\n\r\n", 431, "head"),
    (b"\x00\x01 not http\r\n\r\n", 400, "Invalid"),
])
async def test_a_pipelined_refusal_waits_for_the_answer_being_written(
        port: Port, bad: bytes, status: int, words: str) -> None:
    reader, writer = await port.connect()
    slow = get("/slow")
    writer.write(slow)
    assert await asyncio.wait_for(port.app.arrived.get(), WAIT_S) == "/slow"
    writer.write(bad)
    await port.read_all(len(slow) + len(bad))  # refused (or not) by now
    port.app.release.set()
    answer = await read_response(reader)
    assert (answer.status, answer.body) == (200, b"/slow")
    await assert_refused(reader, status, words)
    writer.close()


async def test_a_head_deadline_passing_during_an_answer_starts_again_after_it(
        port: Port) -> None:
    reader, writer = await port.connect()
    writer.write(get("/slow") + b"GET /b HT")  # the second head never ends
    assert await asyncio.wait_for(port.app.arrived.get(), WAIT_S) == "/slow"
    await asyncio.wait_for(port.timed_out.wait(), WAIT_S)  # passed while /slow is answered
    port.app.release.set()
    assert (await read_response(reader)).body == b"/slow"
    await assert_refused(reader, 408, "head")  # the new deadline, after the answer
    writer.close()


async def test_a_pipelined_body_deadline_is_refused_after_the_answer_before_it(
        port: Port) -> None:
    reader, writer = await port.connect()
    writer.write(get("/slow") + b"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\n{")
    assert await asyncio.wait_for(port.app.arrived.get(), WAIT_S) == "/slow"
    await asyncio.wait_for(port.timed_out.wait(), WAIT_S)
    port.app.release.set()
    assert (await read_response(reader)).body == b"/slow"
    await assert_refused(reader, 408, "body")
    writer.close()


async def test_close_cuts_a_client_that_does_not_read_its_answer() -> None:
    app = App()
    server = HttpPort(app, name="test")
    number = await server.start(HttpSettings("127.0.0.1", 0))
    reader, writer = await asyncio.open_connection("127.0.0.1", number)
    try:
        writer.write(get("/big"))
        assert (await asyncio.wait_for(reader.readline(), WAIT_S)).startswith(b"HTTP/1.1 200")
        # Nothing more is read: most of the 32 MiB stays in the server's buffer.
        await asyncio.wait_for(server.close(0.1), WAIT_S)
        assert server.connections == 0
    finally:
        await server.close()
        writer.close()
