"""How a client proves itself: TLS (server CA, optionally a client certificate for mutual TLS)
and a bearer token, sent as ``authorization: Bearer TOKEN`` on every call (gRPC metadata, or the
HTTP header)."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True, slots=True)
class Credentials:
    """Attributes:
    tls: connect over TLS (with ``ca_file`` as the trusted roots, else the system's).
    ca_file: PEM of the CA that signed the server's certificate.
    cert_file, key_file: the client's certificate and key, for servers that require mutual TLS.
    token: bearer token for servers started with ``--auth-token-file``.
    """

    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both cert_file and key_file")
        if self.token is not None and ("\n" in self.token or not self.token.strip()):
            raise ValueError("the token must be one non-empty line")

    @property
    def metadata(self) -> Sequence[tuple[str, str]] | None:
        return (("authorization", f"Bearer {self.token}"),) if self.token else None

    @property
    def headers(self) -> dict[str, str]:
        """The HTTP headers that carry the token."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def secure(self) -> bool:
        return bool(self.tls or self.ca_file or self.cert_file)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not self.secure:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file), private_key=_read(self.key_file),
            certificate_chain=_read(self.cert_file))


    def ssl_context(self) -> ssl.SSLContext:
        """TLS for HTTP: the server verified against ``ca_file`` (else the system's roots),
        with the client certificate when one is set."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


def _read(path: Path | None) -> bytes | None:
    return Path(path).read_bytes() if path is not None else None


def aio_channel(url: str, options: list[tuple[str, int]],
                credentials: Credentials | None) -> grpc.aio.Channel:
    secure = credentials.channel_credentials() if credentials is not None else None
    if secure is None:
        return grpc.aio.insecure_channel(url, options=options)
    return grpc.aio.secure_channel(url, secure, options=options)


def sync_channel(url: str, options: list[tuple[str, int]],
                 credentials: Credentials | None) -> grpc.Channel:
    secure = credentials.channel_credentials() if credentials is not None else None
    if secure is None:
        return grpc.insecure_channel(url, options=options)
    return grpc.secure_channel(url, secure, options=options)
