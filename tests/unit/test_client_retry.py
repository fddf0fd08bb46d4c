"""Retries and deadlines of ``Client`` and ``AsyncClient``: one deadline per call, each attempt
gets the time left (the HTTP body's server ``timeout`` too), an infer the server may have
received is not sent again while a connection never made is, and a call waiting for a pooled
HTTP connection fails at its own deadline. The servers are raw sockets on 127.0.0.1, to fail
exactly where a test needs them to."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from evenflow.client import (
    AsyncClient,
    ChannelOptions,
    Client,
    DeadlineExceededError,
    InferenceServerError,
    ServerUnavailableError,
)
from evenflow.client._retry import Retries, marked_not_run, not_run
from evenflow.client.errors import error_for

X = np.arange(4, dtype=np.float32)
ANSWER = json.dumps({"outputs": [{"name": "y", "datatype": "INT32", "shape": [1],
                                  "data": [7]}]}).encode()
OK = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
      % len(ANSWER)) + ANSWER


def read_request(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """One HTTP request's head and body, or None when the client closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head, body


class RawServer:
    """Reads each request, counts it, then: ``"close"``, closes the connection without an
    answer (a request delivered, then the connection lost); ``"hold"``, holds it unanswered
    until ``release``; ``"answer"``, answers ``OK``. ``sock``: bound, and listening once
    ``listen`` is called (before that a connection is refused)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.bodies: list[bytes] = []
        self.received = threading.Event()  # a request arrived
        self.release = threading.Event()  # held connections may close
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def listen(self) -> None:
        self.sock.listen(16)
        self._spawn(self._accept)

    def _spawn(self, target: Callable[..., object], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # the listening socket was closed: the test is over
                return
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while (request := read_request(conn)) is not None:
                with self._lock:
                    self.bodies.append(request[1])
                self.received.set()
                if self.mode == "close":
                    return
                if self.mode == "hold":
                    self.release.wait()
                    return
                conn.sendall(OK)

    @property
    def deliveries(self) -> int:
        with self._lock:
            return len(self.bodies)

    def close(self) -> None:
        self.release.set()
        # shutdown, not only close: it wakes the thread blocked in accept(). It fails on a
        # socket that never listened: there is nothing to wake then.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for thread in self._threads:
            thread.join(timeout=5)


@pytest.fixture
def closing() -> Iterator[RawServer]:
    server = RawServer("close")
    server.listen()
    yield server
    server.close()


def timeout_parameter(body: bytes) -> int:
    """The server ``timeout`` (microseconds) a request carries: its JSON header comes first,
    the binary tensors after it."""
    header, _ = json.JSONDecoder().raw_decode(body.decode("latin-1"))
    return int(header["parameters"]["timeout"])


# --- the HTTP pool -------------------------------------------------------------------------


def test_a_call_waiting_for_a_pooled_connection_fails_at_its_own_deadline() -> None:
    server = RawServer("hold")
    server.listen()
    first_failed: list[BaseException] = []

    with Client(server.url, options=ChannelOptions(max_connections=1)) as client:

        def first() -> None:  # no deadline: holds the only connection until the server lets go
            try:
                client.infer("m", {"x": X})
            except InferenceServerError as exc:
                first_failed.append(exc)

        holder = threading.Thread(target=first, daemon=True)
        holder.start()
        pool = ThreadPoolExecutor(1)
        try:
            assert server.received.wait(timeout=5)
            started = time.monotonic()
            second = pool.submit(client.infer, "m", {"x": X}, timeout_s=0.3)
            # Without a bound on the pool wait this waits for the first call: forever.
            error = second.exception(timeout=5)
            elapsed_s = time.monotonic() - started
            assert isinstance(error, DeadlineExceededError), error
            assert "no free connection" in str(error)
            # Its own 0.3 s, not the first call's (held until the server closes): generous.
            assert elapsed_s < 3.0
            assert holder.is_alive() and server.deliveries == 1
        finally:
            server.close()  # ends the first call, and with it any second one still waiting
            holder.join(timeout=5)
            pool.shutdown(wait=True)
    # The held request was delivered, then its connection closed: raised, not sent again.
    assert [type(e) for e in first_failed] == [ServerUnavailableError]
    assert server.deliveries == 1


async def test_an_async_call_waiting_for_a_pooled_connection_fails_at_its_deadline() -> None:
    server = RawServer("hold")
    server.listen()
    try:
        async with AsyncClient(server.url,
                               options=ChannelOptions(max_connections=1)) as client:
            holder = asyncio.create_task(client.infer("m", {"x": X}))
            assert await asyncio.to_thread(server.received.wait, 5)
            with pytest.raises(DeadlineExceededError):
                await client.infer("m", {"x": X}, timeout_s=0.3)
            assert not holder.done()
            server.release.set()
            with pytest.raises(ServerUnavailableError):
                await holder
    finally:
        await asyncio.to_thread(server.close)
    assert server.deliveries == 1


# --- what is sent again --------------------------------------------------------------------


def test_an_infer_the_server_received_is_not_sent_again(closing: RawServer) -> None:
    # Raised at the lost connection, not by waiting out the 1 s deadline.
    with Client(closing.url, retry_backoff_s=0.0) as client, \
            pytest.raises(ServerUnavailableError):
        client.infer("m", {"x": X}, timeout_s=1.0)
    assert closing.deliveries == 1


async def test_an_async_infer_the_server_received_is_not_sent_again(closing: RawServer) -> None:
    async with AsyncClient(closing.url, retry_backoff_s=0.0) as client:
        with pytest.raises(ServerUnavailableError):  # not waiting out the 1 s deadline
            await client.infer("m", {"x": X}, timeout_s=1.0)
    assert closing.deliveries == 1


def test_reads_are_retried_after_a_lost_connection(closing: RawServer) -> None:
    # A health check runs nothing: sending it again is safe.
    with Client(closing.url, retry_backoff_s=0.0) as client, \
            pytest.raises(ServerUnavailableError):
        client.server_live(timeout_s=1.0)
    assert closing.deliveries == 3


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_refused_connection_is_retried_with_the_time_left() -> None:
    server = RawServer("answer")  # bound, not listening: the first connection is refused
    clock = FakeClock()
    backoffs: list[float] = []

    def backoff(delay_s: float) -> None:  # the server comes up while the client backs off
        backoffs.append(delay_s)
        clock.now_s += 0.5
        server.listen()

    try:
        with Client(server.url) as client:
            client._retries = dataclasses.replace(client._retries, clock=clock, sleep=backoff)
            got = client.infer("m", {"x": X}, timeout_s=2.0)
    finally:
        server.close()
    assert got["y"].tolist() == [7]
    assert backoffs == [0.05] and server.deliveries == 1
    # The retry told the server its deadline: what was left of the call's 2 s.
    assert timeout_parameter(server.bodies[0]) == 1_500_000


async def test_an_async_refused_connection_is_retried_with_the_time_left() -> None:
    server = RawServer("answer")
    clock = FakeClock()
    backoffs: list[float] = []

    async def backoff(delay_s: float) -> None:
        backoffs.append(delay_s)
        clock.now_s += 0.5
        server.listen()

    try:
        async with AsyncClient(server.url) as client:
            client._retries = dataclasses.replace(client._retries, clock=clock, asleep=backoff)
            got = await client.infer("m", {"x": X}, timeout_s=2.0)
    finally:
        await asyncio.to_thread(server.close)
    assert got["y"].tolist() == [7]
    assert backoffs == [0.05] and server.deliveries == 1
    assert timeout_parameter(server.bodies[0]) == 1_500_000


# --- Retries itself, on a fake clock -------------------------------------------------------


def unavailable(http_status: int | None = None) -> ServerUnavailableError:
    error = error_for(grpc.StatusCode.UNAVAILABLE, "down", http_status)
    assert isinstance(error, ServerUnavailableError)
    return error


def test_every_attempt_gets_the_time_left_and_none_starts_past_the_deadline() -> None:
    clock = FakeClock()
    given: list[float | None] = []

    def sleep(delay_s: float) -> None:
        clock.now_s += delay_s

    def attempt(left_s: float | None) -> int:
        given.append(left_s)
        clock.now_s += 0.4  # each attempt takes 0.4 s to fail
        raise not_run(unavailable())

    retries = Retries(retries=5, backoff_s=0.05, clock=clock, sleep=sleep)
    with pytest.raises(ServerUnavailableError):
        retries.call(attempt, 1.0, marked_not_run)
    # 1.0; then 1.0 - 0.4 - 0.05; then 0.55 - 0.4 - 0.1. The next backoff (0.2) ends past it.
    assert given == pytest.approx([1.0, 0.55, 0.05])


async def test_async_attempts_get_the_time_left() -> None:
    clock = FakeClock()
    given: list[float | None] = []

    async def asleep(delay_s: float) -> None:
        clock.now_s += delay_s

    async def attempt(left_s: float | None) -> int:
        given.append(left_s)
        clock.now_s += 0.4
        raise not_run(unavailable(503))  # the server said it ran nothing

    retries = Retries(retries=5, backoff_s=0.05, clock=clock, asleep=asleep)
    with pytest.raises(ServerUnavailableError):
        await retries.acall(attempt, 1.0, marked_not_run)
    assert given == pytest.approx([1.0, 0.55, 0.05])


def test_what_an_infer_may_send_again() -> None:
    assert marked_not_run(not_run(unavailable()))  # no connection was made
    assert not marked_not_run(unavailable(503))  # a 503 that does not say it ran nothing
    assert not marked_not_run(unavailable())  # lost after sending: it may have run

    calls: list[float | None] = []

    def lost(left_s: float | None) -> int:
        calls.append(left_s)
        raise unavailable()

    with pytest.raises(ServerUnavailableError):
        Retries(retries=2, backoff_s=0.0).call(lost, None, marked_not_run)
    assert calls == [None]
    with pytest.raises(ServerUnavailableError):
        Retries(retries=2, backoff_s=0.0).call(lost, None)  # a read: any UNAVAILABLE
    assert len(calls) == 4
