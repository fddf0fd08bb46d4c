import math

import pytest

from evenflow.server.prometheus import MetricFamily, format_value, render


def test_render_writes_help_type_and_labelled_samples() -> None:
    family = MetricFamily("nv_inference_count", "counter", "Number of inferences")
    family.add(12, model="mlp", version="1")
    family.add(0.25, model="sim", version="1")
    assert render([family]) == (
        "# HELP nv_inference_count Number of inferences\n"
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="mlp",version="1"} 12\n'
        'nv_inference_count{model="sim",version="1"} 0.25\n')


def test_label_values_and_help_are_escaped() -> None:
    family = MetricFamily("m", "gauge", "line one\nback\\slash")
    family.add(1, model='a"b\\c\nd')
    assert render([family]).splitlines() == [
        "# HELP m line one\\nback\\\\slash",
        "# TYPE m gauge",
        'm{model="a\\"b\\\\c\\nd"} 1',
    ]


def test_families_without_samples_are_left_out_and_unlabelled_samples_have_no_braces() -> None:
    empty = MetricFamily("nv_gpu_utilization", "gauge", "GPU utilization")
    plain = MetricFamily("up", "gauge", "1 when serving")
    plain.add(1)
    assert render([empty, plain]) == "# HELP up 1 when serving\n# TYPE up gauge\nup 1\n"
    assert render([empty]) == ""


@pytest.mark.parametrize(("value", "text"), [
    (3, "3"), (3.0, "3"), (1e6, "1000000"), (0.5, "0.5"), (1e-7, "1e-07"),
    (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"), (2.0**60, "1.152921504606847e+18"),
])
def test_values(value: float, text: str) -> None:
    assert format_value(value) == text
