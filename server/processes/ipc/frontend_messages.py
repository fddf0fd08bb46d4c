"""What the engine and its front-end processes tell each other: the settings a front-end starts
with (on its stdin), and the messages over ZeroMQ (one ROUTER in the engine, one DEALER per
front-end). A message's first frame is a msgspec/msgpack struct below; then one raw frame per
array (``Infer``, ``Answer``) or the serialized protobuf (``Call``, ``Reply``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from evenflow.server.models.spec import Padding, TensorSpec
from evenflow.server.processes.ipc.arrays import ArrayMeta
from evenflow.server.processes.ipc.errors import WireError

if TYPE_CHECKING:  # the configuration imports the models; a front-end never builds settings
    from evenflow.server.config.server_config import ServerConfig

# A request's key to batch by: its inputs' non-batch shapes (see ``edge.shapes.shape_key``).
ShapeKey = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class FrontendSettings:
    """What a front-end process needs, derived from the server's configuration (see
    ``ServerConfig`` for each value's meaning): where the engine is and which port to share.
    TLS and token files travel as paths; the front-end reads them itself."""

    index: int
    engine_address: str
    host: str
    port: int
    http_port: int | None  # None: no HTTP
    max_message_bytes: int
    max_tensor_elements: int
    server_version: str
    admin: bool
    tls_cert: str | None
    tls_key: str | None
    tls_client_ca: str | None
    auth_token_file: str | None
    auth_groups: tuple[str, ...]
    log_level: str
    log_format: str
    gil_switch_interval_s: float

    @classmethod
    def from_config(cls, config: ServerConfig, *, index: int, engine_address: str, port: int,
                    server_version: str, http_port: int | None = None) -> FrontendSettings:
        """Front-end ``index``'s settings: ``config``'s, with the ports the engine reserved."""
        return cls(index=index, engine_address=engine_address, host=config.host, port=port,
                   http_port=http_port,
                   max_message_bytes=config.max_message_bytes,
                   max_tensor_elements=config.max_tensor_elements,
                   server_version=server_version, admin=config.admin,
                   tls_cert=_text(config.tls_cert), tls_key=_text(config.tls_key),
                   tls_client_ca=_text(config.tls_client_ca),
                   auth_token_file=_text(config.auth_token_file),
                   auth_groups=tuple(config.auth_groups), log_level=config.log_level,
                   log_format=config.log_format,
                   gil_switch_interval_s=config.gil_switch_interval_s)


def _text(path: object | None) -> str | None:
    return str(path) if path is not None else None


class EdgeModel(msgspec.Struct, array_like=True, frozen=True):
    """A model's tensor specs, as a front-end validates requests against them. ``spec_version``
    changes whenever the engine serves the name with other specs (0: the first it served): a
    request validated against an older version is refused, never run on the new model."""

    name: str
    spec_version: int
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
    """A request the front-end decoded and validated against the model's specs at
    ``spec_version`` (padded, where the model pads): the engine runs it as it is."""

    id: int
    model: str
    version: str
    num_samples: int
    deadline_s: float  # time.monotonic(): CLOCK_MONOTONIC, shared by the machine's processes
    priority: int
    arrays: list[ArrayMeta]
    # The ``EdgeModel.spec_version`` it was validated against (0, the first, where a sender
    # such as a benchmark's stub front-end names none).
    spec_version: int = 0
    shape_key: ShapeKey | None = None  # models with variable shapes only


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
