"""Model control: models from a configuration file, loaded and unloaded while others serve."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from evenflow.balancer import BalancerConfig
from evenflow.client import AsyncClient, ModelNotFoundError
from evenflow.server.config.server_config import ModelConfig, ServerConfig
from evenflow.server.engine.app import App
from evenflow.server.models.repository import BuiltinOptions
from evenflow.server.models.spec import SimProfile
from tests.servers import TESTS_DIR

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[devices]
list = ["sim:1", "sim:0.5"]

[builtins]
sim_base_ms = 2
sim_per_sample_ms = 0.2

[balancing]
max_wait_ms = 1

[models.stays]
source = "sim"

[models.goes]
source = "sim"
max_batch = 8

[models.later]
source = "sim"
load = false
"""


@pytest.mark.slow  # a subprocess server and a tritonclient probe process
@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_load_and_unload_with_tritonclient_while_another_model_serves(
        server_factory, tmp_path: Path, protocol: str) -> None:  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("tritonclient") is None:
        pytest.skip("tritonclient is not installed")
    config = tmp_path / "evenflow.toml"
    config.write_text(CONFIG)
    server = server_factory("--config", str(config))
    x = np.arange(256, dtype=np.float32).reshape(1, 256)
    done = asyncio.Event()
    answers: list[bool] = []

    async def keep_calling(client: AsyncClient) -> None:
        while not done.is_set():
            y = (await client.infer("stays", {"x": x}, timeout_s=10.0))["y"]
            answers.append(bool(np.array_equal(y, x)))

    async with AsyncClient(server.url) as client:
        callers = [asyncio.create_task(keep_calling(client)) for _ in range(4)]
        probe = await asyncio.create_subprocess_exec(
            sys.executable, str(TESTS_DIR / "model_control_probe.py"),
            server.http_url if protocol == "http" else server.url, protocol,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await asyncio.wait_for(probe.communicate(), timeout=90)
        done.set()
        await asyncio.gather(*callers)  # a failed call on "stays" raises here
    assert probe.returncode == 0, output.decode()[-3000:]
    assert f"model control probe ({protocol}): ok" in output.decode()
    assert answers and all(answers), f"{answers.count(False)} wrong of {len(answers)}"


async def test_unload_finishes_admitted_requests_first() -> None:
    config = ServerConfig(http_port=None,
        port=0, devices="sim:1", builtins=BuiltinOptions(sim_profile=SimProfile(200.0, 1.0)),
        balancer=BalancerConfig(max_wait_s=0.0, max_batch=4),
        models=(ModelConfig("slow", "sim"),))
    app = App(config)
    port = await app.start()
    try:
        assert app.manager is not None
        x = np.ones((1, 256), np.float32)
        balancer = app.models.get("slow").balancer
        admitted = [balancer.submit([x], 1) for _ in range(12)]  # 3 batches of 4 to run
        await app.manager.unload("slow")
        assert all(f.done() for f in admitted)  # unload returned only after they finished
        for future in admitted:
            np.testing.assert_array_equal(future.result()[0], x)
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            with pytest.raises(ModelNotFoundError):
                await client.infer("slow", {"x": x}, timeout_s=10.0)
    finally:
        await app.stop(grace_s=5.0)


async def test_a_model_not_loaded_at_start_is_known_but_not_served() -> None:
    config = ServerConfig(http_port=None, port=0, devices="sim:1",
                          models=(ModelConfig("now", "sim"),
                                  ModelConfig("later", "sim", load_at_start=False)))
    app = App(config)
    await app.start()
    try:
        assert app.manager is not None
        assert [(n, e.state.value) for n, e in app.manager.index()] == [
            ("later", "UNAVAILABLE"), ("now", "READY")]
        assert "later" not in app.models
        await app.manager.load("later")
        assert "later" in app.models
    finally:
        await app.stop(grace_s=5.0)
