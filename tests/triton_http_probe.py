"""Calls an evenflow server over HTTP with Triton's own client library, in each of its three
forms (sync, gevent-based ``async_infer``, ``tritonclient.http.aio``), and checks every answer
bit for bit against the same request over gRPC (``tritonclient.grpc``).

Run as a separate process (tritonclient registers Triton's protos under the same ``inference``
package names as ours): ``python tests/triton_http_probe.py HTTP_HOST:PORT GRPC_HOST:PORT``
against a server with ``types=tests.fixture_models:every_type``. Prints one line per case;
exits non-zero at the first difference.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient

TYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
         "FP16", "BF16", "FP32", "FP64", "BYTES")
MODEL = "types"
BATCH = 2


def sample(datatype: str, rng: np.random.Generator) -> np.ndarray:
    shape = (BATCH, 3)
    if datatype == "BYTES":  # empty, control characters and text (JSON carries only UTF-8)
        return np.array([[b"", b"\x00\x7fx", "é".encode()], [b"abc", b"d" * 40, b"\x01"]],
                        dtype=object)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if datatype == "BF16":  # tritonclient takes and returns BF16 as ml_dtypes.bfloat16
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    if datatype.startswith("FP"):
        dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
        return rng.standard_normal(shape).astype(dtype)
    dtype = np.dtype(datatype.lower())
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def http_request(inputs: dict[str, np.ndarray], json_inputs: set[str],
                 json_outputs: set[str]) -> tuple[list[Any], list[Any]]:
    tensors, outputs = [], []
    for datatype in TYPES:
        tensor = httpclient.InferInput(f"in_{datatype}", [BATCH, 3], datatype)
        tensor.set_data_from_numpy(inputs[datatype], binary_data=datatype not in json_inputs)
        tensors.append(tensor)
        outputs.append(httpclient.InferRequestedOutput(
            f"out_{datatype}", binary_data=datatype not in json_outputs))
    return tensors, outputs


def grpc_answers(url: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(url)
    tensors = []
    for datatype in TYPES:
        tensor = grpcclient.InferInput(f"in_{datatype}", [BATCH, 3], datatype)
        tensor.set_data_from_numpy(inputs[datatype])
        tensors.append(tensor)
    result = client.infer(MODEL, tensors)
    client.close()
    return {t: result.as_numpy(f"out_{t}") for t in TYPES}


def same(expected: dict[str, np.ndarray], result: Any, case: str) -> None:
    for datatype in TYPES:
        got = result.as_numpy(f"out_{datatype}")
        want = expected[datatype]
        if got is None or got.dtype != want.dtype or got.shape != want.shape:
            equal = False
        elif want.dtype == object:  # BYTES: the elements (tritonclient gives JSON's as str)
            equal = [e.encode() if isinstance(e, str) else e for e in got.reshape(-1)] \
                == list(want.reshape(-1))
        else:
            equal = got.tobytes() == want.tobytes()
        if not equal:
            raise AssertionError(f"{case}: out_{datatype} differs from gRPC: {got!r} vs {want!r}")
    print(f"{case}: every datatype equal to gRPC, bit for bit")


Variant = tuple[str, set[str], set[str], dict[str, str]]


def variants() -> list[Variant]:
    """(case, inputs sent as JSON, outputs asked for as JSON, compression) for each request."""
    text = set(TYPES) - {"BF16"}  # BF16 only as binary data
    half = {"BOOL", "UINT16", "INT8", "INT64", "FP16", "FP64", "BYTES"}
    gzip = {"request_compression_algorithm": "gzip", "response_compression_algorithm": "gzip"}
    deflate = {"request_compression_algorithm": "deflate",
               "response_compression_algorithm": "deflate"}
    return [("binary in, binary out", set(), set(), {}),
            ("JSON in, JSON out", text, text, {}),
            ("JSON and binary mixed in one request", half, text - half, {}),
            ("gzip both ways, mixed", half, half, gzip),
            ("deflate both ways", text, set(), deflate)]


def sync_cases(url: str, inputs: dict[str, np.ndarray],
               expected: dict[str, np.ndarray]) -> None:
    client = httpclient.InferenceServerClient(url, concurrency=4)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL)
    metadata = client.get_model_metadata(MODEL)
    assert [t["datatype"] for t in metadata["inputs"]] == list(TYPES), metadata
    config = client.get_model_config(MODEL)
    assert config["max_batch_size"] > 0 and config["input"][0]["dims"] == [3], config
    stats = client.get_inference_statistics(MODEL)["model_stats"][0]
    assert isinstance(stats["inference_count"], int), stats  # a number, not a string
    for case, json_inputs, json_outputs, compression in variants():
        tensors, outputs = http_request(inputs, json_inputs, json_outputs)
        same(expected, client.infer(MODEL, tensors, outputs=outputs, **compression),
             f"sync, {case}")
    # gevent greenlets: tritonclient's own async form
    tensors, outputs = http_request(inputs, set(), set())
    pending = [client.async_infer(MODEL, tensors, outputs=outputs) for _ in range(4)]
    for index, call in enumerate(pending):
        same(expected, call.get_result(), f"gevent async_infer #{index}")
    client.close()


async def aio_cases(url: str, inputs: dict[str, np.ndarray],
                    expected: dict[str, np.ndarray]) -> None:
    async with aioclient.InferenceServerClient(url) as client:
        assert await client.is_server_ready()
        for case, json_inputs, json_outputs, compression in variants()[:4]:
            tensors, outputs = http_request(inputs, json_inputs, json_outputs)
            answers = await asyncio.gather(*(client.infer(MODEL, tensors, outputs=outputs,
                                                          **compression) for _ in range(3)))
            for answer in answers:
                same(expected, answer, f"aio, {case}")


def main() -> None:
    http_url, grpc_url = sys.argv[1], sys.argv[2]
    inputs = {datatype: sample(datatype, np.random.default_rng(11)) for datatype in TYPES}
    expected = grpc_answers(grpc_url, inputs)
    run: list[Callable[[], Any]] = [lambda: sync_cases(http_url, inputs, expected),
                                    lambda: asyncio.run(aio_cases(http_url, inputs, expected))]
    for step in run:
        step()
    print("triton http probe: ok")


if __name__ == "__main__":
    main()
