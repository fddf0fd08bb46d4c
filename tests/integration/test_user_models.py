"""User models from --model: a TorchScript file with its JSON spec, and bad sources."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from evenflow.client import AsyncClient
from evenflow.server.models.repository import BuiltinOptions, load_definition, parse_model_arg
from tests.integration.inprocess import running_app

pytestmark = pytest.mark.timeout(60)


class Affine(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3 + 1


def save_scripted(path: Path) -> None:
    """What a user does to produce the file (torch marks TorchScript deprecated)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(Affine()).save(str(path))


async def test_torchscript_file_is_served(tmp_path: Path) -> None:
    path = tmp_path / "affine.pt"
    save_scripted(path)
    (tmp_path / "affine.pt.json").write_text(json.dumps({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}))
    async with running_app((("affine", str(path)),)) as (_, url), AsyncClient(url) as client:
        meta = await client.model_metadata("affine")
        assert meta.platform == "pytorch_torchscript"
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        y = (await client.infer("affine", {"x": x}))["y"]
    np.testing.assert_array_equal(y, x * 3 + 1)


def test_torchscript_without_spec_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bare.pt"
    save_scripted(path)
    with pytest.raises(ValueError, match=r"bare\.pt\.json"):
        load_definition(str(path), BuiltinOptions())


@pytest.mark.parametrize(("arg", "message"), [
    ("nosuch", "unknown built-in model"), ("=mlp", "expected NAME=SOURCE")])
def test_bad_model_args(arg: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_model_arg(arg)


def test_factory_must_return_a_definition() -> None:
    with pytest.raises(TypeError, match="expected"):
        load_definition("tests.integration.test_user_models:Affine", BuiltinOptions())
    with pytest.raises(ValueError, match="no callable"):
        load_definition("tests.fixture_models:nope", BuiltinOptions())


async def test_a_failed_start_closes_what_it_built() -> None:
    from evenflow.server.config.server_config import ServerConfig
    from evenflow.server.engine.app import App

    app = App(ServerConfig(http_port=None, port=0, devices="cpu", models=(("mlp", "mlp"),
                                                          ("bad", "tests.fixture_models:nope"))))
    with pytest.raises(ValueError, match="no callable"):
        await app.start()
    (built,) = app.models
    worker = built.balancer.replicas[0].worker
    await app.stop(grace_s=1)
    assert worker._closed and not worker._thread.is_alive()  # type: ignore[attr-defined]
    assert all(r._task is None for r in built.balancer.replicas)
