"""The blocking HTTP/REST transport: urllib3, one keep-alive pool per client (``max_connections``
connections; a caller beyond them waits for a free one, within its ``timeout_s``)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

import grpc
import numpy as np
import urllib3
from urllib3.connectionpool import HTTPConnectionPool, connection_from_url

from evenflow.client import _rest_codec as rest
from evenflow.client._fanout import fan_out
from evenflow.client._http_answer import Answer, health, too_large
from evenflow.client._retry import not_run
from evenflow.client._types import ChannelOptions, Inputs, ModelMetadata, StreamResult
from evenflow.client.credentials import Credentials
from evenflow.client.errors import InferenceServerError, error_for
from evenflow.proto import metadata

# The body's size is checked before it is read, so urllib3 must not have read it already.
_STREAMED = {"preload_content": False, "retries": False, "redirect": False}


class HttpTransport:
    def __init__(self, base_url: str, options: ChannelOptions,
                 credentials: Credentials | None) -> None:
        secure = credentials is not None and credentials.secure
        tls = {"ssl_context": credentials.ssl_context()} if credentials is not None and secure \
            else {}
        self._pool: HTTPConnectionPool = connection_from_url(
            base_url, maxsize=options.max_connections, block=True, **tls)
        # One per pooled connection, taken before urllib3 is asked for one: urllib3 starts a
        # request's timeout only once it has a connection, so the wait for a free one is
        # measured here and taken off the time the request gets.
        self._free = threading.BoundedSemaphore(options.max_connections)
        # Per call: urllib3 drops a pool's headers when a call brings its own.
        self._headers = credentials.headers if credentials is not None else {}
        self._prefix = urllib3.util.parse_url(base_url).path or ""
        self._base_url = base_url
        self._max_bytes = options.max_message_bytes
        self._window = options.max_connections

    @contextlib.contextmanager
    def _failures(self, timeout_s: float | None) -> Iterator[None]:
        """urllib3's errors as the gRPC path's (its NewConnectionError is a TimeoutError
        too: a refused connection is not a deadline). Only a connection never made is
        ``not_run``: any other failure may come after the server read the request."""
        try:
            yield
        except urllib3.exceptions.NewConnectionError as exc:
            raise not_run(self._unavailable(exc)) from exc
        except urllib3.exceptions.TimeoutError as exc:
            raise self._deadline(timeout_s) from exc
        except urllib3.exceptions.EmptyPoolError as exc:
            raise self._no_connection(timeout_s) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise self._unavailable(exc) from exc

    def _deadline(self, timeout_s: float | None) -> InferenceServerError:
        return error_for(grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"no answer from {self._base_url} within {timeout_s} s")

    def _no_connection(self, timeout_s: float | None) -> InferenceServerError:
        return error_for(grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"no free connection to {self._base_url} within {timeout_s} s (all "
                         f"max_connections={self._window} busy)")

    def _unavailable(self, exc: Exception) -> InferenceServerError:
        return error_for(grpc.StatusCode.UNAVAILABLE, f"cannot reach {self._base_url}: {exc}")

    def _request(self, method: str, path: str, timeout_s: float | None,
                 body: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
        """``timeout_s`` bounds the whole request: the wait for a free connection, connecting,
        sending and reading the answer."""
        deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
        if not self._free.acquire(timeout=None if timeout_s is None else max(timeout_s, 0.0)):
            raise self._no_connection(timeout_s)
        try:
            left_s = None if deadline_s is None else deadline_s - time.monotonic()
            if left_s is not None and left_s <= 0:
                raise self._deadline(timeout_s)
            with self._failures(timeout_s):
                # pool_timeout too: a connection is free (``_free``), but should urllib3
                # still wait for one, that wait ends at the deadline as well.
                response = self._pool.urlopen(method, self._prefix + path, body=body,
                                              headers={**self._headers, **(headers or {})},
                                              timeout=urllib3.Timeout(total=left_s),
                                              # urllib3 annotates int, but hands it to
                                              # queue.Queue.get, which takes float seconds
                                              pool_timeout=left_s,  # type: ignore[arg-type]
                                              **_STREAMED)
                try:
                    size = response.headers.get("Content-Length")
                    if size is not None and size.isdigit() and int(size) > self._max_bytes:
                        raise too_large(int(size), self._max_bytes)
                    data = response.read()
                finally:
                    response.release_conn()
        finally:
            self._free.release()
        if len(data) > self._max_bytes:
            raise too_large(len(data), self._max_bytes)
        return Answer(response.status, data, response.headers.get(rest.HEADER_LENGTH),
                      response.reason or "", response.headers.get(rest.STATUS_HEADER),
                      metadata.MAY_RESEND in response.headers)

    def prepare(self, model: str, inputs: Inputs, outputs: Sequence[str] | None,
                request_id: str | None, priority: int | None,
                timeout_s: float | None) -> rest.RestRequest:
        return rest.build_request(inputs, outputs, request_id, priority=priority,
                                  timeout_s=timeout_s)

    def infer(self, model: str, request: rest.RestRequest,
              timeout_s: float | None) -> dict[str, np.ndarray]:
        answer = self._request("POST", rest.infer_path(model), timeout_s, request.body,
                               request.headers)
        return answer.outputs()

    def server_live(self, timeout_s: float | None) -> bool:
        return health(self._request("GET", rest.LIVE_PATH, timeout_s))

    def server_ready(self, timeout_s: float | None) -> bool:
        return health(self._request("GET", rest.READY_PATH, timeout_s))

    def model_ready(self, name: str, timeout_s: float | None) -> bool:
        return health(self._request("GET", rest.ready_path(name), timeout_s))

    def model_metadata(self, name: str, timeout_s: float | None) -> ModelMetadata:
        return rest.parse_metadata(self._request("GET", rest.model_path(name),
                                                 timeout_s).body_or_raise())

    def stream_infer(self, model: str, inputs: Iterable[Inputs], outputs: Sequence[str] | None,
                     timeout_s: float | None) -> Iterator[StreamResult]:
        """Concurrent requests over the pool (HTTP/1.1 has no streams), answers as they finish,
        as gRPC's stream yields them (see ``_fanout``)."""

        def answer(item: Inputs, request_id: str,
                   remaining_s: float | None) -> dict[str, np.ndarray]:
            request = rest.build_request(item, outputs, request_id, timeout_s=remaining_s)
            return self.infer(model, request, remaining_s)

        return fan_out(inputs, answer, self._window, timeout_s)

    def close(self) -> None:
        self._pool.close()
