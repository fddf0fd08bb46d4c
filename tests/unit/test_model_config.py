"""ModelConfig as the wire reports it: Triton's dynamic batching fields from the balancer's
settings (perf_analyzer and tritonclient read them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from evenflow.balancer import BalancerConfig, ModelBalancer
from evenflow.server.engine.model_config import model_config
from evenflow.server.engine.served import ServedModel
from evenflow.server.models.spec import TensorSpec

pytestmark = pytest.mark.timeout(10)


@dataclass(frozen=True)
class Definition:
    """What ``model_config`` reads of a model's definition."""

    inputs: Sequence[TensorSpec] = (TensorSpec("x", "FP32", (-1, 4)),)
    outputs: Sequence[TensorSpec] = (TensorSpec("y", "FP32", (-1, 4)),)
    platform: str = "pytorch_libtorch"


def served(config: BalancerConfig) -> ServedModel:
    balancer = ModelBalancer(model_name="m", workers=[], config=config)
    return ServedModel("m", Definition(), balancer)  # type: ignore[arg-type]


@pytest.mark.parametrize(("levels", "default", "reported_default"), [
    (1, None, 1), (3, None, 3), (3, 2, 2)])
def test_dynamic_batching_reports_the_priority_levels_and_the_default(
        levels: int, default: int | None, reported_default: int) -> None:
    config = model_config(served(BalancerConfig(priority_levels=levels,
                                                default_priority_level=default,
                                                max_wait_s=0.003)))
    batching = config.dynamic_batching
    assert batching.max_queue_delay_microseconds == 3000
    assert (batching.priority_levels, batching.default_priority_level) == (
        levels, reported_default)
