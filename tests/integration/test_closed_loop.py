"""A closed loop (clients that wait for their answers) against ``evenflow serve`` with no
admission flags is queued, not refused: 128 clients on ``mlp`` on the CPU and on four uneven sim
devices, from a cold start, in every server mode."""

from __future__ import annotations

import pytest

from tests.integration.load import Load

# slow, timing: subprocess servers under 128 clients; admission by time.
pytestmark = [pytest.mark.slow, pytest.mark.timing,
              pytest.mark.timeout(120), pytest.mark.usefixtures("server_mode")]

CLIENTS = 128
SERVERS = {
    "mlp": ("--model", "mlp", "--devices", "cpu"),
    "sim": ("--model", "sim", "--devices", "sim:1,sim:1,sim:0.5,sim:0.25"),
}


@pytest.mark.parametrize("model", list(SERVERS))
async def test_a_closed_loop_of_128_clients_sees_no_refusal(server_factory, model: str) -> None:
    server = server_factory(*SERVERS[model])
    async with Load(server.url, CLIENTS, model) as load:
        # Ten answers a client on average: the cold start, the first bursts and steady state.
        await load.until(lambda: sum(load.ok.values()) >= 10 * CLIENTS or bool(load.errors),
                         timeout_s=90)
    assert load.errors == []
    assert load.answered()
    assert all(load.ok[i] for i in range(CLIENTS))  # every client was served
