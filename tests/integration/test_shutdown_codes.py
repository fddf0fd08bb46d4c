"""Issue 20: SIGTERM under load, with clients that keep calling (as a retry policy does), in
every process mode. A draining server refuses with UNAVAILABLE and answers what it admitted;
nothing ends CANCELLED, whether it was refused, admitted, or in flight as the port closed; on a
stream, every request is answered once, and the stream itself ends OK or UNAVAILABLE."""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections import Counter
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

# slow: SIGTERM under load, three runs in each process mode.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120),
              pytest.mark.usefixtures("server_mode")]

RUNS = 3
CHANNELS = 4  # connections (each front-end process gets some)
UNARY_PER_CHANNEL = 8  # 32 unary clients
STREAM_IN_FLIGHT = 4  # requests each stream (one per channel) keeps open
LOADED_OK = 200  # answers before the signal: about half a second of load
ANSWERED = {"OK", "UNAVAILABLE"}

X = np.ones((1, 256), np.float32)


def request(request_id: str = "") -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="sim", id=request_id, inputs=[
        pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 256])],
        raw_input_contents=[X.tobytes()])


@dataclass
class Load:
    """What the clients saw. ``exited`` is set once the server process has ended."""

    unary: Counter[str] = field(default_factory=Counter)  # status name -> calls
    sent: int = 0
    stream_answers: Counter[str] = field(default_factory=Counter)  # per request, by status
    stream_endings: Counter[str] = field(default_factory=Counter)  # per stream, its status
    repeated_ids: list[str] = field(default_factory=list)
    unanswered_on_ok: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # what ended otherwise, with its details
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    signalled: asyncio.Event = field(default_factory=asyncio.Event)
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    def count_towards_load(self) -> None:
        if self.unary["OK"] + self.stream_answers["OK"] >= LOADED_OK:
            self.loaded.set()

    def done(self, channel: grpc.aio.Channel) -> bool:
        """After the signal: the server has exited, or the port is closed (connect refused)."""
        return self.exited.is_set() or (
            self.signalled.is_set()
            and channel.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE)


async def unary_client(load: Load, channel: grpc.aio.Channel) -> None:
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    while not load.done(channel):
        load.sent += 1
        try:
            await stub.ModelInfer(request(), timeout=30)
            name = "OK"
        except grpc.aio.AioRpcError as exc:
            name = exc.code().name
            if name not in ANSWERED:
                load.other.append(f"{name}: {exc.details()}")
        load.unary[name] += 1
        load.count_towards_load()


async def stream_client(load: Load, channel: grpc.aio.Channel, half_close: bool) -> None:
    """Keeps ``STREAM_IN_FLIGHT`` requests open on one stream until the signal; then reads
    until the stream ends, having half-closed it first or not. (It writes nothing after the
    signal: a write that meets the stream's end fails in the client as INTERNAL, whatever
    status the server sent.)"""
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    call = stub.ModelStreamInfer(timeout=30)
    pending: set[str] = set()
    ids = itertools.count()

    async def send() -> None:
        request_id = str(next(ids))
        pending.add(request_id)
        await call.write(request(request_id))

    try:
        for _ in range(STREAM_IN_FLIGHT):
            await send()
        while (response := await call.read()) is not grpc.aio.EOF:
            request_id = response.infer_response.id
            if request_id not in pending:
                load.repeated_ids.append(request_id)
            pending.discard(request_id)
            name = response.error_message.split(":")[0] if response.error_message else "OK"
            load.stream_answers[name] += 1
            load.count_towards_load()
            if load.signalled.is_set():
                if half_close:
                    half_close = False
                    await call.done_writing()
            else:
                await send()
        ending = (await call.code()).name
    except grpc.aio.AioRpcError as exc:
        ending = exc.code().name
        if ending not in ANSWERED:
            load.other.append(f"stream {ending}: {exc.details()}")
    load.stream_endings[ending] += 1
    if ending == "OK":  # an OK ending must have answered every request it read
        load.unanswered_on_ok.extend(pending)


@pytest.mark.parametrize("run", range(RUNS))
async def test_sigterm_under_load_ends_calls_ok_or_unavailable(server_factory, run: int) -> None:  # type: ignore[no-untyped-def]
    server = server_factory("--model", "sim", "--devices", "sim:1,sim:1", "--sim-base-ms", "20",
                            "--latency-target-ms", "5000")
    load = Load()
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection per channel
    channels = [grpc.aio.insecure_channel(server.url, options=options) for _ in range(CHANNELS)]
    try:
        clients = [asyncio.create_task(unary_client(load, channel))
                   for channel in channels for _ in range(UNARY_PER_CHANNEL)]
        clients += [asyncio.create_task(stream_client(load, channel, half_close=i % 2 == 0))
                    for i, channel in enumerate(channels)]
        await asyncio.wait_for(load.loaded.wait(), 30)
        server.proc.send_signal(signal.SIGTERM)
        load.signalled.set()
        exit_code = asyncio.ensure_future(asyncio.to_thread(server.proc.wait, 60))
        exit_code.add_done_callback(lambda _: load.exited.set())
        await asyncio.wait_for(asyncio.gather(*clients), 60)
        assert await exit_code == 0, server.log()[-3000:]
    finally:
        for channel in channels:
            await channel.close()
    assert sum(load.unary.values()) == load.sent  # every call ended, once
    assert set(load.unary) <= ANSWERED, (load.unary, load.other[:5])
    assert set(load.stream_answers) <= ANSWERED, load.stream_answers
    assert set(load.stream_endings) <= ANSWERED, (load.stream_endings, load.other[:5])
    assert sum(load.stream_endings.values()) == CHANNELS
    assert load.repeated_ids == [] and load.unanswered_on_ok == []
    assert load.unary["UNAVAILABLE"] > 0  # the drain was reached under load
    log = server.log()
    assert "Traceback" not in log and "was destroyed but it is pending" not in log, log[-3000:]
