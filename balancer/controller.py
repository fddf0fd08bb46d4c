"""Per-replica batch size from live latency feedback against a latency target."""

from __future__ import annotations

import math

from evenflow.balancer.estimator import LatencyFit


def best_batch_size(fit: LatencyFit, *, latency_target_s: float, max_wait_s: float,
                    cap: int) -> int:
    """Largest batch whose predicted request latency stays within the target.

    Under load a request waits for the batch running ahead of it, then runs in its own batch, and
    may have waited up to ``max_wait_s`` while its batch formed: ``max_wait + 2 * t(b)``.
    """
    budget_s = (latency_target_s - max_wait_s) / 2.0 - fit.base_s
    if fit.per_sample_s <= 0.0:
        return cap
    size = math.floor(budget_s / fit.per_sample_s + 1e-9)  # 6.9999999 is 7
    return max(1, min(cap, size))


class BatchSizeController:
    """Chooses a replica's batch size.

    ``adaptive``: when the latency fit is reliable, the size is ``best_batch_size`` of the fit; when
    it is not (too little data, or the device just changed), additive increase / multiplicative
    decrease on the observed latency of full batches until the fit settles. ``fixed``: always
    ``max_batch``. Either way the size never exceeds ``cap``, which starts at ``max_batch`` and
    halves whenever the device runs out of memory.
    """

    def __init__(self, *, max_batch: int, latency_target_s: float, max_wait_s: float,
                 adaptive: bool = True) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.cap = max_batch
        self._latency_target_s = latency_target_s
        self._max_wait_s = max_wait_s
        self._adaptive = adaptive
        self.batch_size = 1 if adaptive else max_batch

    @property
    def adaptive(self) -> bool:
        return self._adaptive

    def update(self, fit: LatencyFit, observed_batch: int, latency_s: float) -> None:
        if not self._adaptive:
            self.batch_size = self.cap
            return
        if fit.reliable:
            self.batch_size = best_batch_size(fit, latency_target_s=self._latency_target_s,
                                              max_wait_s=self._max_wait_s, cap=self.cap)
            return
        predicted_latency_s = self._max_wait_s + 2.0 * latency_s
        if predicted_latency_s > self._latency_target_s:
            self.batch_size = max(1, self.batch_size // 2)
        elif observed_batch >= self.batch_size:
            self.batch_size = min(self.cap, self.batch_size + 1)

    def live_batch_size(self, fit: LatencyFit, waited_s: float) -> int:
        """The size the next batch may grow to when its oldest request will have waited
        ``waited_s`` by the time it starts: the largest whose compute still ends within the
        target for that request, and never below ``batch_size``.

        ``batch_size`` is sized for the worst case (a request that waits out a whole batch, then
        runs in one). Below saturation batches start sooner, and a burst is better absorbed by a
        larger batch on a fast device than sent to a slow one or queued behind a full batch.
        """
        if not self._adaptive or not fit.reliable or fit.per_sample_s <= 0.0:
            return self.batch_size
        size = math.floor((self._latency_target_s - waited_s - fit.base_s) / fit.per_sample_s
                          + 1e-9)
        return max(self.batch_size, min(self.cap, size))

    def on_out_of_memory(self, failed_batch: int) -> None:
        self.cap = max(1, min(self.cap, failed_batch // 2))
        self.batch_size = min(self.batch_size, self.cap)
