"""The messages between front-end processes and the engine, over ZeroMQ (one ROUTER in the
engine, one DEALER per front-end). First frame: a msgspec/msgpack struct below; then one raw
frame per array (``Infer``, ``Answer``) or the serialized protobuf (``Call``, ``Reply``)."""

from __future__ import annotations

import msgspec

from evenflow.server.models.spec import Padding, TensorSpec
from evenflow.server.processes.ipc.arrays import ArrayMeta
from evenflow.server.processes.ipc.errors import WireError


class EdgeModel(msgspec.Struct, array_like=True, frozen=True):
    """A model's tensor specs, as a front-end validates requests against them."""

    name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    padding: Padding | None = None

    @property
    def variable_shapes(self) -> bool:
        return any(-1 in t.shape[1:] for t in self.inputs)


# front-end -> engine
class Hello(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Sent twice: first (``listening`` false) so that the engine knows this front-end before
    any request of its arrives, and it wants the models and the health; then once it serves
    the port."""

    index: int
    pid: int
    listening: bool = True


class Infer(msgspec.Struct, tag=True, array_like=True, frozen=True):
    id: int
    model: str
    version: str
    num_samples: int
    deadline_s: float  # time.monotonic(): CLOCK_MONOTONIC, shared by the machine's processes
    priority: int
    arrays: list[ArrayMeta]


class Cancel(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The client went away: drop the request if it has not run."""

    id: int


class Call(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Any other RPC, by method path; the request's bytes follow."""

    id: int
    method: str
    deadline_s: float


class Failed(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A request the front-end itself failed (for the whole server's metrics)."""

    model: str
    code: str


class Sync(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Send the models again (a request named one the front-end does not know)."""

    id: int


# engine -> front-end
class Models(msgspec.Struct, tag=True, array_like=True, frozen=True):
    models: list[EdgeModel]
    serving: bool
    id: int = -1  # the Sync it answers, if any


class Health(msgspec.Struct, tag=True, array_like=True, frozen=True):
    serving: bool


class Answer(msgspec.Struct, tag=True, array_like=True, frozen=True):
    id: int
    arrays: list[ArrayMeta]


class Refused(msgspec.Struct, tag=True, array_like=True, frozen=True):
    id: int
    error: WireError


class Reply(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A Call's answer: gRPC status code value (0: OK, the response's bytes follow)."""

    id: int
    code: int
    details: str = ""


class Drain(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Refuse new inference calls (UNAVAILABLE), health NOT_SERVING; answer what is in flight."""


class Stop(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Everything in flight is answered: close the port and exit."""


ToEngine = Hello | Infer | Cancel | Call | Failed | Sync
class Bundle(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Several messages in one: ``parts[i]`` is how many of the frames that follow make up
    message ``i`` (its header, then its own frames). The engine sends what it has for a
    front-end once per loop turn: a batch's answers cost one send, not one each."""

    parts: list[int]


ToFrontend = Models | Health | Answer | Refused | Reply | Drain | Stop | Bundle

encoder = msgspec.msgpack.Encoder()
to_engine = msgspec.msgpack.Decoder(ToEngine)
to_frontend = msgspec.msgpack.Decoder(ToFrontend)
