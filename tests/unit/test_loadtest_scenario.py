"""Scenario runs: admin actions carry the load's credentials and a refused one is an event, not
the run's end; each step starts on the timeline whatever the steps before it still have in
flight, and the run stops by itself even when requests never come back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from evenflow.client.credentials import Credentials
from evenflow.loadtest.runner import OK
from evenflow.loadtest.scenario import Scenario, Step, run_scenario
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc

TOKEN = "s3cret"


class FakeAdmin(ef_grpc.EvenflowAdminServicer):
    """Answers SetDeviceSpeed only with the bearer token, as a server with --auth-token-file."""

    def __init__(self) -> None:
        self.speeds: list[tuple[str, float]] = []

    async def SetDeviceSpeed(
            self, request: ef.SetDeviceSpeedRequest,
            context: grpc.aio.ServicerContext) -> ef.SetDeviceSpeedResponse:
        if ("authorization", f"Bearer {TOKEN}") not in (context.invocation_metadata() or ()):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
        self.speeds.append((request.device, request.speed))
        return ef.SetDeviceSpeedResponse(previous_speed=1.0)


class FakeTarget:
    """A LoadTarget; with ``gate``, every send waits until the gate opens."""

    def __init__(self, url: str = "127.0.0.1:1", *, timeout_s: float = 5.0,
                 gate: asyncio.Event | None = None, full_at: int = 0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.gate = gate
        self.in_flight = 0
        self.full_at = full_at
        self.full = asyncio.Event()  # ``full_at`` sends in flight at once
        self.cancelled = 0

    async def send(self, index: int) -> str:
        self.in_flight += 1
        if self.in_flight == self.full_at:
            self.full.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)  # an answer is never instant: let the loop turn
            return OK
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1

    async def close(self) -> None:
        pass


@pytest.fixture
async def admin() -> AsyncIterator[tuple[FakeAdmin, str]]:
    servicer = FakeAdmin()
    server = grpc.aio.server()
    ef_grpc.add_EvenflowAdminServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


SLOWDOWN = Scenario("slowdown", 0.2, (
    Step(0.0, rate=20, arrival="constant"),
    Step(0.0, action="set_device_speed", args={"device": "sim0", "speed": 0.25})))


async def test_admin_actions_carry_the_loads_token(admin: tuple[FakeAdmin, str]) -> None:
    servicer, url = admin
    records, events, _ = await run_scenario(SLOWDOWN, FakeTarget(url), seed=0,
                                            credentials=Credentials(token=TOKEN))
    assert servicer.speeds == [("sim0", 0.25)]
    assert "sim0: speed 1 -> 0.25" in [what for _, what in events]
    assert records and all(r.status == OK for r in records)


async def test_a_refused_action_is_an_event_and_the_run_goes_on(
        admin: tuple[FakeAdmin, str]) -> None:
    servicer, url = admin
    records, events, _ = await run_scenario(SLOWDOWN, FakeTarget(url), seed=0,
                                            credentials=Credentials(token="wrong"))
    assert servicer.speeds == []
    assert any(what.startswith("set_device_speed failed: UNAUTHENTICATED")
               for _, what in events)
    assert records and all(r.status == OK for r in records)


async def test_a_step_starts_on_schedule_while_earlier_requests_are_outstanding() -> None:
    gate = asyncio.Event()
    # The rate step's one request (sent at 0.1 s) is held; the concurrency step at 0.2 s
    # must start anyway, so its two requests join it in flight.
    target = FakeTarget(gate=gate, full_at=3)
    scenario = Scenario("overload", 0.3, (Step(0.0, rate=10, arrival="constant"),
                                          Step(0.2, concurrency=2)))
    run = asyncio.create_task(run_scenario(scenario, target, seed=0))
    try:
        await asyncio.wait_for(target.full.wait(), timeout=3.0)
    finally:
        gate.set()
        records, events, start_s = await run
    started = dict((what, t_s) for t_s, what in events)
    assert 0.2 <= started["concurrency 2"] < 0.6
    assert all(r.status == OK for r in records)
    assert any(r.intended_s - start_s < 0.2 for r in records)  # the held rate-step request
    assert sum(r.intended_s - start_s >= 0.2 for r in records) >= 2


async def test_a_scenario_stops_by_itself_when_requests_never_return() -> None:
    target = FakeTarget(timeout_s=0.1, gate=asyncio.Event())  # ignores its own timeout
    scenario = Scenario("stuck", 0.2, (Step(0.0, rate=20, arrival="constant"),
                                       Step(0.1, burst=3)))
    records, events, _ = await asyncio.wait_for(run_scenario(scenario, target, seed=0),
                                                timeout=4.0)
    assert records == []
    assert [what for _, what in events] == ["rate 20/s constant", "burst of 3"]
    assert target.in_flight == 0 and target.cancelled >= 3  # stopped and waited for
