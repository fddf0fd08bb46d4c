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
    """Shut down this process's listening TCP sockets on ``port`` (gRPC's descriptors parked
    on a socket no client reaches), then send FIN on every connection accepted on it. The file
    descriptors stay open: they are gRPC's to close."""
    if not os.path.isdir(_FD_DIR):
        logger.info("no %s: client connections on port %d are left to gRPC", _FD_DIR, port)
        return ClosedPort(0, 0)
    # Listeners first, then a fresh look for connections: one accepted meanwhile is found too,
    # and a client whose connection closes, reconnecting at once, is refused.
    addresses: set[str] = set()
    listeners = 0
    for fd, sock in _sockets_on(port):
        with sock:  # the duplicate only
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                addresses.add(sock.getsockname()[0])
                _park(fd)
                listeners += _shutdown(sock, socket.SHUT_RDWR)
    connections = 0
    for _, sock in _sockets_on(port):
        with sock:
            if (_accepted_by(sock, addresses) and _has_peer(sock)
                    and _shutdown(sock, socket.SHUT_WR)):
                connections += 1
    return ClosedPort(listeners, connections)


def _sockets_on(port: int) -> list[tuple[int, socket.socket]]:
    """Each descriptor of this process on a TCP socket bound to ``port``, with a duplicate."""
    found = ((int(name), _tcp_socket_on(int(name), port)) for name in os.listdir(_FD_DIR))
    return [(fd, sock) for fd, sock in found if sock is not None]


def _park(fd: int) -> None:
    """Point gRPC's listening descriptor at a listening socket no client can reach (a Unix
    socket in the abstract namespace), before the TCP listener is shut down: gRPC's accept
    then finds nothing to accept (EAGAIN, and it waits) instead of failing with EINVAL, which
    it logs as an error ("Closing acceptor. Failed accept4") on every shutdown."""
    parked = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with parked:
        parked.bind(f"\0evenflow-closed-{os.getpid()}-{fd}-{id(parked)}")
        parked.listen(1)
        parked.setblocking(False)  # as gRPC's own listener was
        os.dup2(parked.fileno(), fd, inheritable=False)


def _accepted_by(sock: socket.socket, listener_addresses: set[str]) -> bool:
    """On an address a listener had (a wildcard one takes every address), not a connection
    this process made from the same port number elsewhere. Where no listener is left, every
    connection on the port is the server's."""
    if not listener_addresses or listener_addresses & {"0.0.0.0", "::"}:
        return True
    return str(sock.getsockname()[0]) in listener_addresses


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
