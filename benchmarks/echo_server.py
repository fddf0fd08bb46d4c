"""A bare grpc.aio + uvloop KServe v2 server that only echoes ModelInfer: the transport limit.

It answers just what perf_analyzer needs (metadata and config of one model ``mlp`` with input
``x`` FP32 [-1, 256]) and returns the input bytes as output ``y``.
``python -m benchmarks.echo_server --port 0`` prints ``echo listening on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc
import uvloop

from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.proto import model_config_pb2 as mc


class EchoServicer(pb_grpc.GRPCInferenceServiceServicer):
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

    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]
        tensor = request.inputs[0]
        return pb.ModelInferResponse(
            model_name=request.model_name, id=request.id,
            outputs=[pb.ModelInferResponse.InferOutputTensor(
                name="y", datatype=tensor.datatype, shape=tensor.shape)],
            raw_output_contents=[request.raw_input_contents[0]])


async def serve(host: str, port: int) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(EchoServicer(), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"echo listening on {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
