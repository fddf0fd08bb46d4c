"""Spacing of restarts: a worker, a worker process or a front-end that failed to start is
tried again after a delay that doubles, so a lasting failure does not spin, and shrinks back
once it has run well."""

from __future__ import annotations


class Backoff:
    """Delays between restarts: ``first_s``, then doubling up to ``max_s``; ``reset`` after a
    child has run well, so that its next failure is retried soon again."""

    def __init__(self, first_s: float, max_s: float) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"need 0 < first_s <= max_s, got {first_s}, {max_s}")
        self._first_s = first_s
        self._max_s = max_s
        self._next_s = first_s

    def next_s(self) -> float:
        """The delay before the next attempt (and the one after it doubles)."""
        delay_s = self._next_s
        self._next_s = min(self._max_s, 2 * delay_s)
        return delay_s

    def reset(self) -> None:
        self._next_s = self._first_s
