"""Whether this server counts CPU time by part of the request path: ``EVENFLOW_CPU_PARTS=1``
in its environment. Each part is read with ``time.thread_time`` (a system call), a few per
request, so it is for measuring (``python -m benchmarks.request_path``), not on by default. The
counts are exported as ``evenflow_cpu_seconds_total{model, part}`` (see
``evenflow.balancer.stats.CPU_PARTS`` for the parts)."""

from __future__ import annotations

import os

ENV_VAR = "EVENFLOW_CPU_PARTS"


def enabled() -> bool:
    return os.environ.get(ENV_VAR) == "1"


def no_clock() -> float:
    """The stand-in for ``time.thread_time`` when nothing is counted."""
    return 0.0
