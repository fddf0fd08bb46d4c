"""close_port: the listener stops taking connections, each accepted connection gets FIN (its
client reads EOF and may still send), and sockets not serving the port are left alone."""

from __future__ import annotations

import socket
import sys

import pytest

from evenflow.server.edge.closing import ClosedPort, close_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="finds its sockets in /proc/self/fd")


def test_listener_shut_connections_half_closed_others_untouched() -> None:
    listener = socket.create_server(("127.0.0.1", 0), reuse_port=True)
    port = listener.getsockname()[1]
    holder = socket.socket()  # bound to the port too, not listening (FrontendPool's holder)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", port))
    other = socket.create_server(("127.0.0.1", 0))  # another port: not touched
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    accepted, _ = listener.accept()
    try:
        assert close_port(port) == ClosedPort(listeners=1, connections=1)
        assert client.recv(1) == b""  # FIN: the client sees the connection end
        client.sendall(b"x")  # only the server's half is closed
        assert accepted.recv(1) == b"x"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with socket.create_connection(other.getsockname(), timeout=5):
            pass  # still listening
        assert holder.getsockname()[1] == port  # still bound, still open
    finally:
        for sock in (client, accepted, listener, holder, other):
            sock.close()


def test_a_port_nothing_serves_closes_nothing() -> None:
    with socket.create_server(("127.0.0.1", 0)) as other:
        port = other.getsockname()[1]
    assert close_port(port) == ClosedPort(0, 0)


def test_a_connection_this_process_made_from_the_same_port_number_is_left_alone() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    elsewhere = socket.create_server(("127.0.0.1", 0))
    outbound = socket.socket()
    outbound.bind(("127.0.0.2", port))  # same number, another address
    outbound.connect(elsewhere.getsockname())
    peer, _ = elsewhere.accept()
    try:
        assert close_port(port) == ClosedPort(listeners=1, connections=0)
        outbound.sendall(b"y")  # its sending half is still open
        assert peer.recv(1) == b"y"
    finally:
        for sock in (outbound, peer, elsewhere, listener):
            sock.close()
