"""A closed loop (clients that wait for their answers) against ``evenflow serve`` with no
admission flags is queued, not refused: 128 clients on ``mlp`` on the CPU and on four uneven sim
devices, from a cold start, in every server mode; then perf_analyzer's closed loop, which stops
at its first refusal, against the same server."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.integration.load import Load
from tests.servers import ServerProcess, perf_analyzer_runs_at

# slow, timing: subprocess servers under 128 clients; admission by time.
pytestmark = [pytest.mark.slow, pytest.mark.timing,
              pytest.mark.timeout(120), pytest.mark.usefixtures("server_mode")]

CLIENTS = 128
# Served with no admission flags: the defaults must queue a closed loop, not refuse it.
SERVERS = {
    "mlp": ("--model", "mlp", "--devices", "cpu"),
    "sim": ("--model", "sim", "--devices", "sim:1,sim:1,sim:0.5,sim:0.25"),
}


@pytest.fixture(scope="module", params=list(SERVERS))
def served(request: pytest.FixtureRequest, server_mode: str,
           server_factory: Callable[..., ServerProcess]) -> tuple[str, ServerProcess]:
    """The model and its server in ``server_mode`` (asked for, so that each mode gets a server
    of its own), shared by this module's tests (the closed loop first: its server starts
    cold)."""
    return request.param, server_factory(*SERVERS[request.param])


async def test_a_closed_loop_of_128_clients_sees_no_refusal(
        served: tuple[str, ServerProcess]) -> None:
    model, server = served
    async with Load(server.url, CLIENTS, model) as load:
        # Ten answers a client on average: the cold start, the first bursts and steady state.
        await load.until(lambda: sum(load.ok.values()) >= 10 * CLIENTS or bool(load.errors),
                         timeout_s=90)
    assert load.errors == []
    assert load.answered()
    assert all(load.ok[i] for i in range(CLIENTS))  # every client was served


@pytest.mark.perf_analyzer
@pytest.mark.timeout(150)
def test_perf_analyzer_runs_to_the_end_against_default_admission(
        served: tuple[str, ServerProcess]) -> None:
    """Each concurrency a separate short run, none stopped by a refusal."""
    model, server = served
    for concurrency in (1, 32, 128):  # its default, then past the balancer's batch sizes
        perf_analyzer_runs_at(concurrency, ["-i", "grpc", "-u", server.url, "-m", model,
                                            "--shape", "x:256"], timeout_s=30)
