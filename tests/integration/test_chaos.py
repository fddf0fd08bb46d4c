"""Chaos: during a load run one sim device raises, one hangs, one slows 4x and one dies. Every
request gets exactly one answer, successes go on on the healthy replicas, and every device is
back in routing once it recovers."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest

from evenflow.loadtest.arrivals import Arrival, send_times_s
from evenflow.loadtest.runner import OK, RequestRecord, Target, mlp_like_request, open_loop
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc

# slow, timing: a subprocess server under load with faults injected, timed.
pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.timeout(120)]
RATE_PER_S, SECONDS, FAULT_AT_S, RECOVER_AT_S = 150.0, 8.0, 2.0, 4.0


async def stats(channel: grpc.aio.Channel) -> dict[str, ef.ReplicaStats]:
    response = await ef_grpc.EvenflowStatsStub(channel).GetStats(
        ef.GetStatsRequest(model_name="sim"))
    return {r.devices[0]: r for r in response.models[0].replicas}


async def test_raise_hang_slow_and_die_during_load(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory("--model", "sim", "--devices", "sim:1,sim:1,sim:1,sim:1",
                            "--sim-base-ms", "5", "--sim-per-sample-ms", "1", "--admin",
                            "--watchdog-s", "0.5", "--latency-target-ms", "2000",
                            "--max-queue-delay-ms", "inf")
    target = Target(server.url, mlp_like_request("sim", "x", [1, 256]), timeout_s=20.0)
    records: list[RequestRecord] = []
    async with grpc.aio.insecure_channel(server.url) as channel:
        admin = ef_grpc.EvenflowAdminStub(channel)

        async def chaos() -> tuple[dict[str, ef.ReplicaStats], dict[str, ef.ReplicaStats]]:
            await asyncio.sleep(FAULT_AT_S)  # a timeline inside the load run, not a sync wait
            await admin.SetDeviceFault(ef.SetDeviceFaultRequest(device="sim0", fault="raise",
                                                                count=3))
            await admin.SetDeviceFault(ef.SetDeviceFaultRequest(device="sim1", fault="hang"))
            await admin.SetDeviceSpeed(ef.SetDeviceSpeedRequest(device="sim2", speed=0.25))
            await admin.SetDeviceFault(ef.SetDeviceFaultRequest(device="sim3", fault="die"))
            await asyncio.sleep(RECOVER_AT_S - FAULT_AT_S)
            await admin.SetDeviceSpeed(ef.SetDeviceSpeedRequest(device="sim2", speed=1.0))
            await admin.SetDeviceFault(ef.SetDeviceFaultRequest(device="sim1", fault="clear"))
            recovered = await stats(channel)
            # Poll until every replica is healthy and has run batches since; the assertions
            # below name the device that did not (30 s, well past the load run).
            deadline_s = asyncio.get_running_loop().time() + 30.0
            while True:
                final = await stats(channel)
                if all(r.healthy and r.num_batches > recovered[d].num_batches
                       for d, r in final.items()) \
                        or asyncio.get_running_loop().time() > deadline_s:
                    return recovered, final
                await asyncio.sleep(0.1)  # the poll's interval, not a wait for the state

        chaos_task = asyncio.create_task(chaos())
        _, dropped = await open_loop(
            target, send_times_s(Arrival.parse("poisson"), RATE_PER_S, SECONDS, 7),
            records=records)
        recovered, final = await chaos_task
    await target.close()
    sent = len(send_times_s(Arrival.parse("poisson"), RATE_PER_S, SECONDS, 7))
    answers = Counter(r.status for r in records)
    assert dropped == 0 and sum(answers.values()) == sent  # exactly one answer each
    assert set(answers) <= {OK, "INTERNAL", "UNAVAILABLE"}, answers
    assert 1 <= answers["INTERNAL"] <= 3 * 64  # the raised batches, and only those
    start_s = min(r.intended_s for r in records)
    late = [r for r in records if r.intended_s - start_s > RECOVER_AT_S + 1.0]
    assert late and all(r.status == OK for r in late)  # successes after recovery
    assert final["sim1"].restarts >= 1 and final["sim3"].restarts >= 1  # hung, died
    for device, replica in final.items():  # every device back in routing, and used again
        assert replica.healthy, device
        assert replica.num_batches > recovered[device].num_batches, device
