"""The installed package holds every module and data file of the source tree."""

from __future__ import annotations

from pathlib import Path

import pytest

import evenflow.server

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = ("proto", "server", "balancer", "client", "loadtest")
SHIPPED_SUFFIXES = {".py", ".proto", ".pyi", ".toml", ".json"}


def test_every_source_file_is_installed() -> None:
    installed_root = Path(evenflow.server.__file__).resolve().parents[1]  # .../evenflow
    if installed_root == ROOT:
        pytest.skip("editable install: modules are read from the source tree itself")
    sources = [path.relative_to(ROOT) for top in TOP_LEVEL for path in (ROOT / top).rglob("*")
               if path.suffix in SHIPPED_SUFFIXES and "__pycache__" not in path.parts]
    assert len(sources) > 50, "too few source files found: the test looks in the wrong place"
    assert [str(p) for p in sources if not (installed_root / p).is_file()] == []
