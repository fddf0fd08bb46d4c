"""Real evenflow servers for integration tests: the process models a test module runs in
(``SERVER_MODES``) and ``evenflow serve`` started as a subprocess on port 0."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.harness import wait_for_line

TESTS_DIR = Path(__file__).resolve().parent

# The process models the integration suite runs in (``server_mode``): CLI flags and the
# matching ServerConfig fields.
SERVER_MODES: dict[str, dict[str, object]] = {
    "single": {},
    "frontends": {"frontends": 2},
    "process-workers": {"workers": "process"},
    "frontends+process-workers": {"frontends": 2, "workers": "process"},
}
# The mode the current test module runs in; the ``server_mode`` fixture switches it.
_mode = ["single"]


@contextlib.contextmanager
def serving_in(mode: str) -> Iterator[str]:
    """Servers started meanwhile (``start_server``, ``running_app``) run in ``mode``."""
    if mode not in SERVER_MODES:
        raise ValueError(f"unknown server mode {mode!r}; expected one of {list(SERVER_MODES)}")
    _mode[0] = mode
    try:
        yield mode
    finally:
        _mode[0] = "single"


def server_mode_settings() -> dict[str, object]:
    """The ServerConfig fields of the mode the current test runs in."""
    return dict(SERVER_MODES[_mode[0]])


def server_mode_args() -> list[str]:
    """The same as CLI flags."""
    return [arg for key, value in server_mode_settings().items()
            for arg in (f"--{key}", str(value))]


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    log_path: Path
    banner: tuple[str, ...] = ()  # what the server printed before its address line

    def log(self) -> str:
        return self.log_path.read_text()

    @property
    def http_url(self) -> str:
        """HOST:PORT of the server's HTTP port (``evenflow http on http://HOST:PORT``)."""
        for line in self.banner:
            if line.startswith("evenflow http on http://"):
                return line.split("http://", 1)[1].split()[0]
        raise AssertionError(f"the server printed no HTTP address: {self.banner}")

    def stop(self) -> None:
        """Ask it to shut down (one SIGTERM: a second one would cut its grace short)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """``stop``, then its exit code once it has exited."""
        self.stop()
        return self.exited(timeout_s)

    def exited(self, timeout_s: float = 30.0) -> int:
        """The exit code, once the process (already stopped) has exited."""
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
    """Start ``evenflow serve --port 0 --http-port 0 ARGS`` and wait for the line with its bound
    address."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(TESTS_DIR.parent), os.environ.get("PYTHONPATH", "")) if p))
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "evenflow.server.config.cli", "serve", "--port", "0",
         "--http-port", "0", *args, *server_mode_args()],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    log.close()
    assert proc.stdout is not None
    line, banner = wait_for_line(proc, "evenflow listening on ", timeout_s)
    if line is not None:
        return ServerProcess(proc, line.split()[-1], log_path, tuple(banner))
    proc.kill()
    proc.wait()
    raise RuntimeError(f"server did not start: {log_path.read_text()[-3000:]}")


def perf_analyzer_command() -> list[str] | None:
    """``EVENFLOW_PERF_ANALYZER``, else what ``scripts/setup.sh --perf-analyzer`` installed, else
    one on the PATH."""
    installed = TESTS_DIR.parent / ".tools" / "bin" / "perf_analyzer"
    for binary in (os.environ.get("EVENFLOW_PERF_ANALYZER"), str(installed),
                   shutil.which("perf_analyzer")):
        if binary and Path(binary).exists():
            return [binary]
    return None


def perf_analyzer_runs_at(concurrency: int, args: Sequence[str], timeout_s: float) -> str:
    """perf_analyzer ``args`` at one ``concurrency``: a short run whose stability window is wide
    (-s 400, the last three windows within 4x), as the tests check that it runs to the end (no
    stop at a refusal or an error), not the numbers. Its output; skips the test where
    perf_analyzer is not installed."""
    command = perf_analyzer_command()
    if command is None:
        pytest.skip("perf_analyzer not found (set EVENFLOW_PERF_ANALYZER; see README)")
    run = subprocess.run(
        [*command, *args, "--concurrency-range", f"{concurrency}:{concurrency}",
         "--measurement-interval", "500", "-s", "400", "-r", "6"],
        check=False, capture_output=True, text=True, timeout=timeout_s)
    assert run.returncode == 0, (f"concurrency {concurrency}: " + run.stdout[-3000:]
                                 + run.stderr[-3000:])
    assert f"Concurrency: {concurrency}, throughput" in run.stdout
    return run.stdout
