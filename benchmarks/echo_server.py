"""A bare grpc.aio + uvloop KServe v2 server that only echoes ModelInfer: the transport limit.

It answers just what perf_analyzer needs (metadata and config of one model ``mlp`` with input
``x`` FP32 [-1, 256]) and returns the input bytes as output ``y``, over ModelInfer and over
ModelStreamInfer (each request on the stream answered in turn).
``python -m benchmarks.echo_server --port 0`` prints ``echo listening on HOST:PORT``.

``--defer`` gives the floors of servers that answer later than the handler's first step, as
every batching server does, so evenflow's overhead can be told apart from the price of answering
asynchronously at all:

- ``none`` (default): the answer is returned by the handler's first step: the transport limit.
- ``turn``: the handler awaits a future; the requests that arrived in one loop turn are answered
  together by one callback on the next (a batcher with a free model and no worker).
- ``thread``: as ``turn``, but each batch goes to a worker thread and is answered through
  ``call_soon_threadsafe``, one batch in flight, requests arriving meanwhile forming the next
  (evenflow's thread-worker hand-off with a free model and no balancer).

``--delay-ms D`` makes the answer come D ms later, as a model's compute would: by a timer on the
event loop (``none``: the handler sleeps; ``turn``: the batch is answered D ms after its first
request) or by the worker thread sleeping before it answers the batch (``thread``).
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import signal
import threading
import time
from typing import Any

import grpc
import uvloop

from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.proto import model_config_pb2 as mc


class EchoServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, delay_s: float = 0.0) -> None:
        self._delay_s = delay_s

    async def ServerLive(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ServerMetadataResponse(name="echo", version="0")

    async def ModelMetadata(self, request, context):  # type: ignore[no-untyped-def]
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=request.name, versions=["1"], platform="echo",
            inputs=[tensor(name="x", datatype="FP32", shape=[-1, 256])],
            outputs=[tensor(name="y", datatype="FP32", shape=[-1, 256])])

    async def ModelConfig(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ModelConfigResponse(config=mc.ModelConfig(
            name=request.name, max_batch_size=64,
            input=[mc.ModelInput(name="x", data_type=mc.TYPE_FP32, dims=[256])],
            output=[mc.ModelOutput(name="y", data_type=mc.TYPE_FP32, dims=[256])]))

    async def ModelStreamInfer(self, request_iterator, context):  # type: ignore[no-untyped-def]
        """Each request echoed on the stream as ModelInfer would answer it, in order."""
        async for request in request_iterator:
            yield pb.ModelStreamInferResponse(
                infer_response=await self.ModelInfer(request, context))

    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]
        if self._delay_s > 0:
            await asyncio.sleep(self._delay_s)
        return echo(request)


def echo(request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """The response of a model that returns its input ``x`` as ``y``."""
    tensor = request.inputs[0]
    return pb.ModelInferResponse(
        model_name=request.model_name, id=request.id,
        outputs=[pb.ModelInferResponse.InferOutputTensor(
            name="y", datatype=tensor.datatype, shape=tensor.shape)],
        raw_output_contents=[request.raw_input_contents[0]])


class DeferredEchoServicer(EchoServicer):
    """Echo, answered from a batch: on the next loop turn (``turn``) or after a worker thread
    has seen the batch (``thread``)."""

    def __init__(self, defer: str, delay_s: float = 0.0) -> None:
        super().__init__(delay_s)
        self._forming: list[asyncio.Future[None]] = []
        self._flush_scheduled = False
        self._running = False
        self._inbox: queue.SimpleQueue[Any] | None = None
        self._thread: threading.Thread | None = None
        if defer == "thread":
            self._inbox = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._worker, args=(self._inbox,),
                                            name="echo-worker")
            self._thread.start()

    def close(self) -> None:
        """Stop the worker thread (after the server has stopped)."""
        if self._inbox is not None and self._thread is not None:
            self._inbox.put(None)
            self._thread.join()

    async def ModelInfer(self, request: pb.ModelInferRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()
        self._forming.append(answered)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            if self._delay_s > 0 and self._inbox is None:
                loop.call_later(self._delay_s, self._flush)
            else:
                loop.call_soon(self._flush)
        await answered
        return echo(request)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._forming or self._running:
            return
        batch, self._forming = self._forming, []
        if self._inbox is None:
            _answer(batch)
            return
        self._running = True
        self._inbox.put((batch, asyncio.get_running_loop()))

    def _worker(self, inbox: queue.SimpleQueue[Any]) -> None:
        while (item := inbox.get()) is not None:
            batch, loop = item
            if self._delay_s > 0:
                time.sleep(self._delay_s)  # the model's compute, off the event loop
            loop.call_soon_threadsafe(self._done, batch)

    def _done(self, batch: list[asyncio.Future[None]]) -> None:
        self._running = False
        _answer(batch)
        self._flush()


def _answer(batch: list[asyncio.Future[None]]) -> None:
    for answered in batch:
        if not answered.done():
            answered.set_result(None)


def build_server(servicer: EchoServicer, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    return server, server.add_insecure_port(f"{host}:{port}")


def make_servicer(defer: str = "none", delay_s: float = 0.0) -> EchoServicer:
    return EchoServicer(delay_s) if defer == "none" else DeferredEchoServicer(defer, delay_s)


async def serve(host: str, port: int, defer: str = "none", delay_s: float = 0.0) -> None:
    servicer = make_servicer(defer, delay_s)
    server, bound = build_server(servicer, host, port)
    await server.start()
    print(f"echo listening on {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(5)
    if isinstance(servicer, DeferredEchoServicer):
        servicer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--defer", choices=("none", "turn", "thread"), default="none",
                        help="answer in the handler's first step, on the next loop turn, or "
                             "after a worker thread (see the module's docstring)")
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="answer this much later, as a model's compute would")
    args = parser.parse_args()
    if args.delay_ms < 0:
        parser.error("--delay-ms must be >= 0")
    uvloop.run(serve(args.host, args.port, args.defer, args.delay_ms / 1e3))


if __name__ == "__main__":
    main()
