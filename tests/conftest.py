"""Shared fixtures: real servers, in each process model, for integration tests (the helpers
behind them live in ``tests.servers``; unit tests' fakes in ``tests.fakes``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.servers import SERVER_MODES, ServerProcess, serving_in, start_server

# Every mode but the single process starts front-end or worker processes: slow.
_MODE_PARAMS = [mode if mode == "single" else pytest.param(mode, marks=pytest.mark.slow)
                for mode in SERVER_MODES]


@pytest.fixture(scope="module", params=_MODE_PARAMS)
def server_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the module's tests once per process model (opt in with
    ``pytestmark = pytest.mark.usefixtures("server_mode")``)."""
    with serving_in(request.param) as mode:
        yield mode


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Callable[..., ServerProcess]]:
    """Starts servers for a test module; each is SIGTERMed at the end and must exit 0."""
    servers: list[ServerProcess] = []

    def factory(*args: str) -> ServerProcess:
        log_path: Path = tmp_path_factory.mktemp("server") / "server.log"
        server = start_server(args, log_path)
        servers.append(server)
        return server

    yield factory
    for server in servers:  # all at once: each shutdown waits out its own drain
        server.stop()
    codes = [server.exited() for server in servers]  # every one reaped before any assert
    for server, code in zip(servers, codes, strict=True):
        assert code == 0, server.log()[-3000:]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.gpu`` tests skip cleanly where CUDA is absent."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module", params=["single", "frontends"])
def types_server(request: pytest.FixtureRequest,
                 server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """A server of ``tests.fixture_models:every_type`` (an input and an output of each
    datatype), in one process and behind front-ends: what each protocol must carry bit for
    bit."""
    with serving_in(request.param):
        return server_factory("--model", "types=tests.fixture_models:every_type",
                              "--devices", "cpu", "--max-wait-ms", "0",
                              "--max-queue-delay-ms", "inf", "--no-warmup")
