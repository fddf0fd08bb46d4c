"""The Grafana dashboard in deploy/ queries only metrics evenflow exports."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest

from evenflow.client import AsyncClient, InvalidInputError
from evenflow.server.models.spec import SimProfile
from evenflow.server.observability.metrics import GPU_METRIC_NAMES, PLACEMENT_METRIC_NAMES
from tests.integration.inprocess import running_app
from tests.integration.test_metrics import http, parse

pytestmark = pytest.mark.timeout(60)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "evenflow-dashboard.json"
_METRIC = re.compile(r"\b((?:nv|evenflow)_[a-z0-9_]+)")


def queried_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"]
             for target in panel.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    return {name for expr in exprs for name in _METRIC.findall(expr)}


def test_the_dashboard_is_importable_as_is() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


async def test_every_metric_the_dashboard_queries_is_exported() -> None:
    queried = queried_metrics()
    assert len(queried) >= 15, queried
    async with running_app((("sim", "sim"),), devices="sim:1,sim:0.5",
                           sim_profile=SimProfile(1.0, 0.1), metrics_port=0) as (app, url), \
            AsyncClient(url) as client:
        x = np.ones((1, 256), np.float32)
        await asyncio.gather(*(client.infer("sim", {"x": x}) for _ in range(8)))
        with pytest.raises(InvalidInputError):  # failures by code appear once there is one
            await client.infer("sim", {"x": np.ones((1, 3), np.float32)})
        status, _, body = await http(app.metrics_port, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert status == 200
    exported = set(parse(body.decode()))
    # GPU metrics need NVML; placement ones --placement auto (tests/unit/test_placement_stats.py
    # renders them from a placer's snapshot).
    missing = {name for name in queried if name not in exported
               and name not in GPU_METRIC_NAMES | PLACEMENT_METRIC_NAMES}
    assert missing == set()
