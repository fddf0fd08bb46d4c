"""LoopSocket over a real ZeroMQ PAIR (inproc://): what a peer sends arrives whole and in order,
including what came before the socket was wrapped and what arrives while it sends; a burst does
not hold the event loop; close is final and idempotent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import zmq

from evenflow.server.processes.ipc.loop_socket import LoopSocket

pytestmark = pytest.mark.timeout(20)

_WAIT_S = 5.0  # generous: a message that is coming arrives within microseconds


class Received:
    """What a LoopSocket delivered, with a wait for the n-th message."""

    def __init__(self) -> None:
        self.messages: list[list[bytes]] = []
        self._changed = asyncio.Event()

    def __call__(self, parts: list[bytes]) -> None:
        self.messages.append(parts)
        self._changed.set()

    async def until(self, count: int) -> list[list[bytes]]:
        async def wait() -> None:
            while len(self.messages) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), _WAIT_S)
        return self.messages


@pytest.fixture(autouse=True)
async def no_callback_errors() -> AsyncIterator[None]:
    """A reader callback that raises is only logged by asyncio: fail the test instead."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    yield
    for _ in range(3):
        await asyncio.sleep(0)  # callbacks already scheduled run before the check
    loop.set_exception_handler(previous)
    assert errors == []


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """Two connected PAIR sockets of their own context, closed and terminated afterwards."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ours, peer = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    ours.bind("inproc://loop-socket-test")
    peer.connect("inproc://loop-socket-test")
    try:
        yield ours, peer
    finally:
        for socket in (ours, peer):
            socket.close(linger=0)
        context.term()


def peer_receive(peer: zmq.Socket[bytes]) -> list[bytes]:
    assert peer.poll(int(_WAIT_S * 1000), zmq.POLLIN), "nothing reached the peer"
    return peer.recv_multipart()


async def test_a_peers_messages_arrive_whole_and_in_order(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    ours, peer = pair
    received = Received()
    socket = LoopSocket(ours, asyncio.get_running_loop(), received)
    sent = [[b"call", str(i).encode(), b"x" * i] for i in range(300)]
    for parts in sent:
        peer.send_multipart(parts)
    assert await received.until(len(sent)) == sent
    socket.close()


async def test_messages_sent_before_the_socket_was_wrapped_arrive(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    ours, peer = pair
    peer.send_multipart([b"early", b"1"])
    peer.send_multipart([b"early", b"2"])
    assert ours.poll(int(_WAIT_S * 1000), zmq.POLLIN)  # queued at ours before the wrap
    received = Received()
    socket = LoopSocket(ours, asyncio.get_running_loop(), received)
    assert await received.until(2) == [[b"early", b"1"], [b"early", b"2"]]
    socket.close()


async def test_sends_reach_the_peer_whole(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    ours, peer = pair
    socket = LoopSocket(ours, asyncio.get_running_loop(), Received())
    socket.send([b"reply", b"7", memoryview(b"payload")], by_reference=True)
    socket.send([b"reply", b"8"])
    assert peer_receive(peer) == [b"reply", b"7", b"payload"]
    assert peer_receive(peer) == [b"reply", b"8"]
    socket.close()


async def test_a_message_whose_wake_up_a_send_consumed_is_still_read(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    """ZeroMQ's descriptor is edge-triggered and any operation on the socket, a send included,
    can consume its signal: a message that came in before the send must still reach
    ``on_message`` without a further wake-up."""
    ours, peer = pair
    received = Received()
    socket = LoopSocket(ours, asyncio.get_running_loop(), received)
    for _ in range(3):  # the first check and the reader's wake-up for the connection have run
        await asyncio.sleep(0)
    peer.send_multipart([b"incoming"])
    # What a send does when zmq's command throttle lets it: process the pending commands, which
    # clears the descriptor's signal. Done here by hand so the test does not depend on timing.
    assert int(ours.getsockopt(zmq.EVENTS)) & zmq.POLLIN
    socket.send([b"outgoing"])
    assert await received.until(1) == [[b"incoming"]]
    assert peer_receive(peer) == [b"outgoing"]
    socket.close()


async def test_two_loop_sockets_ping_pong_without_losing_a_wake_up(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    ours, theirs = pair
    loop = asyncio.get_running_loop()
    rounds = 500
    done: asyncio.Future[int] = loop.create_future()
    sockets: list[LoopSocket] = []

    def echo(parts: list[bytes]) -> None:
        sockets[1].send(parts)

    def ping(parts: list[bytes]) -> None:
        count = int(parts[0]) + 1
        if count == rounds:
            done.set_result(count)
        else:
            sockets[0].send([str(count).encode()])

    sockets.extend([LoopSocket(ours, loop, ping), LoopSocket(theirs, loop, echo)])
    sockets[0].send([b"0"])
    assert await asyncio.wait_for(done, _WAIT_S) == rounds
    for socket in sockets:
        socket.close()


async def test_a_burst_gives_the_loop_back_before_it_is_all_read(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    ours, peer = pair
    burst = 1000
    for i in range(burst):
        peer.send_multipart([str(i).encode()])
    assert ours.poll(int(_WAIT_S * 1000), zmq.POLLIN)
    loop = asyncio.get_running_loop()
    received = Received()
    socket = LoopSocket(ours, loop, received)
    read_when_other_ran: list[int] = []
    loop.call_soon(lambda: read_when_other_ran.append(len(received.messages)))
    await received.until(burst)
    assert read_when_other_ran and read_when_other_ran[0] < burst
    socket.close()


async def test_close_is_final_and_idempotent(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    ours, peer = pair
    received = Received()
    socket = LoopSocket(ours, asyncio.get_running_loop(), received)
    peer.send_multipart([b"unread"])
    socket.close()  # before the loop's turn: the pending check must find a closed socket
    socket.close()
    assert ours.closed
    for _ in range(5):
        await asyncio.sleep(0)
    assert received.messages == []


async def test_a_handler_that_raises_is_logged_and_the_messages_behind_it_still_arrive(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
        caplog: pytest.LogCaptureFixture) -> None:
    ours, peer = pair
    received = Received()

    def handler(parts: list[bytes]) -> None:
        if parts == [b"bad"]:
            raise ValueError("a bug in the handler")
        received(parts)

    for parts in ([b"bad"], [b"after", b"1"], [b"after", b"2"]):
        peer.send_multipart(parts)  # queued before the reader: one drain reads them all
    socket = LoopSocket(ours, asyncio.get_running_loop(), handler)
    try:
        assert await received.until(2) == [[b"after", b"1"], [b"after", b"2"]]
        failures = [r for r in caplog.records if r.exc_info is not None]
        assert len(failures) == 1 and "a bug in the handler" in str(failures[0].exc_info)
    finally:
        socket.close()
