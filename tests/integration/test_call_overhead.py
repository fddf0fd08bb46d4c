"""``benchmarks.call_overhead`` splits a sequential call's time into the server's share and
what is outside it: the known delay of an echo, or evenflow's own success time."""

from __future__ import annotations

import pytest

from benchmarks.call_overhead import MODEL, one_at_a_time
from benchmarks.echo_server import DeferredEchoServicer, build_server, make_servicer

pytestmark = pytest.mark.timeout(60)

_DELAY_S = 0.02


@pytest.mark.parametrize("defer", ["none", "thread"])
async def test_an_echo_calls_share_is_its_delay(defer: str) -> None:
    servicer = make_servicer(defer, _DELAY_S)
    server, port = build_server(servicer, "127.0.0.1", 0)
    await server.start()
    try:
        calls = await one_at_a_time(f"127.0.0.1:{port}", calls=5, warmup_calls=1,
                                    delay_s=_DELAY_S)
    finally:
        await server.stop(None)
        if isinstance(servicer, DeferredEchoServicer):
            servicer.close()
    # The measured calls hold the server's delay (a loop timer may fire a little early) ...
    assert calls.mean_ms >= _DELAY_S * 1e3 - 1
    assert calls.p50_ms >= _DELAY_S * 1e3 - 1
    # ... and what is left outside it is the transport's share: a generous bound, not a figure
    # (benchmarks.call_overhead reports it).
    assert calls.outside_ms < 1000.0


@pytest.mark.slow
async def test_evenflows_share_is_its_success_time(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory("--model", f"{MODEL}=sim", "--devices", "sim:1",
                            "--sim-base-ms", "20", "--sim-per-sample-ms", "0")
    calls = await one_at_a_time(server.url, calls=5, warmup_calls=1, delay_s=None)
    # The sim model's 20 ms are inside the success time, and the call holds it.
    assert 19 <= calls.server_ms < calls.mean_ms
