"""evenflow's own client over HTTP against a real ``evenflow serve``: the same answers as over
gRPC, bit for bit, for every datatype (blocking and asyncio, in one process and behind
front-ends), the same exceptions with the same messages, stream_infer, TLS and the token, and
``evenflow loadtest --protocol http`` with the server's own view read over HTTP."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from evenflow.client import (
    AsyncClient,
    AuthenticationError,
    Client,
    Credentials,
    InferenceServerError,
    InvalidInputError,
    ModelNotFoundError,
    ServerOverloadedError,
)
from evenflow.loadtest.cli import main as loadtest
from tests.certs import Pki, make_pki
from tests.fixture_models import EVERY_TYPE

# slow: `evenflow serve` processes and a load run.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
X = np.ones((1, 256), np.float32)


def every_type_inputs() -> dict[str, object]:
    rng = np.random.default_rng(7)
    inputs: dict[str, object] = {}
    for datatype in EVERY_TYPE:
        name = f"in_{datatype}"
        if datatype == "BYTES":
            inputs[name] = np.array([[b"a", b"", b"\x00\xff"], [b"xyz", b"q", b"r"]],
                                    dtype=object)
        elif datatype == "BF16":
            inputs[name] = torch.tensor(rng.standard_normal((2, 3)), dtype=torch.bfloat16)
        elif datatype == "BOOL":
            inputs[name] = rng.integers(0, 2, (2, 3)).astype(bool)
        else:
            dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(datatype)
            inputs[name] = (rng.standard_normal((2, 3)).astype(dtype) if dtype is not None
                            else rng.integers(0, 100, (2, 3)).astype(datatype.lower()))
    return inputs


def same(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> None:
    assert set(ours) == set(theirs) == {f"out_{t}" for t in EVERY_TYPE}
    for name, array in ours.items():
        assert array.dtype == theirs[name].dtype and array.shape == theirs[name].shape, name
        if array.dtype == object:
            assert array.tolist() == theirs[name].tolist(), name
        else:
            assert array.tobytes() == theirs[name].tobytes(), f"{name}: not bit for bit"


def test_every_datatype_over_http_is_grpcs_answer_bit_for_bit(types_server) -> None:  # type: ignore[no-untyped-def]
    inputs = every_type_inputs()
    with Client(types_server.url) as grpc_client:
        over_grpc = grpc_client.infer("types", inputs, timeout_s=30)
        grpc_metadata = grpc_client.model_metadata("types")
    with Client(f"http://{types_server.http_url}") as http_client:
        assert http_client.server_live() and http_client.server_ready()
        assert http_client.model_ready("types") and not http_client.model_ready("nope")
        same(http_client.infer("types", inputs, timeout_s=30), over_grpc)
        assert http_client.model_metadata("types") == grpc_metadata
        subset = http_client.infer("types", inputs, outputs=["out_BF16"], timeout_s=30)
        assert list(subset) == ["out_BF16"]

    async def asyncio_client() -> None:
        async with AsyncClient(types_server.http_url, protocol="http") as client:
            same(await client.infer("types", inputs, timeout_s=30), over_grpc)
            answers = [r async for r in client.stream_infer("types", [inputs] * 6,
                                                            timeout_s=30)]
        assert sorted(r.request_id for r in answers) == [str(i) for i in range(6)]
        for answer in answers:
            assert answer.error is None and answer.outputs is not None
            same(answer.outputs, over_grpc)

    asyncio.run(asyncio_client())


@pytest.fixture(scope="module")
def sim_server(server_factory):  # type: ignore[no-untyped-def]
    # Slow batches (100 ms) that grow with the load: a 50 ms deadline is refused at
    # arrival, with time to say so.
    return server_factory("--model", "sim", "--devices", "sim:1", "--sim-base-ms", "100",
                          "--sim-per-sample-ms", "1", "--latency-target-ms", "1000",
                          "--max-queue-delay-ms", "inf",
                          "--no-warmup", "--admin")


def failure(client: Client, model: str, inputs: dict[str, np.ndarray],
            timeout_s: float = 10.0) -> InferenceServerError:
    with pytest.raises(InferenceServerError) as caught:
        client.infer(model, inputs, timeout_s=timeout_s)
    return caught.value


def test_failures_are_the_same_exceptions_with_the_same_words(sim_server) -> None:  # type: ignore[no-untyped-def]
    with Client(sim_server.url) as grpc_client, \
            Client(f"http://{sim_server.http_url}") as http_client:
        grpc_client.infer("sim", {"x": X}, timeout_s=10)  # measured: refusals can be predicted
        for model, inputs, kind in (("nope", {"x": X}, ModelNotFoundError),
                                    ("sim", {"x": X.astype(np.float64)}, InvalidInputError),
                                    ("sim", {"y": X}, InvalidInputError)):
            over_grpc, over_http = failure(grpc_client, model, inputs), \
                failure(http_client, model, inputs)
            assert type(over_grpc) is type(over_http) is kind
            assert over_http.details == over_grpc.details
        # 100 ms of work cannot meet a 50 ms deadline: refused at arrival (HTTP: a 503)
        over_grpc = failure(grpc_client, "sim", {"x": X}, timeout_s=0.05)
        over_http = failure(http_client, "sim", {"x": X}, timeout_s=0.05)
        assert type(over_grpc) is type(over_http) is ServerOverloadedError
        assert over_http.http_status == 503


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(server_factory, pki: Pki, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text("s3cret-token-for-tests-0123456789\n")
    return server_factory("--model", "mlp", "--devices", "cpu", "--max-queue-delay-ms", "inf",
                          "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                          "--auth-token-file", str(token_file))


def test_https_with_the_token(tls_server, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    url = f"https://{tls_server.http_url}"
    with Client(url, credentials=Credentials(ca_file=pki.ca,
                                             token="s3cret-token-for-tests-0123456789")) as ok:
        assert ok.infer("mlp", {"x": X}, timeout_s=10)["y"].shape == (1, 256)
    with Client(url, credentials=Credentials(ca_file=pki.ca), retries=0) as no_token:
        assert no_token.server_ready()  # health stays open, as over gRPC
        with pytest.raises(AuthenticationError):
            no_token.infer("mlp", {"x": X}, timeout_s=10)


def test_loadtest_over_http_with_the_servers_view(sim_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "http"
    code = loadtest(["--url", f"http://{sim_server.http_url}", "--model", "sim",
                     "--concurrency", "4", "--duration-s", "1",
                     "--warmup-s", "0.3", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["protocol"] == "http"
    (point,) = results["points"]
    assert set(point["status_counts"]) == {"OK"} and point["status_counts"]["OK"] > 10
    assert point["server"]["is_evenflow"]
    assert {s["device"] for s in point["server"]["samples"]} == {"sim0"}
    assert sum(point["server"]["batch_size_counts"].values()) > 0
    out = tmp_path / "open"
    code = loadtest(["--url", sim_server.http_url, "--protocol", "http", "--model", "sim",
                     "--rate", "40", "--duration-s", "1", "--warmup-s", "0.2", "--out",
                     str(out)])
    assert code == 0
    (point,) = json.loads((out / "results.json").read_text())["points"]
    assert point["status_counts"].get("OK", 0) > 15


def test_a_scenario_over_http_with_its_admin_action_over_grpc(sim_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    scenario = tmp_path / "s.toml"
    scenario.write_text('duration_s = 1.5\n[[step]]\nat_s = 0\nrate = 40\n[[step]]\n'
                        'at_s = 0.5\naction = "set_device_speed"\ndevice = "sim0"\n'
                        'speed = 0.5\n[[step]]\nat_s = 1\nburst = 10\n')
    out = tmp_path / "scenario"
    code = loadtest(["--url", f"http://{sim_server.http_url}", "--grpc-url", sim_server.url,
                     "--model", "sim", "--scenario", str(scenario), "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["protocol"] == "http"
    (point,) = results["points"]
    events = [what for _, what in point["events"]]
    assert "sim0: speed 1 -> 0.5" in events and "burst of 10" in events
    assert point["status_counts"]["OK"] > 30
    assert point["server"]["is_evenflow"]


def test_the_slo_search_over_http(sim_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "slo"
    code = loadtest(["--url", f"http://{sim_server.http_url}", "--model", "sim", "--slo-ms",
                     "600", "--start-rate", "50", "--duration-s", "0.5", "--warmup-s", "0.1",
                     "--tolerance", "0.5", "--repeats", "1", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["protocol"] == "http"
    assert results["slo_search"]["goodput_per_s"] >= 50.0
    assert len(results["points"]) == len(results["slo_search"]["probes"])
