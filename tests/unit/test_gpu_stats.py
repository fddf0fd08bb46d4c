"""The stats RPC's GPU rows: a field NVML cannot read on a GPU is named as such, so that the
devices page shows it as n/a rather than an idle 0; a reading kept while NVML is stuck is
marked stale."""

from __future__ import annotations

from typing import Any, cast

import pytest

from evenflow.proto import evenflow_pb2 as ef
from evenflow.server.engine.served import ModelTable
from evenflow.server.engine.stats_service import StatsServicer
from evenflow.server.observability.telemetry import GpuSample

pytestmark = pytest.mark.timeout(10)


async def test_a_field_nvml_cannot_read_is_named_beside_its_zero() -> None:
    mig = GpuSample("cuda0", 0.0, 5 * 2**30, 10 * 2**30, 0, 0, 61,
                    unsupported=frozenset({"utilization", "sm_clock_mhz"}))
    whole = GpuSample("cuda1", 0.5, 1, 2, 1410, 0, 55, stale=True)
    servicer = StatsServicer(models=ModelTable(), gpu_samples=lambda: [mig, whole])
    response = await servicer.GetStats(ef.GetStatsRequest(), cast(Any, None))
    first, second = response.devices
    assert list(first.unsupported) == ["sm_clock_mhz", "utilization"]
    assert (first.temperature_c, list(second.unsupported)) == (61, [])
    assert (first.stale, second.stale) == (False, True)
