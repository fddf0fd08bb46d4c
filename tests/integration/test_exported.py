"""torch.export programs (.pt2) served from --model: spec from the signature, bit-exact answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from evenflow.client import AsyncClient
from evenflow.server.models.exported import ExportedProgramError, load_exported
from tests.exported_programs import export_two_heads
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
