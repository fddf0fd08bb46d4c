"""The event loop every evenflow process runs on: uvloop where it is installed (it is a
dependency on the platforms it supports), else asyncio's own."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion on a new event loop and return its result."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it installs
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)
