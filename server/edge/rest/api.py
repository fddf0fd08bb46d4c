"""The KServe v2 / Open Inference Protocol REST API, with Triton's additions, as a raw ASGI
application (no framework: one dispatch on the path, then the handler).

Inference is decoded, validated and handed to the model here, on the same edge
(``EdgeServicer``: model lookup, drain, failure accounting) and with the same checks and
wording as the gRPC path. Every other call (model metadata, configuration, statistics, model
control, evenflow's statistics) is run as the gRPC method it mirrors through ``ControlCalls``:
in the single process the servicers' own code, in a front-end process the call forwarded to
the engine. So both protocols give the same answers and errors, and a front-end imports nothing
of the engine."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
import msgspec
from google.protobuf.message import Message

from evenflow.balancer import EvenflowError, InvalidRequest
from evenflow.proto import evenflow_pb2
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.server.edge import shapes
from evenflow.server.edge.model_names import MODEL_VERSION
from evenflow.server.edge.rest import compression, tensors
from evenflow.server.edge.rest.proto_json import to_json
from evenflow.server.edge.rest.replies import (
    EMPTY,
    JSON,
    MAY_RESEND_HEADER,
    ASGIMessage,
    HttpError,
    Receive,
    Reply,
    Send,
    error_reply,
    json_reply,
    send_reply,
    status_header,
)
from evenflow.server.edge.rest.statuses import http_status, http_status_of
from evenflow.server.edge.security import group_of, token_matches
from evenflow.server.edge.servicer import EdgeServicer, InferTarget, submit_arrays
from evenflow.server.edge.status import (
    internal_error,
    may_resend,
    status_from_value,
    status_of,
)
from evenflow.server.observability import cpu_accounting

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
T = TypeVar("T")

_KSERVE = "/inference.GRPCInferenceService/"
_STATS = "/evenflow.v1.EvenflowStats/GetStats"
_OK = grpc.StatusCode.OK.value[0]
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class ControlCalls(Protocol):
    """Runs a gRPC method on serialized bytes: (status code value, details, response bytes)."""

    async def call(self, path: str, request: bytes, deadline_s: float, /
                   ) -> tuple[int, str, bytes]: ...


class _Disconnected(Exception):
    """The client went away before its request body arrived."""


@dataclass(frozen=True, slots=True)
class Route:
    """What a path asks for: ``kind`` (see ``RestApi._dispatch``), its model and version."""

    kind: str
    model: str = ""
    version: str = ""


_MODEL_ROUTES = {"": ("GET", "metadata"), "ready": ("GET", "ready"),
                 "config": ("GET", "config"), "stats": ("GET", "stats"),
                 "infer": ("POST", "infer")}
_FIXED_ROUTES = {
    "/v2": ("GET", "server"),
    "/v2/health/live": ("GET", "live"),
    "/v2/health/ready": ("GET", "server_ready"),
    "/v2/models/stats": ("GET", "stats"),
    "/v2/repository/index": ("POST", "index"),
    "/evenflow/v1/stats": ("GET", "evenflow_stats"),
    "/": ("GET", "page"),
    "/evenflow/devices": ("GET", "page"),
}
# Each route's gRPC method: its bearer-token group is the gRPC method's (``group_of``).
_METHOD_OF = {
    "server": _KSERVE + "ServerMetadata", "metadata": _KSERVE + "ModelMetadata",
    "ready": _KSERVE + "ModelReady", "config": _KSERVE + "ModelConfig",
    "stats": _KSERVE + "ModelStatistics", "infer": _KSERVE + "ModelInfer",
    "index": _KSERVE + "RepositoryIndex", "load": _KSERVE + "RepositoryModelLoad",
    "unload": _KSERVE + "RepositoryModelUnload", "evenflow_stats": _STATS,
}
_OPEN = frozenset({"live", "server_ready", "page"})  # health and the page need no token


def route_of(method: str, path: str) -> Route:
    """The route of ``method path``; HttpError 404 (unknown path) or 405 (wrong method)."""
    fixed = _FIXED_ROUTES.get(path.rstrip("/") or "/")
    if fixed is not None:
        return _checked(method, *fixed, Route(fixed[1]))
    parts = path.strip("/").split("/")
    if len(parts) >= 3 and parts[:2] == ["v2", "models"]:
        name, rest = parts[2], parts[3:]
        version = ""
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        if len(rest) <= 1:
            entry = _MODEL_ROUTES.get(rest[0] if rest else "")
            if entry is not None and name:
                return _checked(method, *entry, Route(entry[1], name, version))
    if len(parts) == 5 and parts[:3] == ["v2", "repository", "models"] \
            and parts[4] in ("load", "unload") and parts[3]:
        return _checked(method, "POST", parts[4], Route(parts[4], parts[3]))
    raise HttpError(404, f"no such endpoint: {path[:200]}")


def _checked(method: str, allowed: str, kind: str, route: Route) -> Route:
    if method == allowed or (method == "HEAD" and allowed == "GET"):
        return route
    raise HttpError(405, f"{method} is not allowed here; use {allowed}",
                    [(b"allow", allowed.encode())])


class RestApi:
    """The ASGI application (see the module docstring).

    ``max_body_bytes`` bounds a request body, before and after decompression; a larger
    ``Content-Length`` is refused before the body is read. ``token``: the bearer token the
    gRPC groups in ``auth_groups`` require; health and the devices page stay open."""

    def __init__(self, *, edge: EdgeServicer, control: ControlCalls, max_body_bytes: int,
                 max_tensor_elements: int, token: str | None = None,
                 auth_groups: Collection[str] = (), page: bytes = b"") -> None:
        self._edge = edge
        self._control = control
        self._max_body_bytes = max_body_bytes
        self._max_elements = max_tensor_elements
        self._token = token
        self._guarded = frozenset(auth_groups) if token else frozenset()
        self._page = page

    async def __call__(self, scope: ASGIMessage, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # no lifespan, no websockets
            return
        headers = _headers(scope["headers"])
        method = scope["method"]
        sent = False

        async def tracked(message: ASGIMessage) -> None:
            nonlocal sent
            sent = True
            await send(message)

        try:
            route = route_of(method, scope["path"])
            self._authorize(route, headers)
            if route.kind == "infer" and not self._edge.draining:
                # Counted until its answer is written: a drain waits for it.
                with self._edge.open_request():
                    reply = await self._infer(route, headers, await self._body(headers, receive),
                                              receive)
                    await send_reply(tracked, reply, headers, head_only=False)
                return
            body = await self._body(headers, receive)
            if route.kind == "infer":
                reply = await self._infer(route, headers, body, receive)
            else:
                reply = await self._dispatch(route, body)
        except HttpError as error:
            reply = error.reply()
        except _Disconnected:
            return
        except Exception:
            if sent:
                raise  # the response began: uvicorn logs it and closes the connection
            # A bug: without this, uvicorn would answer a plain-text 500; the client gets the
            # JSON error and status header every error has, and the log the traceback, once.
            logger.exception("HTTP %s %s failed inside the server", method, scope["path"][:200])
            reply = error_reply(500, "internal server error; see the server log",
                                [status_header("INTERNAL")])
        await send_reply(send, reply, headers, head_only=method == "HEAD")

    def _authorize(self, route: Route, headers: Mapping[bytes, bytes]) -> None:
        if not self._guarded or route.kind in _OPEN:
            return
        if group_of(_METHOD_OF[route.kind]) not in self._guarded:
            return
        header = headers.get(b"authorization")
        if header is None or not token_matches(header.decode("latin-1"), self._token or ""):
            raise HttpError(401, "missing or wrong bearer token (header 'Authorization: "
                                 "Bearer TOKEN')", [(b"www-authenticate", b"Bearer")])

    async def _body(self, headers: Mapping[bytes, bytes], receive: Receive) -> bytes:
        """The request body, refused (413) before it is read when it declares more than the
        limit, and as soon as it grows past it when it declares nothing (chunked)."""
        limit = self._max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                raise HttpError(400, f"Content-Length {declared[:32]!r} is not a number")
            if int(declared) > limit:
                raise HttpError(413, f"the request body has {int(declared)} bytes; the server's "
                                     f"limit is {limit} (--max-message-bytes)",
                                [(b"connection", b"close")])
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"the request body is over the server's limit of {limit} "
                                     "bytes (--max-message-bytes)", [(b"connection", b"close")])
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        encoding = headers.get(b"content-encoding")
        if encoding is not None and body:
            try:
                body = compression.decode_body(body, encoding.decode("latin-1"), limit)
            except compression.BodyTooLarge as exc:  # read whole: the connection stays usable
                raise HttpError(413, f"{exc} (--max-message-bytes)") from exc
            except EvenflowError as exc:
                raise HttpError(http_status_of(exc), str(exc)) from exc
        return body

    async def _infer(self, route: Route, headers: Mapping[bytes, bytes], body: bytes,
                     receive: Receive) -> Reply:
        edge = self._edge
        request_id = ""
        try:
            edge.refuse_when_draining()
            request = tensors.parse_request(body, _header_length(headers))
            request_id = request.id or ""
            model = await edge.model(route.model, route.version)
            return await self._run(route, request, model, receive)
        except _Disconnected:
            raise  # nobody to answer, and not a failure: gRPC's cancelled calls are not counted
        except EvenflowError as exc:
            error = exc
        except Exception as exc:  # a server bug: 500, logged, and the server keeps serving
            error = internal_error(exc, f"request {request_id!r} to model {route.model!r}")
        edge.count_failure(route.model, request_id, error)
        answer_headers = [status_header(status_of(error).name)]
        if may_resend(error):
            answer_headers.append(MAY_RESEND_HEADER)
        return error_reply(http_status_of(error), str(error), answer_headers)

    async def _run(self, route: Route, request: tensors.RestRequest, model: InferTarget,
                   receive: Receive) -> Reply:
        specs = model.definition
        cpu = model.cpu_parts
        clock = time.thread_time if cpu is not None else cpu_accounting.no_clock
        started_s = clock()
        deadline_s = math.inf if request.timeout_s is None \
            else time.monotonic() + request.timeout_s
        arrays, num_samples = tensors.decode_inputs(request, specs.inputs, self._max_elements)
        chosen = tensors.requested_outputs(request, specs.outputs)
        answer, lengths = submit_arrays(model, arrays, num_samples, deadline_s,
                                        request.priority, started_s, clock)
        outputs = await _unless_disconnected(answer, receive)
        if lengths:
            outputs = shapes.cut_outputs(outputs, specs.outputs, lengths)
        encoding_s = clock()
        parts, header_length = tensors.encode_response(request, route.model, MODEL_VERSION,
                                                       specs.outputs,
                                                       chosen, outputs)
        extra: tuple[tuple[bytes, bytes], ...] = ()
        if header_length is not None:
            extra = ((b"inference-header-content-length", str(header_length).encode()),)
        if cpu is not None:
            cpu.add("encode", clock() - encoding_s)
        return Reply(200, parts, JSON if header_length is None else b"application/octet-stream",
                     extra)

    async def _dispatch(self, route: Route, body: bytes) -> Reply:
        kind = route.kind
        edge = self._edge
        if kind == "live":
            return EMPTY
        if kind == "server_ready":
            return EMPTY if edge.serving else error_reply(503, "the server is not ready")
        if kind == "page":
            return Reply(200, [self._page], b"text/html; charset=utf-8",
                         ((b"cache-control", b"no-cache"),))
        if kind == "server":
            return json_reply(to_json(edge.metadata))
        name, version = route.model, route.version
        if kind == "metadata":
            return json_reply(to_json(await self._call(
                kind, pb.ModelMetadataRequest(name=name, version=version),
                pb.ModelMetadataResponse)))
        if kind == "ready":
            ready = await self._call(kind, pb.ModelReadyRequest(name=name, version=version),
                                     pb.ModelReadyResponse)
            return EMPTY if ready.ready else error_reply(
                503, f"model {name!r} is not ready")
        if kind == "config":
            config = await self._call(kind, pb.ModelConfigRequest(name=name, version=version),
                                      pb.ModelConfigResponse)
            return json_reply(to_json(config.config))
        if kind == "stats":
            return json_reply(to_json(await self._call(
                kind, pb.ModelStatisticsRequest(name=name, version=version),
                pb.ModelStatisticsResponse)))
        if kind == "evenflow_stats":
            return json_reply(to_json(await self._call(
                kind, evenflow_pb2.GetStatsRequest(), evenflow_pb2.GetStatsResponse)))
        document = _json_object(body)
        if kind == "index":
            ready = document.get("ready", False)
            if not isinstance(ready, bool):
                raise HttpError(400, "'ready' must be true or false")
            index = await self._call(kind, pb.RepositoryIndexRequest(ready=ready),
                                     pb.RepositoryIndexResponse)
            return json_reply([to_json(model) for model in index.models])
        parameters = _repository_parameters(document.get("parameters", {}))
        if kind == "load":
            await self._call(kind, pb.RepositoryModelLoadRequest(model_name=name,
                                                                 parameters=parameters),
                             pb.RepositoryModelLoadResponse)
        else:
            await self._call(kind, pb.RepositoryModelUnloadRequest(model_name=name,
                                                                   parameters=parameters),
                             pb.RepositoryModelUnloadResponse)
        return EMPTY

    async def _call(self, kind: str, request: Message, response: type[M]) -> M:
        try:
            code, details, data = await self._control.call(
                _METHOD_OF[kind], request.SerializeToString(), math.inf)
        except EvenflowError as exc:  # a front-end's engine is gone
            raise HttpError(http_status_of(exc), str(exc),
                            [status_header(status_of(exc).name)]) from exc
        if code != _OK:
            status = status_from_value(code)
            raise HttpError(http_status(status), details, [status_header(status.name)])
        return response.FromString(data)


async def _unless_disconnected(answer: Awaitable[T], receive: Receive) -> T:
    """``answer``'s result, unless the client goes away first: then the answer is cancelled
    and _Disconnected raised. uvicorn never cancels the application's task when a client
    disconnects; it tells only through ``receive``, which after the body blocks until then
    (ASGI). A cancelled answer is what a cancelled gRPC call leaves: the balancer drops it
    from its queue (counted as dropped, "cancelled") and its admission slot is freed.

    The watch cancels the answer from a callback, and this task awaits the answer alone: a
    third of the cost of ``asyncio.wait`` on both (about 10 us a request against 45)."""
    future = asyncio.ensure_future(answer)  # a front-end's answer is a coroutine
    watch = asyncio.ensure_future(_disconnect(receive))
    watch.add_done_callback(lambda _: future.cancel())  # no-op once answered
    try:
        return await future  # this task cancelled: the answer is cancelled with it
    except asyncio.CancelledError:
        if watch.done() and not watch.cancelled():
            raise _Disconnected from None
        raise
    finally:
        watch.cancel()


async def _disconnect(receive: Receive) -> None:
    """Return once the client has gone away. Any other message (after the body, an ASGI server
    sends none), or a receive that fails, means this server will not tell: then wait for
    nothing, and the answer is awaited as it would be without a watch."""
    try:
        message = await receive()
    except Exception:
        logger.debug("receive() failed while an answer was awaited", exc_info=True)
        message = {}
    if message.get("type") != "http.disconnect":
        await asyncio.Event().wait()


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    return dict(raw)  # ASGI servers give lower-case names


def _header_length(headers: Mapping[bytes, bytes]) -> int | None:
    value = headers.get(b"inference-header-content-length")
    if value is None:
        return None
    if not value.isdigit():
        raise InvalidRequest(f"Inference-Header-Content-Length {value[:32]!r} is not a "
                             "non-negative integer")
    return int(value)


def _json_object(body: bytes) -> dict[str, Any]:
    """A control call's optional JSON object body ({} when empty)."""
    if not body.strip():
        return {}
    try:
        document = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise HttpError(400, f"the request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise HttpError(400, "the request body's JSON is nested too deeply") from None
    if not isinstance(document, dict):
        raise HttpError(400, "the request body must be a JSON object")
    return document


def _repository_parameters(value: Any) -> dict[str, pb.ModelRepositoryParameter]:
    """Model-control parameters from JSON: strings, booleans and integers (Triton's ``config``
    is a JSON document in a string)."""
    if not isinstance(value, dict):
        raise HttpError(400, "'parameters' must be a JSON object")
    parameters: dict[str, pb.ModelRepositoryParameter] = {}
    for key, item in value.items():
        if isinstance(item, bool):
            parameters[key] = pb.ModelRepositoryParameter(bool_param=item)
        elif isinstance(item, int):
            if not _INT64_MIN <= item <= _INT64_MAX:  # protobuf would raise ValueError
                raise HttpError(400, f"parameter {key[:64]!r} is out of the int64 range")
            parameters[key] = pb.ModelRepositoryParameter(int64_param=item)
        elif isinstance(item, str):
            parameters[key] = pb.ModelRepositoryParameter(string_param=item)
        else:
            raise HttpError(400, f"parameter {key[:64]!r} must be a string, a boolean or an "
                                 "integer")
    return parameters
