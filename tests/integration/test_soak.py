"""The 30-second soak (benchmarks.soak runs 10 minutes): 70 % of capacity, no errors, resident
memory flat after warm-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.soak import soak

# slow, timing: a 30 s soak.
pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.timeout(120)]


async def test_thirty_seconds_at_seventy_percent(tmp_path: Path) -> None:
    result = await soak(30.0, 0.7, 2.0, tmp_path / "server.log")
    print(f"\nsoak: {result.sent} sent, {result.answers}, p99 {result.p99_ms:.1f} ms, RSS "
          f"{result.rss_after_warmup_mib:.1f} -> {result.rss_end_mib:.1f} MiB "
          f"({result.rss_growth:+.1%})")
    assert result.answers == {"OK": result.sent}
    assert result.rss_growth < 0.05
