"""The engine's side of ``--frontends N``: it starts N front-end processes that share the gRPC
port (SO_REUSEPORT, a listening socket each), answers their inference requests from the
balancers, runs every other call they forward, tells them the models and the health, restarts
one that dies, and drains and stops them on shutdown.

One ZeroMQ ROUTER socket serves all front-ends; each front-end's DEALER names itself
``fe<index>-<pid>``, so answers for a dead front-end's requests go nowhere (and its queued
requests are cancelled), never to its replacement.

The engine trusts what a front-end validated: an ``Infer`` carries the spec version it was
validated against and its shape key, and the engine checks only that the model's specs have not
changed since (a reload) before it hands the arrays to the balancer."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import msgspec
import zmq

from evenflow.balancer import EvenflowError, InvalidRequest, ModelNotFound, ShuttingDown
from evenflow.balancer.backoff import Backoff
from evenflow.server.edge.port_errors import PortUnavailable
from evenflow.server.edge.status import internal_error
from evenflow.server.engine.proxied_calls import ProxiedCalls
from evenflow.server.engine.served import ModelTable, ServedModel
from evenflow.server.observability.metrics import FrontendState
from evenflow.server.processes.ipc import arrays
from evenflow.server.processes.ipc import frontend_messages as msg
from evenflow.server.processes.ipc.errors import to_wire
from evenflow.server.processes.ipc.frontend_messages import FrontendSettings
from evenflow.server.processes.ipc.loop_socket import LoopSocket
from evenflow.server.processes.supervisor import Child, ChildNotReady

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0
# The first and the largest delay between restarts of a front-end that keeps dying.
_FIRST_RESTART_DELAY_S = 0.1
_MAX_RESTART_DELAY_S = 5.0


@dataclass(slots=True)
class _Frontend:
    index: int
    child: Child | None = None
    identity: bytes = b""
    hello: asyncio.Future[None] | None = None
    restarts: int = 0
    backoff: Backoff = field(
        default_factory=lambda: Backoff(_FIRST_RESTART_DELAY_S, _MAX_RESTART_DELAY_S))
    in_flight: dict[int, asyncio.Future[Any]] = field(default_factory=dict)


def reserve_port(host: str, port: int, what: str = "gRPC",
                 flag: str = "--port") -> socket.socket:
    """A socket bound to (host, port) with SO_REUSEPORT and not listening: it holds the port
    (the one chosen, when ``port`` is 0) for the front-ends, which bind it too, and takes no
    connections itself. PortUnavailable when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    holder = socket.socket(family, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        holder.bind((host, port))
    except OSError as exc:
        holder.close()
        raise PortUnavailable(what, f"{host}:{port}", flag, exc.strerror or str(exc)) from exc
    return holder


class FrontendPool:
    """``on_failure`` hears each request a front-end failed, as (model, status name)."""

    def __init__(self, *, count: int,
                 settings: Callable[[int, str, int, int | None], FrontendSettings],
                 models: ModelTable, calls: ProxiedCalls, host: str, port: int,
                 http_port: int | None = None,
                 on_failure: Callable[[str, str], None] | None = None) -> None:
        self._count = count
        self._settings = settings
        self._models = models
        self._calls = calls
        self._host, self._requested_port = host, port
        self._requested_http_port = http_port  # None: the front-ends serve no HTTP
        self._frontends = [_Frontend(i) for i in range(count)]
        self._by_identity: dict[bytes, _Frontend] = {}
        self._socket: LoopSocket | None = None
        self._address = f"ipc://@evenflow-engine-{os.getpid()}-{uuid.uuid4().hex}"
        self._port_holder: socket.socket | None = None
        self._http_port_holder: socket.socket | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watches: set[asyncio.Task[Any]] = set()  # each running front-end's, and restarts
        self._stopping = False
        self._serving = True
        self._outbox: dict[bytes, list[list[object]]] = {}  # sent once per loop turn
        self._flush_scheduled = False
        self._on_failure = on_failure
        self._announced: dict[str, msg.EdgeModel] = {}  # by name, kept after an unload
        self.port = 0
        self.http_port: int | None = None

    async def start(self) -> int:
        """Hold the ports (gRPC, and HTTP where asked for), open the engine's socket, start
        every front-end; returns the gRPC port."""
        self._port_holder = reserve_port(self._host, self._requested_port)
        self.port = self._port_holder.getsockname()[1]
        if self._requested_http_port is not None:
            self._http_port_holder = reserve_port(self._host, self._requested_http_port,
                                                  "HTTP", "--http-port")
            self.http_port = self._http_port_holder.getsockname()[1]
        self.bind()
        launches = [asyncio.create_task(self._launch(fe), name=f"frontend:{fe.index}:start")
                    for fe in self._frontends]
        try:
            await asyncio.gather(*launches)
        except BaseException:
            # One failed (or this start was cancelled): the others' processes would otherwise
            # start with no one to wait for them. A cancelled launch kills its process; those
            # that started are the caller's ``stop``'s, as after any start.
            for launch in launches:
                launch.cancel()
            await asyncio.gather(*launches, return_exceptions=True)
            raise
        return self.port

    def bind(self, address: str | None = None) -> str:
        """Open the engine's socket (at ``address``, else a private one) and serve it; returns
        the address. ``start`` calls it; a benchmark's stub front-ends connect to it alone."""
        self._address = address or self._address
        router: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self._address)
        self._socket = LoopSocket(router, asyncio.get_running_loop(), self._receive)
        return self._address

    def _spawn_task(self, coroutine: Any, name: str,
                    tasks: set[asyncio.Task[Any]] | None = None) -> asyncio.Task[Any]:
        owner = self._tasks if tasks is None else tasks
        task = asyncio.create_task(coroutine, name=name)
        owner.add(task)
        task.add_done_callback(owner.discard)
        return task

    async def _launch(self, frontend: _Frontend) -> bool:
        """Start the front-end's process and wait for its hello (it then serves the port);
        False, with no process left, when the pool began stopping meanwhile; OSError, with its
        exit code and the end of its stderr, when it does not start. Cancelled, it kills the
        process it started."""
        frontend.hello = asyncio.get_running_loop().create_future()
        started = await Child.start(
            f"front-end {frontend.index}", ["-m", "evenflow.server.processes.frontend_process"],
            settings=self._settings(frontend.index, self._address, self.port, self.http_port))
        if self._stopping:  # ``stop`` may have read the children already: it would not stop it
            await started.kill()
            return False
        frontend.child = started
        try:
            await started.until_ready(frontend.hello, _START_TIMEOUT_S)
        except ChildNotReady as exc:
            await started.kill()
            raise OSError(str(exc)) from exc
        except BaseException:
            await started.kill()
            raise
        self._spawn_task(self._watch(frontend, started), f"frontend:{frontend.index}",
                         self._watches)
        return True

    async def _watch(self, frontend: _Frontend, started: Child) -> None:
        """Restart the front-end when its process ends, unless the server is stopping."""
        code = await started.wait()
        self._forget(frontend)
        if self._stopping:
            return
        delay_s = frontend.backoff.next_s()
        logger.error("front-end %d (process %d) exited with code %s; restarting it in "
                     "%.1f s", frontend.index, started.pid, code, delay_s)
        frontend.restarts += 1
        while True:
            await asyncio.sleep(delay_s)
            if self._stopping:  # a restart now would miss the drain, and outlive ``stop``
                return
            try:
                if not await self._launch(frontend):
                    return
                logger.info("front-end %d restarted (process %d)", frontend.index,
                            frontend.child.pid if frontend.child else -1)
                return
            except OSError as exc:
                logger.error("%s; retrying", exc)
                delay_s = frontend.backoff.next_s()

    def _forget(self, frontend: _Frontend) -> None:
        """Its clients are gone with it: drop its requests that have not run."""
        self._by_identity.pop(frontend.identity, None)
        for future in frontend.in_flight.values():
            future.cancel()
        frontend.in_flight.clear()

    @property
    def pids(self) -> list[int]:
        return [fe.child.pid for fe in self._frontends if fe.child is not None]

    def states(self) -> list[FrontendState]:
        """Each front-end: serving the port (said hello, not gone since), and its restarts."""
        serving = list(self._by_identity.values())
        return [FrontendState(fe.index, any(fe is s for s in serving), fe.restarts)
                for fe in self._frontends]

    # --- messages from the front-ends ---

    def _receive(self, parts: list[bytes]) -> None:
        identity, header, *frames = parts
        try:
            message = msg.to_engine.decode(header)
        except msgspec.DecodeError:
            logger.exception("undecodable message from front-end %r", identity)
            return
        if isinstance(message, msg.Infer):
            self._infer(identity, message, frames)
        elif isinstance(message, msg.Cancel):
            frontend = self._by_identity.get(identity)
            future = frontend.in_flight.pop(message.id, None) if frontend else None
            if future is not None:
                future.cancel()
        elif isinstance(message, msg.Call):
            self._spawn_task(self._call(identity, message, frames[0] if frames else b""),
                             "frontends:call")
        elif isinstance(message, msg.Failed):
            if self._on_failure is not None:
                self._on_failure(message.model, message.code)
        elif isinstance(message, msg.Sync):
            self._send(identity, self._models_message(message.id))
        elif isinstance(message, msg.Hello):
            self._hello(identity, message)

    def _hello(self, identity: bytes, hello: msg.Hello) -> None:
        frontend = self._frontends[hello.index]
        frontend.identity = identity
        self._by_identity[identity] = frontend
        if not hello.listening:
            self._send(identity, self._models_message())
            if self._stopping:  # a restart the drain came before: it must not take calls
                self._send(identity, msg.Drain())
        elif frontend.hello is not None and not frontend.hello.done():
            frontend.hello.set_result(None)

    def _infer(self, identity: bytes, request: msg.Infer, frames: list[bytes]) -> None:
        frontend = self._by_identity.get(identity)
        if frontend is None:
            return  # a front-end that is gone
        try:
            model = self._models.get(request.model, request.version)
            announced = self._announced.get(model.name)
            if announced is None or announced.spec_version != request.spec_version:
                raise InvalidRequest(f"model {model.name!r} was reloaded with other tensor "
                                     "specs while the request was on its way; send it again")
            future = model.submit(arrays.unpack(request.arrays, frames), request.num_samples,
                                  request.deadline_s, request.priority, request.shape_key)
        except ModelNotFound as exc:
            # Sent before the front-end heard the drain, it arrives after the models closed.
            error = ShuttingDown("the server is shutting down; send to another replica",
                                 not_run=True) if self._stopping else exc
            self._send(identity, msg.Refused(request.id, to_wire(error)))
            return
        except EvenflowError as exc:
            self._send(identity, msg.Refused(request.id, to_wire(exc)))
            return
        except Exception as exc:  # a bug: the front-end's caller hears INTERNAL, never nothing
            bug = internal_error(exc, f"request {request.id} from {identity!r}")
            self._send(identity, msg.Refused(request.id, to_wire(bug)))
            return
        frontend.in_flight[request.id] = future
        future.add_done_callback(partial(self._answer, identity, frontend, request.id))

    def _answer(self, identity: bytes, frontend: _Frontend, request_id: int,
                future: asyncio.Future[Any]) -> None:
        frontend.in_flight.pop(request_id, None)
        if future.cancelled() or frontend.identity != identity:
            return
        error = future.exception()
        if error is not None:
            if isinstance(error, Exception) and not isinstance(error, EvenflowError):
                error = internal_error(error, f"request {request_id} from {identity!r}")
            self._send(identity, msg.Refused(request_id, to_wire(error)))
            return
        metas: list[arrays.ArrayMeta] = []
        frames: list[object] = []
        try:
            arrays.pack(future.result(), metas, frames)
        except Exception as exc:  # an answer that is not arrays: a bug, but still an answer
            error = internal_error(exc, f"request {request_id} from {identity!r}")
            self._send(identity, msg.Refused(request_id, to_wire(error)))
            return
        self._send(identity, msg.Answer(request_id, metas), frames)

    async def _call(self, identity: bytes, call: msg.Call, request: bytes) -> None:
        code, details, response = await self._calls.call(call.method, request, call.deadline_s)
        self._send(identity, msg.Reply(call.id, code, details), [response])

    def _send(self, identity: bytes, message: msgspec.Struct,
              frames: list[object] | None = None) -> None:
        """Queue ``message`` for the front-end; what is queued goes at the end of this loop
        turn, in one ZeroMQ message (a Bundle when there are several: a batch's answers cost
        one send, measured as the engine's largest cost per request)."""
        outbox = self._outbox.get(identity)
        if outbox is None:
            outbox = self._outbox[identity] = []
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
        outbox.append([msg.encoder.encode(message), *(frames or ())])

    def _flush(self) -> None:
        self._flush_scheduled = False
        outboxes, self._outbox = self._outbox, {}
        if self._socket is None:
            return
        for identity, messages in outboxes.items():
            if len(messages) == 1:
                parts = messages[0]
            else:
                parts = [msg.encoder.encode(msg.Bundle([len(m) for m in messages]))]
                for message in messages:
                    parts.extend(message)
            # By reference only when some message carries array frames (beyond its header).
            frames = [frame for message in messages for frame in message[1:]]
            self._socket.send([identity, *parts], arrays.by_reference(frames))

    # --- what the engine tells them ---

    def _models_message(self, sync_id: int = -1) -> msg.Models:
        return msg.Models([self._announce(m) for m in self._models], self._serving, sync_id)

    def _announce(self, model: ServedModel) -> msg.EdgeModel:
        """The model as front-ends are told it: its specs at the version they were first
        served with under this name, or the next version when they changed (a reload that
        keeps them keeps the version, so requests validated before it still run)."""
        definition = model.definition
        inputs, outputs = list(definition.inputs), list(definition.outputs)
        last = self._announced.get(model.name)
        if last is not None and (last.inputs, last.outputs, last.padding) == \
                (inputs, outputs, definition.padding):
            return last
        edge = msg.EdgeModel(model.name, 0 if last is None else last.spec_version + 1, inputs,
                             outputs, definition.padding)
        self._announced[model.name] = edge
        return edge

    def models_changed(self) -> None:
        message = self._models_message()
        for identity in list(self._by_identity):
            self._send(identity, message)

    def set_serving(self, serving: bool) -> None:
        self._serving = serving
        for identity in list(self._by_identity):
            self._send(identity, msg.Health(serving))

    async def drain(self) -> None:
        """New inference calls are refused (UNAVAILABLE) and health is NOT_SERVING on every
        front-end; what is in flight is still answered."""
        self._stopping = True
        for identity in list(self._by_identity):
            self._send(identity, msg.Drain())

    async def stop(self) -> None:
        """Every admitted request has its answer: front-ends close the port and exit (killed
        after a bound); then the engine's socket closes. Idempotent."""
        self._stopping = True
        # A restart under way would add a process after the children below were read: end the
        # watches first (a cancelled launch kills its process), then read the children.
        while self._watches:
            for task in list(self._watches):
                task.cancel()
            await asyncio.gather(*self._watches, return_exceptions=True)
        for identity in list(self._by_identity):
            self._send(identity, msg.Stop())
        children = [fe.child for fe in self._frontends if fe.child is not None]
        # At once: each may take the whole bound.
        stopped = await asyncio.gather(*(c.stop(_STOP_TIMEOUT_S) for c in children))
        for started, exited in zip(children, stopped, strict=True):
            if not exited:
                logger.warning("front-end process %d did not stop; killed it", started.pid)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for fe in self._frontends:
            self._forget(fe)  # their watches, which would have, were cancelled
            fe.child = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        for holder in (self._port_holder, self._http_port_holder):
            if holder is not None:
                holder.close()
        self._port_holder = self._http_port_holder = None

