"""TLS, mutual TLS and the bearer token: our SDK, tritonclient and perf_analyzer connect with
the right credentials and are refused without them; health stays open; metrics over HTTPS."""

from __future__ import annotations

import importlib.util
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from evenflow.client import (
    AuthenticationError,
    Client,
    Credentials,
    InferenceServerError,
    ServerUnavailableError,
)
from tests.certs import Pki, make_pki
from tests.servers import TESTS_DIR, perf_analyzer_command

# slow: TLS and token servers as subprocesses.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
TOKEN = "s3cret-token-for-tests-0123456789"
X = np.ones((1, 256), np.float32)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def tls_server(server_factory, pki: Pki, token_file: Path):  # type: ignore[no-untyped-def]
    return server_factory("--model", "mlp", "--devices", "cpu", "--max-queue-delay-ms", "inf",
                          "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                          "--auth-token-file", str(token_file), "--metrics-port", "0")


@pytest.fixture(scope="module")
def mtls_server(server_factory, pki: Pki, token_file: Path):  # type: ignore[no-untyped-def]
    return server_factory("--model", "mlp", "--devices", "cpu", "--max-queue-delay-ms", "inf",
                          "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                          "--tls-client-ca", str(pki.ca), "--auth-token-file", str(token_file))


def infer(url: str, credentials: Credentials | None) -> str:
    try:
        with Client(url, credentials=credentials, retries=0) as client:
            assert client.infer("mlp", {"x": X}, timeout_s=10)["y"].shape == (1, 256)
    except InferenceServerError as exc:
        return type(exc).__name__
    return "OK"


def test_sdk_needs_tls_and_the_token(tls_server, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    url = tls_server.url
    assert infer(url, Credentials(ca_file=pki.ca, token=TOKEN)) == "OK"
    assert infer(url, Credentials(ca_file=pki.ca)) == AuthenticationError.__name__
    assert infer(url, Credentials(ca_file=pki.ca, token="wrong-token-of-some-length")) == \
        AuthenticationError.__name__
    assert infer(url, Credentials(token=TOKEN)) == ServerUnavailableError.__name__  # not TLS
    assert infer(url, None) == ServerUnavailableError.__name__


def test_health_stays_open_and_statistics_need_the_token(tls_server, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    credentials = grpc.ssl_channel_credentials(pki.ca.read_bytes())
    with grpc.secure_channel(tls_server.url, credentials) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        from evenflow.proto import evenflow_pb2, evenflow_pb2_grpc

        stats = evenflow_pb2_grpc.EvenflowStatsStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stats.GetStats(evenflow_pb2.GetStatsRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        stats.GetStats(evenflow_pb2.GetStatsRequest(), timeout=10,
                       metadata=[("authorization", f"Bearer {TOKEN}")])


def test_mutual_tls_needs_a_client_certificate(mtls_server, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    url = mtls_server.url
    with_cert = Credentials(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key,
                            token=TOKEN)
    assert infer(url, with_cert) == "OK"
    assert infer(url, Credentials(ca_file=pki.ca, token=TOKEN)) == \
        ServerUnavailableError.__name__


def test_metrics_over_https_need_the_token(tls_server, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    (line,) = [b for b in tls_server.banner if b.startswith("evenflow metrics on ")]
    url = line.split()[-1].replace("http://", "https://")
    context = ssl.create_default_context(cafile=str(pki.ca))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, context=context, timeout=10) as response:  # loopback
        assert b"nv_inference_count" in response.read()
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, context=context, timeout=10)  # loopback
    assert info.value.code == 401
    info.value.close()


def http_status(url: str, context: ssl.SSLContext, *, token: str | None = None,
                body: bytes | None = None) -> int:
    """The status of one HTTPS call (GET, or POST with ``body``) to the server's HTTP port."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:  # loopback
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


INFER_BODY = ('{"inputs":[{"name":"x","datatype":"FP32","shape":[1,256],"data":['
              + ",".join(["1"] * 256) + ']}]}').encode()


def test_http_takes_the_same_tls_and_token(tls_server, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    base = f"https://{tls_server.http_url}"
    context = ssl.create_default_context(cafile=str(pki.ca))
    infer_url = f"{base}/v2/models/mlp/infer"
    assert http_status(infer_url, context, token=TOKEN, body=INFER_BODY) == 200
    assert http_status(infer_url, context, body=INFER_BODY) == 401
    assert http_status(infer_url, context, token="wrong-token-of-some-length",
                       body=INFER_BODY) == 401
    assert http_status(f"{base}/v2/models/mlp/stats", context) == 401  # statistics group
    assert http_status(f"{base}/v2/health/ready", context) == 200  # health stays open
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plaintext to the TLS port
        urllib.request.urlopen(f"http://{tls_server.http_url}/v2/health/ready",  # loopback
                               timeout=10)


def test_http_mutual_tls_needs_a_client_certificate(mtls_server, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    url = f"https://{mtls_server.http_url}/v2/models/mlp/infer"
    context = ssl.create_default_context(cafile=str(pki.ca))
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # the handshake fails
        http_status(url, context, token=TOKEN, body=INFER_BODY)
    context.load_cert_chain(pki.client_cert, pki.client_key)
    assert http_status(url, context, token=TOKEN, body=INFER_BODY) == 200


def triton_probe(url: str, pki: Pki, *, cert: bool, token: bool) -> str:
    args = [sys.executable, str(TESTS_DIR / "tls_probe.py"), url, str(pki.ca),
            str(pki.client_cert) if cert else "-", str(pki.client_key) if cert else "-",
            TOKEN if token else "-"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


def test_tritonclient_with_and_without_credentials(tls_server, mtls_server, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("tritonclient") is None:
        pytest.skip("tritonclient is not installed")
    assert triton_probe(tls_server.url, pki, cert=False, token=True) == "infer: OK"
    assert triton_probe(tls_server.url, pki, cert=False, token=False) == \
        "infer: StatusCode.UNAUTHENTICATED"
    assert triton_probe(mtls_server.url, pki, cert=True, token=True) == "infer: OK"
    assert triton_probe(mtls_server.url, pki, cert=False, token=True) == \
        "infer: StatusCode.UNAVAILABLE"


@pytest.mark.perf_analyzer
def test_perf_analyzer_over_mutual_tls(mtls_server, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    command = perf_analyzer_command()
    if command is None:
        pytest.skip("perf_analyzer is not installed")
    base = [*command, "-i", "grpc", "-u", mtls_server.url, "-m", "mlp", "--shape", "x:256",
            "--concurrency-range", "2", "-p", "1000", "-s", "60", "--ssl-grpc-use-ssl",
            "--ssl-grpc-root-certifications-file", str(pki.ca)]
    client_cert = ["--ssl-grpc-private-key-file", str(pki.client_key),
                   "--ssl-grpc-certificate-chain-file", str(pki.client_cert)]
    header = ["-H", f"authorization:Bearer {TOKEN}"]
    ok = subprocess.run([*base, *client_cert, *header], capture_output=True, text=True,
                        timeout=90, check=False)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert "Throughput" in ok.stdout
    for args in ([*base, *header], [*base, *client_cert]):  # no client certificate, no token
        refused = subprocess.run(args, capture_output=True, text=True, timeout=90, check=False)
        assert refused.returncode != 0


def test_loadtest_takes_the_same_credentials(tls_server, pki: Pki, token_file: Path,
                                             tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import json

    command = [sys.executable, "-m", "evenflow.server.config.cli", "loadtest",
               "--url", tls_server.url,
               "--model", "mlp", "--concurrency", "2", "--duration-s", "1", "--warmup-s", "0",
               "--tls-ca", str(pki.ca), "--out", str(tmp_path / "lt")]
    run = subprocess.run([*command, "--token-file", str(token_file)], capture_output=True,
                         text=True, timeout=90, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    (point,) = json.loads((tmp_path / "lt" / "results.json").read_text())["points"]
    assert set(point["status_counts"]) == {"OK"}
    refused = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr
