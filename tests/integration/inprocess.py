"""Start a real evenflow App on 127.0.0.1:0 inside the test's event loop."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator

from evenflow.balancer import BalancerConfig
from evenflow.server.config.server_config import ServerConfig
from evenflow.server.engine.app import App
from evenflow.server.models.repository import BuiltinOptions
from evenflow.server.models.spec import SimProfile
from tests.servers import server_mode_settings


@contextlib.asynccontextmanager
async def running_app(models: tuple[tuple[str, str], ...] = (("mlp", "mlp"),), *,
                      devices: str = "cpu", balancer: BalancerConfig | None = None,
                      sim_profile: SimProfile | None = None, max_message_bytes: int = 1 << 22,
                      admin: bool = False,
                      metrics_port: int | None = None, http_port: int | None = None,
                      **process_model: object) -> AsyncIterator[tuple[App, str]]:
    """``process_model`` (frontends, workers) overrides the test's server mode."""
    config = ServerConfig(
        host="127.0.0.1", port=0, models=models, devices=devices,
        max_message_bytes=max_message_bytes,
        # Admission by time off unless a test asks for it: a loaded CI machine would otherwise
        # refuse a burst that these tests need answered.
        balancer=balancer or BalancerConfig(max_wait_s=0.0, max_queue_delay_s=math.inf),
        builtins=BuiltinOptions(sim_profile=sim_profile or SimProfile()), admin=admin,
        metrics_port=metrics_port, http_port=http_port,
        **(server_mode_settings() | process_model))  # type: ignore[arg-type]
    app = App(config)
    port = await app.start()
    try:
        yield app, f"127.0.0.1:{port}"
    finally:
        await app.stop(grace_s=5.0)
