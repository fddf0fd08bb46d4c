"""The engine's side of ``--frontends N``, with a test DEALER for a front-end: the engine runs
what the front-end validated as it is (the shape key it sent included), and refuses a request
validated against tensor specs the model no longer has."""

from __future__ import annotations

import asyncio
import math
import os
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
import numpy as np
import pytest
import zmq
import zmq.asyncio

from evenflow.server.config.server_config import ServerConfig
from evenflow.server.engine.proxied_calls import ProxiedCalls
from evenflow.server.engine.served import ModelTable, ServedModel
from evenflow.server.models.spec import Padding, TensorSpec
from evenflow.server.processes.frontend_pool import FrontendPool
from evenflow.server.processes.ipc import arrays
from evenflow.server.processes.ipc import frontend_messages as msg

pytestmark = pytest.mark.timeout(30)

X2 = (TensorSpec("x", "FP32", (-1, -1)),)
Y = (TensorSpec("y", "FP32", (-1, -1)),)


@dataclass(frozen=True)
class _Definition:
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec] = Y
    padding: Padding | None = None
    variable_shapes: bool = True


@dataclass
class EchoModel:
    """Answers every request with its inputs at once; records what it was given."""

    definition: _Definition
    name: str = "m"
    shape_keys: list[Hashable] = field(default_factory=list)

    def submit(self, payload: Any, num_samples: int, deadline_s: float = math.inf,
               priority: int = 0, shape_key: Hashable = None) -> asyncio.Future[Any]:
        self.shape_keys.append(shape_key)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(payload)
        return future


class FakeFrontend:
    """A DEALER that says hello and reads what the engine sends, Bundles unpacked."""

    def __init__(self, address: str) -> None:
        self.socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self._received: list[tuple[msg.ToFrontend, list[bytes]]] = []

    async def send(self, message: msg.ToEngine, frames: Sequence[object] = ()) -> None:
        await self.socket.send_multipart([msg.encoder.encode(message), *frames])

    async def next(self) -> tuple[msg.ToFrontend, list[bytes]]:
        while not self._received:
            header, *frames = await self.socket.recv_multipart()
            message = msg.to_frontend.decode(header)
            if not isinstance(message, msg.Bundle):
                self._received.append((message, frames))
                continue
            start = 0
            for size in message.parts:
                self._received.append((msg.to_frontend.decode(frames[start]),
                                       frames[start + 1:start + size]))
                start += size
        return self._received.pop(0)

    async def models(self) -> dict[str, msg.EdgeModel]:
        message, _ = await self.next()
        assert isinstance(message, msg.Models)
        return {m.name: m for m in message.models}

    async def infer(self, request_id: int, spec_version: int, array: np.ndarray,
                    shape_key: msg.ShapeKey | None) -> msg.ToFrontend:
        metas: list[arrays.ArrayMeta] = []
        frames: list[object] = []
        arrays.pack([array], metas, frames)
        await self.send(msg.Infer(id=request_id, model="m", version="", num_samples=1,
                                  deadline_s=math.inf, priority=0, arrays=metas,
                                  spec_version=spec_version, shape_key=shape_key), frames)
        answer, _ = await self.next()
        return answer


@dataclass
class BrokenModel:
    """A model whose submit fails with a bug (``raises``), or whose answer is not arrays."""

    definition: _Definition
    name: str = "m"
    raises: Exception | None = None

    def submit(self, payload: Any, num_samples: int, deadline_s: float = math.inf,
               priority: int = 0, shape_key: Hashable = None) -> asyncio.Future[Any]:
        if self.raises is not None:
            raise self.raises
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result([42])  # not an array: packing it fails
        return future


async def _pool_and_frontend(table: ModelTable) -> tuple[FrontendPool, FakeFrontend]:
    pool = FrontendPool(count=1, settings=lambda *_: cast(msg.FrontendSettings, None),
                        models=table, calls=ProxiedCalls(), host="127.0.0.1", port=0)
    table.on_change = pool.models_changed
    address = pool.bind(f"ipc://@evenflow-test-{os.getpid()}-{uuid.uuid4().hex}")
    frontend = FakeFrontend(address)
    await frontend.send(msg.Hello(0, os.getpid(), listening=False))
    return pool, frontend


async def test_the_engine_runs_a_validated_request_with_the_shape_key_it_was_sent() -> None:
    model = EchoModel(_Definition(X2))
    table = ModelTable([cast(ServedModel, model)])
    pool, frontend = await _pool_and_frontend(table)
    try:
        announced = (await frontend.models())["m"]
        assert announced.spec_version == 0
        # A key the arrays would not give (a front-end pads before it keys): the engine takes
        # the front-end's, as a tuple to batch by, and computes none of its own.
        answer = await frontend.infer(1, announced.spec_version, np.ones((1, 3), np.float32),
                                      ((8,),))
        assert isinstance(answer, msg.Answer) and answer.id == 1
        assert model.shape_keys == [((8,),)]
    finally:
        frontend.socket.close()
        await pool.stop()


