"""Scenario files (TOML): a timeline of load levels, bursts and admin actions.

    name = "device slows mid-run"
    duration_s = 12
    [[step]]
    at_s = 0
    rate = 300              # or: concurrency = 32
    arrival = "poisson"     # optional, open loop only
    [[step]]
    at_s = 4
    action = "set_device_speed"   # evenflow admin RPC (server started with --admin)
    device = "sim0"
    speed = 0.25
    [[step]]
    at_s = 8
    burst = 200             # this many requests at once, on top of the running load

A load step holds until the next load step (or the end); each step starts at its ``at_s``
whatever earlier steps still have in flight. Every request is recorded, so the result is a
timeline: throughput and p99 per bin, and the server's per-device view.
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from evenflow.client.credentials import Credentials, aio_channel
from evenflow.loadtest.arrivals import Arrival, send_times_s
from evenflow.loadtest.runner import LoadTarget, RequestRecord, closed_loop, open_loop
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc


@dataclass(frozen=True)
class Step:
    at_s: float
    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "poisson"
    burst: int = 0
    action: str | None = None
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def is_load(self) -> bool:
        return self.concurrency is not None or self.rate is not None


@dataclass(frozen=True)
class Scenario:
    name: str
    duration_s: float
    steps: tuple[Step, ...]

    @property
    def load_steps(self) -> list[Step]:
        return [s for s in self.steps if s.is_load]

    @property
    def has_actions(self) -> bool:
        return any(s.action is not None for s in self.steps)


_ACTIONS = ("set_device_speed",)


def load_scenario(path: Path) -> Scenario:
    data = tomllib.loads(path.read_text())
    steps = []
    for entry in data.get("step", []):
        raw = dict(entry)
        at_s = float(raw.pop("at_s"))
        concurrency = raw.pop("concurrency", None)
        rate = raw.pop("rate", None)
        arrival = raw.pop("arrival", "poisson")
        burst = int(raw.pop("burst", 0))
        action = raw.pop("action", None)
        if action is not None and action not in _ACTIONS:
            raise ValueError(f"{path}: unknown action {action!r}; known: {_ACTIONS}")
        if concurrency is not None and rate is not None:
            raise ValueError(f"{path}: a step sets concurrency or rate, not both")
        Arrival.parse(arrival)
        steps.append(Step(at_s, concurrency, rate, arrival, burst, action, raw))
    steps.sort(key=lambda s: s.at_s)
    scenario = Scenario(str(data.get("name", path.stem)), float(data["duration_s"]), tuple(steps))
    if not scenario.load_steps or scenario.load_steps[0].at_s != 0:
        raise ValueError(f"{path}: the first step (at_s = 0) must set a load")
    return scenario


async def _act(url: str, step: Step, credentials: Credentials | None) -> str:
    """Send one admin action with the load's own credentials (TLS, token); what it did, or
    why it failed: a refused action is an event of the run, not its end."""
    async with aio_channel(url, [], credentials) as channel:
        metadata = credentials.metadata if credentials is not None else None
        try:
            if step.action == "set_device_speed":
                response = await ef_grpc.EvenflowAdminStub(channel).SetDeviceSpeed(
                    ef.SetDeviceSpeedRequest(device=str(step.args["device"]),
                                             speed=float(step.args["speed"])),
                    timeout=5, metadata=metadata)
                return (f"{step.args['device']}: speed {response.previous_speed:g} -> "
                        f"{float(step.args['speed']):g}")
        except grpc.aio.AioRpcError as exc:
            return f"{step.action} failed: {exc.code().name}: {exc.details()}"
    raise AssertionError(step.action)


async def run_scenario(scenario: Scenario, target: LoadTarget, seed: int,
                       admin_url: str | None = None, credentials: Credentials | None = None
                       ) -> tuple[list[RequestRecord], list[tuple[float, str]], float]:
    """Run the timeline; returns every request, the events (time, what) and the start time.
    Admin actions go over gRPC to ``admin_url`` (default: the target's, a gRPC target), with
    ``credentials`` (the load's).

    Every step starts on the timeline, whatever the steps before it still have in flight: each
    runs in the background and its requests are collected at the end, each bounded by the
    target's timeout (a step that waited for them would start late, or not at all, under
    overload: the very moments a scenario is for)."""
    if admin_url is None and scenario.has_actions and "://" in target.url:  # an HTTP target
        raise ValueError(f"{target.url}: a scenario's admin actions need the server's gRPC "
                         "address (--grpc-url)")
    start_s = time.monotonic()
    records: list[RequestRecord] = []
    events: list[tuple[float, str]] = []
    running: list[asyncio.Task[Any]] = []  # every step's load, awaited at the end

    async def at(offset_s: float) -> None:
        delay_s = start_s + offset_s - time.monotonic()
        if delay_s > 0:
            await asyncio.sleep(delay_s)  # the scenario's own timeline

    def event(what: str) -> None:
        events.append((time.monotonic() - start_s, what))

    async def side_steps() -> None:
        for step in scenario.steps:
            if step.action is None and not step.burst:
                continue
            await at(step.at_s)
            if step.action is not None:
                event(await _act(admin_url or target.url, step, credentials))
            if step.burst:
                event(f"burst of {step.burst}")
                running.append(asyncio.create_task(
                    open_loop(target, [0.0] * step.burst, start_s=start_s + step.at_s,
                              records=records)))

    async def load() -> None:
        loads = scenario.load_steps
        for index, step in enumerate(loads):
            end_s = loads[index + 1].at_s if index + 1 < len(loads) else scenario.duration_s
            await at(step.at_s)
            label = (f"concurrency {step.concurrency}" if step.concurrency is not None
                     else f"rate {step.rate:g}/s {step.arrival}")
            event(label)
            if step.concurrency is not None:
                running.append(asyncio.create_task(closed_loop(
                    target, concurrency=step.concurrency,
                    duration_s=max(0.0, start_s + end_s - time.monotonic()), records=records)))
            else:
                assert step.rate is not None
                # On the timeline: requests meant before a late start go at once, their
                # latency counted from when they were meant to go.
                offsets = send_times_s(Arrival.parse(step.arrival), step.rate,
                                       end_s - step.at_s, seed + index)
                running.append(asyncio.create_task(
                    open_loop(target, offsets, start_s=start_s + step.at_s, records=records)))

    try:
        await asyncio.gather(load(), side_steps())
        # Every request is bounded by the target's timeout; the grace covers the loop's own
        # turns. A step still running past it is stopped, its unanswered requests unrecorded.
        if running:
            await asyncio.wait(running, timeout=target.timeout_s + 1.0)
    finally:
        for task in running:
            task.cancel()
        outcomes = await asyncio.gather(*running, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, Exception):  # a step's own failure, not the stop above
            raise outcome
    return records, events, start_s
