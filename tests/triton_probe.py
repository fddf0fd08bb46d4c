"""Calls an evenflow server with Triton's own client library and saves what it got.

Run as a separate process (tritonclient registers Triton's protos under the same ``inference``
package names as ours, so the two cannot share a process):
``python tests/triton_probe.py HOST:PORT OUT.npz``.
"""

from __future__ import annotations

import asyncio
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc


def sync_cases(url: str, saved: dict[str, np.ndarray]) -> None:
    client = grpcclient.InferenceServerClient(url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp")
    metadata = client.get_model_metadata("mlp")
    assert metadata.inputs[0].name == "x", metadata
    config = client.get_model_config("mlp").config
    assert config.max_batch_size > 0 and list(config.input[0].dims) == [256]
    stats = client.get_inference_statistics("mlp")
    assert stats.model_stats[0].name == "mlp"
    rng = np.random.default_rng(7)
    for batch in (1, 8):
        x = rng.standard_normal((batch, 256)).astype(np.float32)
        tensor = grpcclient.InferInput("x", [batch, 256], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("mlp", [tensor], outputs=[grpcclient.InferRequestedOutput("y")])
        saved[f"raw_b{batch}_x"], saved[f"raw_b{batch}_y"] = x, result.as_numpy("y")
    client.close()


def typed_cases(url: str, saved: dict[str, np.ndarray]) -> None:
    """Typed ``contents`` (tritonclient's helpers always send raw), through Triton's own stub."""
    import grpc

    channel = grpc.insecure_channel(url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    rng = np.random.default_rng(8)
    for batch in (1, 8):
        x = rng.standard_normal((batch, 256)).astype(np.float32)
        request = service_pb2.ModelInferRequest(model_name="mlp", inputs=[
            service_pb2.ModelInferRequest.InferInputTensor(
                name="x", datatype="FP32", shape=[batch, 256],
                contents=service_pb2.InferTensorContents(fp32_contents=x.reshape(-1)))])
        response = stub.ModelInfer(request, timeout=30)
        y = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(batch, 256)
        saved[f"typed_b{batch}_x"], saved[f"typed_b{batch}_y"] = x, y
    channel.close()


def stream_cases(url: str, saved: dict[str, np.ndarray]) -> None:
    client = grpcclient.InferenceServerClient(url)
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    rng = np.random.default_rng(9)
    xs = {}
    for i in range(3):
        x = rng.standard_normal((2, 256)).astype(np.float32)
        tensor = grpcclient.InferInput("x", [2, 256], "FP32")
        tensor.set_data_from_numpy(x)
        client.async_stream_infer("mlp", [tensor], request_id=str(i))
        xs[str(i)] = x
    for _ in range(3):
        result, error = answers.get(timeout=30)
        assert error is None, error
        request_id = result.get_response().id  # type: ignore[attr-defined]
        saved[f"stream_{request_id}_x"] = xs[request_id]
        saved[f"stream_{request_id}_y"] = result.as_numpy("y")  # type: ignore[attr-defined]
    client.stop_stream()
    client.close()


async def aio_cases(url: str, saved: dict[str, np.ndarray]) -> None:
    client = aioclient.InferenceServerClient(url)
    assert await client.is_server_ready()
    x = np.random.default_rng(10).standard_normal((8, 256)).astype(np.float32)
    tensor = aioclient.InferInput("x", [8, 256], "FP32")
    tensor.set_data_from_numpy(x)
    result = await client.infer("mlp", [tensor])
    saved["aio_b8_x"], saved["aio_b8_y"] = x, result.as_numpy("y")
    await client.close()


def main() -> None:
    url, out = sys.argv[1], sys.argv[2]
    saved: dict[str, np.ndarray] = {}
    sync_cases(url, saved)
    typed_cases(url, saved)
    stream_cases(url, saved)
    asyncio.run(aio_cases(url, saved))
    np.savez(out, **saved)
    print(f"saved {len(saved)} arrays")


if __name__ == "__main__":
    main()
