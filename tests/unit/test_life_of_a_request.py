"""docs/architecture.md's "Life of a request" names each hop of a unary ModelInfer as
``module.function``: every name there must exist in the code, so the section cannot drift
from it unnoticed."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
NAME = re.compile(r"`(evenflow(?:\.\w+)+)`")


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def resolve(dotted: str) -> Any:
    """The object ``dotted`` names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(dotted)


def hops(heading: str) -> list[str]:
    body = section(DOC.read_text(), "Life of a request")
    sub = body.index(f"\n### {heading}")
    end = body.find("\n### ", sub + 1)
    return NAME.findall(body[sub:end if end >= 0 else None])


@pytest.mark.parametrize("shape", ["In one process", "With --frontends N", "Over HTTP"])
def test_every_hop_names_code_that_exists(shape: str) -> None:
    names = hops(shape)
    assert len(names) >= 8, f"{shape}: too few hops named"
    missing = []
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert missing == []


def test_a_stale_name_is_caught() -> None:
    with pytest.raises(AttributeError):
        resolve("evenflow.server.edge.servicer.EdgeServicer.no_such_hop")
    with pytest.raises((ImportError, AttributeError)):
        resolve("evenflow.no_such_module.f")
