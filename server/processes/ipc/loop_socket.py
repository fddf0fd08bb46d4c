"""A ZeroMQ socket driven by the event loop's reader callback, without pyzmq's asyncio futures
(measured: in the engine, the asyncio wrappers' future per send and per receive were ~40 % of
its CPU per request).

ZeroMQ's file descriptor is edge-triggered: it signals that the socket's state *may* have
changed, and any operation on the socket, a send included, can consume that signal. So the
reader re-checks ``EVENTS`` after every send (coalesced into one check per loop turn), and it
drains at most ``YIELD_EVERY`` messages per turn before it gives the loop back, rescheduling
itself if more are waiting. Sends never block: the socket's high-water mark is 0 (unbounded).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from evenflow.server.processes.ipc.arrays import YIELD_EVERY

logger = logging.getLogger(__name__)


class LoopSocket:
    def __init__(self, socket: zmq.Socket[bytes], loop: asyncio.AbstractEventLoop,
                 on_message: Callable[[list[bytes]], None]) -> None:
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        self._socket = socket
        self._loop = loop
        self._on_message = on_message
        self._check_scheduled = False
        self._fd = int(socket.getsockopt(zmq.FD))
        loop.add_reader(self._fd, self._drain)
        self._schedule_check()  # messages may have arrived before the reader was added

    def send(self, parts: Sequence[Any], by_reference: bool = False) -> None:
        self._socket.send_multipart(parts, flags=zmq.NOBLOCK, copy=not by_reference)
        self._schedule_check()

    def _schedule_check(self) -> None:
        if not self._check_scheduled:
            self._check_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._check_scheduled = False
        socket = self._socket
        for _ in range(YIELD_EVERY):
            if socket.closed or not int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return
            parts = socket.recv_multipart(zmq.NOBLOCK)
            try:
                self._on_message(parts)
            except Exception:
                # Raised out of this reader callback, it would end the drain: the messages
                # behind it would wait for a signal the edge-triggered descriptor has spent.
                logger.exception("a message's handler failed; reading on")
        self._schedule_check()  # more may be waiting: after the others' turn

    def close(self, linger_ms: int = 0) -> None:
        """Stop reading and close; ``linger_ms``: how long ZeroMQ may still try to deliver what
        was sent (a process that answers, then exits). Idempotent."""
        if not self._socket.closed:
            self._loop.remove_reader(self._fd)
            self._socket.close(linger=linger_ms)
