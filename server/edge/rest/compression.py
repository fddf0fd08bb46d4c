"""HTTP body compression for the REST edge: a request's ``Content-Encoding`` undone (gzip,
deflate), bounded so a small compressed body cannot inflate past the server's body limit, and
a response compressed as the client's ``Accept-Encoding`` prefers.

As in Triton, ``Inference-Header-Content-Length`` always counts bytes of the uncompressed
body: decompress first, then split the header from the binary data.
"""

from __future__ import annotations

import zlib

from evenflow.balancer.errors import InvalidRequest

ENCODINGS = ("gzip", "deflate")
_IDENTITY = ("identity", "")
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream
_ZLIB_WBITS = zlib.MAX_WBITS  # HTTP's "deflate" is the zlib format (RFC 9110 8.4.1.2)
_RAW_WBITS = -zlib.MAX_WBITS  # bare deflate, which some clients send as "deflate"
# Level 1: the server compresses on its event loop; tensors (floats above all) gain little
# from the slower levels.
_LEVEL = 1


class BodyTooLarge(InvalidRequest):
    """A body that inflates past the limit: the REST API answers 413, as for a body sent over
    it, not the 400 of a bad request."""


def decode_body(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """``body`` decompressed as ``content_encoding`` says (None or identity: as it is), at most
    ``max_bytes`` of it: a body that would inflate further is refused (BodyTooLarge) after
    inflating only ``max_bytes + 1`` bytes of it."""
    encoding = (content_encoding or "").strip().lower()
    if encoding in _IDENTITY:
        decoded = body
    elif encoding in ENCODINGS:
        decoded = _inflate(body, encoding, max_bytes)
    else:
        raise InvalidRequest(f"Content-Encoding {encoding[:32]!r} is not supported; send "
                             f"{', '.join(ENCODINGS)} or identity")
    if len(decoded) > max_bytes:
        raise BodyTooLarge(f"the request body is over the server's limit of {max_bytes} bytes")
    return decoded


def _inflate(body: bytes, encoding: str, max_bytes: int) -> bytes:
    if encoding == "gzip":
        wbits = _GZIP_WBITS
    else:
        wbits = _ZLIB_WBITS if _has_zlib_header(body) else _RAW_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        # max_length bounds what is inflated, whatever the ratio: a bomb stops here.
        decoded = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise InvalidRequest(f"the request body is not valid {encoding} data: {exc}") from None
    if len(decoded) > max_bytes:
        raise BodyTooLarge(f"the request body inflates past the server's limit of {max_bytes} "
                           f"bytes ({len(body)} bytes of {encoding})")
    if not inflater.eof:
        raise InvalidRequest(f"the request body's {encoding} data is truncated")
    if inflater.unused_data:
        raise InvalidRequest(f"{len(inflater.unused_data)} bytes follow the end of the request "
                             f"body's {encoding} data")
    return decoded


def _has_zlib_header(body: bytes) -> bool:
    """RFC 1950's two header bytes: deflate with a window of at most 32 KiB, checksum % 31."""
    return (len(body) >= 2 and body[0] & 0x0F == 8 and body[0] >> 4 <= 7
            and (body[0] << 8 | body[1]) % 31 == 0)


def choose_encoding(accept_encoding: str | None) -> str | None:
    """The response encoding ``Accept-Encoding`` prefers among gzip and deflate (gzip on a
    tie), None for an uncompressed response: nothing asked for, everything refused (q=0), or
    identity preferred."""
    if not accept_encoding:
        return None
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, _, parameters = item.partition(";")
        weight = _quality(parameters)
        if weight is not None:
            weights[coding.strip().lower()] = weight
    wildcard = weights.get("*", 0.0)
    best, best_weight = None, 0.0
    for coding in ENCODINGS:
        weight = weights.get(coding, wildcard)
        if weight > best_weight:
            best, best_weight = coding, weight
    if best is None or weights.get("identity", 0.0) > best_weight:
        return None
    return best


def _quality(parameters: str) -> float | None:
    """The ``q`` of one Accept-Encoding entry (1 when absent); None when it is malformed, so
    the entry is ignored rather than guessed at."""
    for parameter in parameters.split(";"):
        key, _, value = parameter.partition("=")
        if key.strip().lower() == "q":
            try:
                weight = float(value)
            except ValueError:
                return None
            return weight if 0.0 <= weight <= 1.0 else None
    return 1.0


def encode_body(parts: list[bytes | memoryview], encoding: str | None) -> list[bytes | memoryview]:
    """``parts`` (sent in order) compressed as one body in ``encoding`` (None: unchanged). The
    parts are fed to the compressor in turn, never joined into one copy first."""
    if encoding is None:
        return parts
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown response encoding {encoding!r}; expected one of {ENCODINGS}")
    compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED,
                                  _GZIP_WBITS if encoding == "gzip" else _ZLIB_WBITS)
    compressed: list[bytes | memoryview] = [compressor.compress(part) for part in parts]
    compressed.append(compressor.flush())
    return [part for part in compressed if len(part)]