async def test_a_reload_with_other_specs_refuses_requests_validated_before_it() -> None:
    table = ModelTable([cast(ServedModel, EchoModel(_Definition(X2)))])
    pool, frontend = await _pool_and_frontend(table)
    try:
        first = (await frontend.models())["m"]
        same = EchoModel(_Definition(X2))
        table.put(cast(ServedModel, same))  # reloaded, same specs: the version holds
        assert (await frontend.models())["m"].spec_version == first.spec_version
        answer = await frontend.infer(1, first.spec_version, np.ones((1, 2), np.float32),
                                      ((2,),))
        assert isinstance(answer, msg.Answer)
        assert same.shape_keys == [((2,),)]

        other = EchoModel(_Definition((TensorSpec("x", "INT64", (-1, -1)),)))
        table.put(cast(ServedModel, other))  # reloaded with other specs
        assert (await frontend.models())["m"].spec_version == first.spec_version + 1
        refused = await frontend.infer(2, first.spec_version, np.ones((1, 2), np.float32),
                                       ((2,),))
        assert isinstance(refused, msg.Refused) and refused.id == 2
        assert refused.error.kind == "InvalidRequest"
        assert "reloaded" in refused.error.message
        assert other.shape_keys == []  # never reached the model
    finally:
        frontend.socket.close()
        await pool.stop()


@pytest.mark.parametrize("model", [BrokenModel(_Definition(X2), raises=RuntimeError("bug")),
                                   BrokenModel(_Definition(X2))],
                         ids=["submit-raises", "answer-not-arrays"])
async def test_a_bug_on_the_engines_side_is_an_internal_error_not_a_request_left_hanging(
        model: BrokenModel, caplog: pytest.LogCaptureFixture) -> None:
    pool, frontend = await _pool_and_frontend(ModelTable([cast(ServedModel, model)]))
    try:
        announced = (await frontend.models())["m"]
        # Bounded: without an answer the request would wait forever.
        refused = await asyncio.wait_for(
            frontend.infer(1, announced.spec_version, np.ones((1, 2), np.float32), ((2,),)), 5)
        assert isinstance(refused, msg.Refused) and refused.id == 1
        assert refused.error.kind == "EvenflowError"  # INTERNAL
        assert "internal server error" in refused.error.message
        # Logged once, with its traceback.
        failures = [r for r in caplog.records if r.exc_info is not None]
        assert len(failures) == 1
        # The engine reads on: the next request is answered too.
        again = await asyncio.wait_for(
            frontend.infer(2, announced.spec_version, np.ones((1, 2), np.float32), ((2,),)), 5)
        assert isinstance(again, msg.Refused) and again.id == 2
    finally:
        frontend.socket.close()
        await pool.stop()


async def test_a_frontend_that_says_hello_after_the_drain_is_drained() -> None:
    table = ModelTable([cast(ServedModel, EchoModel(_Definition(X2)))])
    pool = FrontendPool(count=1, settings=lambda *_: cast(msg.FrontendSettings, None),
                        models=table, calls=ProxiedCalls(), host="127.0.0.1", port=0)
    frontend = FakeFrontend(pool.bind(f"ipc://@evenflow-test-{uuid.uuid4().hex}"))
    try:
        await pool.drain()  # a restarted front-end's hello may come after it
        await frontend.send(msg.Hello(0, os.getpid(), listening=False))
        await frontend.models()
        drain, _ = await asyncio.wait_for(frontend.next(), 5)
        assert isinstance(drain, msg.Drain)
    finally:
        frontend.socket.close()
        await pool.stop()


async def test_failures_a_frontend_reports_are_counted_by_the_engine_once() -> None:
    table = ModelTable([cast(ServedModel, EchoModel(_Definition(X2)))])
    counted: list[tuple[str, str]] = []
    pool = FrontendPool(count=1, settings=lambda *_: cast(msg.FrontendSettings, None),
                        models=table, calls=ProxiedCalls(), host="127.0.0.1", port=0,
                        on_failure=lambda model, code: counted.append((model, code)))
    frontend = FakeFrontend(pool.bind(f"ipc://@evenflow-test-{uuid.uuid4().hex}"))
    try:
        await frontend.send(msg.Hello(0, os.getpid(), listening=False))
        await frontend.models()
        await frontend.send(msg.Failed("m", "INVALID_ARGUMENT"))
        await frontend.send(msg.Sync(5))  # answered after the Failed: it has been read
        await frontend.models()
        assert counted == [("m", "INVALID_ARGUMENT")]
    finally:
        frontend.socket.close()
        await pool.stop()


def test_frontend_settings_are_the_configs_and_cross_on_stdin_whole() -> None:
    config = ServerConfig(port=0, admin=True, auth_groups=("inference",), log_format="json")
    settings = msg.FrontendSettings.from_config(config, index=1, engine_address="ipc://@e",
                                                port=4321, server_version="9")
    assert (settings.port, settings.admin, settings.auth_groups, settings.log_format) == \
        (4321, True, ("inference",), "json")
    assert settings.gil_switch_interval_s == config.gil_switch_interval_s  # one default
    assert settings.tls_cert is None and settings.auth_token_file is None
    encoded = msgspec.msgpack.encode(settings)  # as ipc.child writes it
    assert msgspec.msgpack.decode(encoded, type=msg.FrontendSettings) == settings
