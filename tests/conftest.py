"""Shared fixtures: fake clock and workers for unit tests; real servers for integration tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from benchmarks.harness import wait_for_line
from evenflow.balancer import BatchResult, BatchTiming, Job, SingleDeviceWorker

TESTS_DIR = Path(__file__).resolve().parent


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass
class FakeWorker(SingleDeviceWorker):
    """A worker whose batches cost ``base_s + per_sample_s * samples`` (reported, not slept).

    With ``gated`` set, each batch waits until the test calls ``release()``, so a test controls
    exactly when batches finish. Every batch is recorded; ``fail_with`` makes the next batch raise.
    """

    name: str
    base_s: float = 0.01
    per_sample_s: float = 0.001
    gated: bool = False
    devices: Sequence[str] = ()
    batches: list[list[int]] = field(default_factory=list)
    fail_with: list[BaseException] = field(default_factory=list)
    closed: bool = False
    restarted: int = 0
    _gates: list[asyncio.Future[None]] = field(default_factory=list)
    started: asyncio.Event | None = None

    def __post_init__(self) -> None:
        self.devices = self.devices or (self.name,)

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        self.batches.append([job.num_samples for job in jobs])
        if self.started is not None:
            self.started.set()
        if self.gated:
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._gates.append(gate)
            await gate
        if self.fail_with:
            raise self.fail_with.pop(0)
        samples = sum(job.num_samples for job in jobs)
        cost_s = self.base_s + self.per_sample_s * samples
        return BatchResult([("out", job.payload) for job in jobs], BatchTiming(0.0, cost_s, 0.0))

    def release(self) -> None:
        self._gates = [g for g in self._gates if not g.done()]  # cancelled: the run went away
        gate = self._gates.pop(0)
        gate.set_result(None)

    @property
    def num_waiting(self) -> int:
        return sum(1 for gate in self._gates if not gate.done())

    async def restart(self) -> None:
        self.restarted += 1

    async def close(self) -> None:
        self.closed = True


# The process models the integration suite runs in (``server_mode``): CLI flags and the
# matching ServerConfig fields.
SERVER_MODES: dict[str, dict[str, object]] = {
    "single": {},
    "frontends": {"frontends": 2},
    "process-workers": {"workers": "process"},
    "frontends+process-workers": {"frontends": 2, "workers": "process"},
}
_mode = ["single"]


def server_mode_settings() -> dict[str, object]:
    """The ServerConfig fields of the mode the current test runs in."""
    return dict(SERVER_MODES[_mode[0]])


def server_mode_args() -> list[str]:
    return [arg for key, value in server_mode_settings().items()
            for arg in (f"--{key}", str(value))]


@pytest.fixture(scope="module", params=list(SERVER_MODES))
def server_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the module's tests once per process model (opt in with
    ``pytestmark = pytest.mark.usefixtures("server_mode")``)."""
    _mode[0] = request.param
    yield request.param
    _mode[0] = "single"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    log_path: Path
    banner: tuple[str, ...] = ()  # what the server printed before its address line

    def log(self) -> str:
        return self.log_path.read_text()

    def terminate(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def start_server(args: Sequence[str], log_path: Path, timeout_s: float = 60.0) -> ServerProcess:
    """Start ``evenflow serve --port 0 ARGS`` and wait for the line with its bound address."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(TESTS_DIR.parent), os.environ.get("PYTHONPATH", "")) if p))
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "evenflow.server.config.cli", "serve", "--port", "0", *args,
         *server_mode_args()],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    log.close()
    assert proc.stdout is not None
    line, banner = wait_for_line(proc, "evenflow listening on ", timeout_s)
    if line is not None:
        return ServerProcess(proc, line.split()[-1], log_path, tuple(banner))
    proc.kill()
    proc.wait()
    raise RuntimeError(f"server did not start: {log_path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Starts servers for a test module; each is SIGTERMed at the end and must exit 0."""
    servers: list[ServerProcess] = []

    def factory(*args: str) -> ServerProcess:
        log_path = tmp_path_factory.mktemp("server") / "server.log"
        server = start_server(args, log_path)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        code = server.terminate()
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
