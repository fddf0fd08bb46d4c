"""The last step before a draining process hands its gRPC port to ``grpc.aio.Server.stop``:
stop listening on the port and half-close every client connection on it, so that no call
reaches gRPC's server once its shutdown has begun.

Why: from ``grpc_server_shutdown_and_notify`` on, gRPC core ends every call it holds that no
handler has taken yet, and every call that arrives before the client has read the GOAWAY,
with CANCELLED (grpc/grpc#41785, still so in grpcio 1.85). Under load a client always has such a
call in flight, and CANCELLED is what retry policies and load balancers do not retry. Once this
process has sent FIN on a connection, the client fails the calls still open on it with
UNAVAILABLE ("Socket closed") and whatever gRPC later does with them never reaches it; with the
listener closed first, its next calls are refused at connect (UNAVAILABLE too).

Call it only once every admitted call's answer has been sent (``EdgeServicer.answered``): FIN
follows the answers already written, in order, and drops nothing written before it. Linux only
(it finds the sockets in /proc/self/fd); elsewhere it does nothing and says so."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_FD_DIR = "/proc/self/fd"


@dataclass(frozen=True, slots=True)
class ClosedPort:
    listeners: int  # listening sockets shut down
    connections: int  # client connections half-closed (FIN sent)


def close_port(port: int) -> ClosedPort:
    """Shut down this process's listening TCP sockets on ``port``, then send FIN on every
    connection accepted on it. The file descriptors stay open: they are gRPC's to close."""
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        logger.info("no %s: client connections on port %d are left to gRPC", _FD_DIR, port)
        return ClosedPort(0, 0)
    listening: list[socket.socket] = []
    connected: list[socket.socket] = []
    for name in names:
        sock = _tcp_socket_on(int(name), port)
        if sock is None:
            continue
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            listening.append(sock)
        else:
            connected.append(sock)
    # Listeners first: a client whose connection closes reconnects at once, and must be refused.
    listeners = sum(_shutdown(sock, socket.SHUT_RDWR) for sock in listening)
    connections = sum(_shutdown(sock, socket.SHUT_WR) for sock in connected if _has_peer(sock))
    for sock in (*listening, *connected):
        sock.close()  # the duplicate only
    return ClosedPort(listeners, connections)


def _tcp_socket_on(fd: int, port: int) -> socket.socket | None:
    """A duplicate of ``fd`` when it is a TCP socket bound to ``port``, else None."""
    try:
        if not os.readlink(f"{_FD_DIR}/{fd}").startswith("socket:"):
            return None
        sock = socket.socket(fileno=os.dup(fd))  # family and type read from the socket
    except OSError:  # closed meanwhile (listdir's own descriptor among them)
        return None
    try:
        if (sock.family in (socket.AF_INET, socket.AF_INET6)
                and sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == port):
            return sock
    except OSError:
        pass
    sock.close()
    return None


def _has_peer(sock: socket.socket) -> bool:
    """Connected (an accepted connection), not merely bound (like FrontendPool's port holder)."""
    try:
        sock.getpeername()
    except OSError:
        return False
    return True


def _shutdown(sock: socket.socket, how: int) -> bool:
    try:
        sock.shutdown(how)
    except OSError:  # the peer is gone already
        return False
    return True
