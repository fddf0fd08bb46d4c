"""The messages between the engine and an out-of-process worker: a worker process, over one
ZeroMQ PAIR socket, or a Ray actor, as its calls' arguments and results. Either way the worker
side answers them with ``workers.endpoint``.

Over ZeroMQ each message is a multipart: the first frame a msgspec/msgpack-encoded struct
below, then one raw frame per array it describes (``ArrayMeta``; small ones travel inline).
Over Ray the arrays travel beside the encoded struct as numpy arrays (``arrays`` is empty). A
batch crosses once: ``RunBatch`` carries each input of the whole batch (the jobs' rows one
after another, ``sizes`` saying how many each), ``BatchDone`` each output of the whole batch."""

from __future__ import annotations

from typing import Any

import msgspec

from evenflow.server.processes.ipc.arrays import ArrayMeta
from evenflow.server.processes.ipc.errors import WireError


class Status(msgspec.Struct, array_like=True, frozen=True):
    stages: list[dict[str, Any]] = []
    num_repartitions: int = 0
    activation_peak_bytes: int | None = None


class Ready(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The worker is built and takes batches."""

    name: str
    devices: list[str]
    max_in_flight: int
    status: Status


class StartFailed(msgspec.Struct, tag=True, array_like=True, frozen=True):
    error: WireError


class RunBatch(msgspec.Struct, tag=True, array_like=True, frozen=True):
    id: int
    sizes: list[int]  # each job's samples
    arrays: list[ArrayMeta]  # one per input, sum(sizes) rows


class BatchDone(msgspec.Struct, tag=True, array_like=True, frozen=True):
    id: int
    timing_s: tuple[float, float, float]  # copy in, compute, copy out
    cpu_s: tuple[float, float, float] | None
    arrays: list[ArrayMeta]  # one per output, every job's rows
    status: Status


class BatchError(msgspec.Struct, tag=True, array_like=True, frozen=True):
    id: int
    error: WireError


class Control(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """``op``: "speed" (``value`` the new speed) or "fault" (``fault``, ``count``)."""

    id: int
    op: str
    device: str
    value: float = 0.0
    fault: str = ""
    count: int = 0


class ControlDone(msgspec.Struct, tag=True, array_like=True, frozen=True):
    id: int
    value: float = 0.0
    error: WireError | None = None


class Stop(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Finish what runs, then exit."""


ToWorker = RunBatch | Control | Stop
FromWorker = Ready | StartFailed | BatchDone | BatchError | ControlDone

encoder = msgspec.msgpack.Encoder()
to_worker = msgspec.msgpack.Decoder(ToWorker)
from_worker = msgspec.msgpack.Decoder(FromWorker)
