"""REST body compression: gzip and deflate both ways (tritonclient.http reading our compressed
responses), the cap that stops a zip bomb early, and Accept-Encoding's preferences."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.http._utils import _get_inference_request

from evenflow.balancer import InvalidRequest
from evenflow.server.edge.rest.compression import (
    BodyTooLarge,
    choose_encoding,
    decode_body,
    encode_body,
)
from evenflow.server.edge.rest.tensors import decode_inputs, encode_response, parse_request
from evenflow.server.models.spec import TensorSpec

BODY = b'{"inputs": []}' + bytes(range(256)) * 40
MiB = 1 << 20


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(("encoding", "compressed"), [
    ("gzip", gzip.compress(BODY)),
    ("GZip ", gzip.compress(BODY)),
    ("deflate", zlib.compress(BODY)),  # what tritonclient.http sends as deflate
    ("deflate", raw_deflate(BODY)),  # bare deflate, as some clients send it
    (None, BODY),
    ("identity", BODY),
])
def test_request_bodies_decompress(encoding: str | None, compressed: bytes) -> None:
    assert decode_body(compressed, encoding, len(BODY)) == BODY


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_responses_compress_for_tritonclient(encoding: str) -> None:
    specs = [TensorSpec("y", "FP32", (-1, 3)), TensorSpec("s", "BYTES", (-1, 1))]
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([[b"a"], [b"bc"]], dtype=object)
    request = parse_request(b'{"inputs": [], "outputs": [{"name": "y", "parameters": '
                            b'{"binary_data": true}}, {"name": "s"}]}', None)
    parts, header_length = encode_response(request, "m", "1", specs, [0, 1], [y, s])
    compressed = encode_body(parts, encoding)
    # As in Triton, the header length counts the uncompressed body.
    result = httpclient.InferResult.from_response_body(
        b"".join(compressed), header_length=header_length, content_encoding=encoding)
    np.testing.assert_array_equal(result.as_numpy("y"), y)
    assert result.as_numpy("s").tolist() == [["a"], ["bc"]]
    assert decode_body(b"".join(compressed), encoding, MiB) == b"".join(parts)


def test_identity_response_is_the_parts_themselves() -> None:
    parts: list[bytes | memoryview] = [b"{}", memoryview(b"data")]
    assert encode_body(parts, None) is parts
    with pytest.raises(ValueError, match="unknown response encoding 'br'"):
        encode_body(parts, "br")


def test_a_zip_bomb_is_refused_without_inflating_it() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(MiB)
    bomb = b"".join(compressor.compress(chunk) for _ in range(256)) + compressor.flush()
    assert len(bomb) < MiB // 2  # 256 MiB of zeros
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge, match=f"inflates past the server's limit of {MiB} "
                                                 f"bytes \\({len(bomb)} bytes of gzip\\)"):
            decode_body(bomb, "gzip", MiB)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 4 * MiB


def test_a_body_at_the_limit_is_accepted() -> None:
    data = bytes(1000)
    assert decode_body(gzip.compress(data), "gzip", 1000) == data
    with pytest.raises(BodyTooLarge, match="inflates past the server's limit of 999 bytes"):
        decode_body(gzip.compress(data), "gzip", 999)
    with pytest.raises(BodyTooLarge, match="over the server's limit of 999 bytes"):
        decode_body(data, None, 999)


@pytest.mark.parametrize(("encoding", "body", "message"), [
    ("br", b"x", "Content-Encoding 'br' is not supported; send gzip, deflate or identity"),
    ("gzip, identity", b"x", "Content-Encoding 'gzip, identity' is not supported"),
    ("gzip", b"not gzip at all", "the request body is not valid gzip data: "),
    ("deflate", b"\xff\xff\xff", "the request body is not valid deflate data: "),
    ("gzip", gzip.compress(BODY)[:-12], "the request body's gzip data is truncated"),
    ("deflate", zlib.compress(BODY) + b"junk", "4 bytes follow the end of the request body's "
                                               "deflate data"),
])
def test_bad_compressed_bodies(encoding: str, body: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode_body(body, encoding, MiB)
    assert message in str(info.value)


@pytest.mark.parametrize(("accept", "chosen"), [
    (None, None),
    ("", None),
    ("gzip", "gzip"),
    ("GZIP", "gzip"),
    ("deflate", "deflate"),
    ("gzip, deflate, br", "gzip"),
    ("deflate, gzip", "gzip"),  # a tie goes to gzip
    ("deflate;q=0.5, gzip;q=0.4", "deflate"),
    ("gzip;q=0", None),
    ("gzip;q=0, deflate", "deflate"),
    ("gzip ; q=0.0 , deflate ; q=0.1", "deflate"),
    ("*", "gzip"),
    ("*;q=0", None),
    ("*, gzip;q=0", "deflate"),
    ("identity;q=1, gzip;q=0.5", None),
    ("identity;q=0.5, gzip", "gzip"),
    ("br", None),
    ("gzip;q=abc", None),
    ("gzip;q=2", None),
    ("gzip;q=nan", None),
])
def test_accept_encoding(accept: str | None, chosen: str | None) -> None:
    assert choose_encoding(accept) == chosen


def test_a_compressed_request_from_tritonclient() -> None:
    """tritonclient.http compresses the whole body; its header length counts it uncompressed."""
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    body, header_length = _get_inference_request([tensor], "", None, 0, False, False, 0, None,
                                                 None)
    compressed = gzip.compress(body)
    request = parse_request(decode_body(compressed, "gzip", MiB), header_length)
    arrays, _ = decode_inputs(request, [TensorSpec("x", "FP32", (-1, 4))], MiB)
    np.testing.assert_array_equal(arrays[0], x)
