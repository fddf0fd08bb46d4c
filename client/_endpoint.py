"""Which transport a URL means: ``http://`` and ``https://`` URLs are HTTP/REST, ``HOST:PORT``
is gRPC unless ``protocol="http"`` says otherwise (then ``https`` when the credentials ask for
TLS)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, TypeVar
from urllib.parse import urlsplit

from evenflow.client._types import ChannelOptions
from evenflow.client.credentials import Credentials

T = TypeVar("T")

Protocol = Literal["grpc", "http"]
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """``address``: gRPC's target (``HOST:PORT``), or HTTP's ``scheme://HOST:PORT[/prefix]``."""

    protocol: Protocol
    address: str
    credentials: Credentials | None


def resolve(url: str, protocol: Protocol | None,
            credentials: Credentials | None) -> Endpoint:
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r}: expected one of {list(PROTOCOLS)}")
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme in ("http", "https"):
        if protocol == "grpc":
            raise ValueError(f"{url!r} is an HTTP URL but protocol='grpc': give HOST:PORT for "
                             "gRPC, or drop protocol")
        if scheme == "http" and credentials is not None and credentials.secure:
            raise ValueError(f"{url!r} is plain HTTP but the credentials ask for TLS: use "
                             "https://")
        if scheme == "https" and (credentials is None or not credentials.secure):
            credentials = (Credentials(tls=True) if credentials is None
                           else replace(credentials, tls=True))
        parsed = urlsplit(url)
        if not parsed.hostname:
            raise ValueError(f"{url!r} has no host")
        return Endpoint("http", url.rstrip("/"), credentials)
    if protocol == "http":
        secure = credentials is not None and credentials.secure
        return Endpoint("http", f"{'https' if secure else 'http'}://{url}", credentials)
    return Endpoint("grpc", url, credentials)



def open_transport(url: str, protocol: Protocol | None, credentials: Credentials | None,
                   options: ChannelOptions | None,
                   http: Callable[[str, ChannelOptions, Credentials | None], T],
                   grpc: Callable[[str, ChannelOptions, Credentials | None], T]
                   ) -> tuple[Protocol, T]:
    """The protocol ``url`` means and its transport, built by ``http`` or ``grpc``."""
    endpoint = resolve(url, protocol, credentials)
    build = http if endpoint.protocol == "http" else grpc
    return endpoint.protocol, build(endpoint.address, options or ChannelOptions(),
                                    endpoint.credentials)
