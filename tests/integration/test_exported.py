"""torch.export programs (.pt2) served from --model: spec from the signature, bit-exact answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from evenflow.client import AsyncClient
from evenflow.server.models.exported import ExportedProgramError, load_exported
from evenflow.server.workers.replica_module import module_for
from tests.exported_programs import export_two_heads, export_with_positions
from tests.integration.inprocess import running_app

pytestmark = pytest.mark.timeout(90)


def test_the_spec_comes_from_the_program(tmp_path: Path) -> None:
    path = tmp_path / "heads.pt2"
    export_two_heads(path)
    definition = load_exported(path)
    assert [(t.name, t.datatype, t.shape) for t in definition.inputs] == [
        ("x", "FP32", (-1, 8)), ("ids", "INT64", (-1, 3))]
    assert [(t.name, t.datatype, t.shape) for t in definition.outputs] == [
        ("score", "FP32", (-1, 4)), ("norm", "FP32", (-1, 1))]


async def test_an_exported_program_serves_bit_exact_answers(tmp_path: Path) -> None:
    path = tmp_path / "heads.pt2"
    export_two_heads(path)
    direct = torch.export.load(str(path)).module()
    rng = np.random.default_rng(1)
    async with running_app((("heads", str(path)),)) as (_, url), AsyncClient(url) as client:
        meta = await client.model_metadata("heads")
        assert meta.platform == "pytorch_exported_program"
        for batch in (1, 5, 32):
            x = rng.standard_normal((batch, 8)).astype(np.float32)
            ids = rng.integers(0, 16, (batch, 3)).astype(np.int64)
            got = await client.infer("heads", {"x": x, "ids": ids})
            with torch.inference_mode():
                want = direct(torch.from_numpy(x), torch.from_numpy(ids))
            for name in ("score", "norm"):
                np.testing.assert_array_equal(got[name], want[name].numpy())


def test_a_static_batch_dimension_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "static.pt2"
    export_two_heads(path, dynamic_batch=False)
    with pytest.raises(ExportedProgramError, match=r"'x' has a static first dimension"):
        load_exported(path)


@pytest.mark.parametrize("content", [None, b"not a zip archive"])
def test_a_file_that_is_not_a_program_is_refused(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "broken.pt2"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ExportedProgramError, match=r"broken\.pt2"):
        load_exported(path)


def devices_named_in_graph(module: torch.nn.Module) -> set[str]:
    graph = module.graph
    assert isinstance(graph, torch.fx.Graph)
    return {str(node.kwargs["device"]) for node in graph.nodes if "device" in node.kwargs}


def test_a_replica_off_the_cpu_gets_the_program_placed_on_its_device(tmp_path: Path) -> None:
    """Moving the module's parameters (``program.module().to(device)``) leaves the graph's
    ``arange(..., device=cpu)`` on the CPU; the device pass rewrites it for the replica."""
    path = tmp_path / "positions.pt2"
    export_with_positions(path)
    definition = load_exported(path)
    assert devices_named_in_graph(definition.module) == {"cpu"}
    meta = torch.device("meta")
    placed = module_for(definition, meta, torch.float32)
    assert devices_named_in_graph(placed) == {"meta"}
    assert {p.device for p in placed.parameters()} == {meta}
    with torch.inference_mode():
        assert placed(torch.ones(3, 8, device=meta)).shape == (3, 8)
    # The definition's own module still runs on the CPU, and CPU replicas share it.
    assert devices_named_in_graph(definition.module) == {"cpu"}
    assert {p.device for p in definition.module.parameters()} == {torch.device("cpu")}
    assert module_for(definition, torch.device("cpu"), torch.float32) is definition.module


async def test_a_program_that_makes_tensors_serves_what_it_computes_eagerly(
        tmp_path: Path) -> None:
    path = tmp_path / "positions.pt2"
    eager = export_with_positions(path)
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    with torch.inference_mode():
        want = eager(torch.from_numpy(x)).numpy()
    async with running_app((("positions", str(path)),)) as (_, url), \
            AsyncClient(url) as client:
        got = await client.infer("positions", {"x": x})
    np.testing.assert_allclose(got["output__0"], want, rtol=1e-6, atol=1e-6)
