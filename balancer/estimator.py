"""Per-replica latency model ``t(b) = a + c*b`` fitted online from finished batches."""

from __future__ import annotations

from dataclasses import dataclass

_STEP_RATIO = 1.5          # an observation this far off the prediction (either way) is a surprise
_STEP_COUNT = 3            # this many surprises in a row means the device changed
_MIN_SPREAD_SAMPLES2 = 0.25  # weighted variance of batch sizes needed to separate a from c
_MAX_RELIABLE_ERROR = 0.2  # mean relative error above which the fit is not trusted

# The starting guess of ``a`` and ``c`` (``BalancerConfig``'s defaults too): a small model on a
# GPU. It only splits the first measured latency between fixed and per-sample cost until two
# batch sizes are seen, so its scale matters less than its ratio (ten samples cost one ``a``).
PRIOR_BASE_S = 0.002
PRIOR_PER_SAMPLE_S = 0.0002

# The least a batch is taken to cost. Routing divides by batch time (a shared queue drains at
# the replicas' summed ``b / t(b)``), so a batch measured at zero (a simulated device, a fake, a
# clock too coarse to see it) must not teach a free one. A microsecond is below anything a
# real batch costs (the hand-off to a worker and back alone costs tens), so it floors only
# those.
MIN_BATCH_S = 1e-6


def floored_prior(base_s: float, per_sample_s: float) -> tuple[float, float]:
    """A starting guess of ``a`` and ``c`` that prices a batch at ``MIN_BATCH_S`` at least:
    one of no cost at all (a configuration's zeros, a simulated model that only measures the
    server around it) becomes a batch at the floor, all of it fixed. Every reader divides by
    batch time, and scaling the prior needs a cost. Raises ValueError for a negative one."""
    if base_s < 0.0 or per_sample_s < 0.0:
        raise ValueError(f"a prior's costs must be >= 0, not {base_s} s + {per_sample_s} s "
                         "per sample")
    if base_s + per_sample_s < MIN_BATCH_S:
        return MIN_BATCH_S, per_sample_s
    return base_s, per_sample_s


@dataclass(frozen=True, slots=True)
class LatencyFit:
    """``reliable``: the fit's predictions are trusted at every batch size (measured at two
    sizes at least, and accurate lately). ``settled``: accurate lately at the sizes it was
    measured at, though perhaps at one size alone, where ``a`` and ``c`` are split as the prior
    splits them (a replica held to batches of one by its SLO); ``batch_size`` and
    ``latency_s`` are those measurements' weighted means, a point any linear cost of the
    replica passes through."""

    base_s: float
    per_sample_s: float
    reliable: bool
    settled: bool = False
    batch_size: float = 0.0
    latency_s: float = 0.0

    def predict_s(self, batch_size: int) -> float:
        return self.base_s + self.per_sample_s * batch_size


class LatencyModel:
    """Exponentially weighted least squares of batch latency against batch size.

    Every observation multiplies the weight of older ones by ``forgetting`` (0.95 keeps an
    effective window of about 20 batches), so a device that slows down is re-learned within a
    few dozen batches. Three observations in a row that miss the prediction by more than 1.5x are
    taken as a step change (a throttled or re-clocked device): the fit restarts from those three
    observations alone, and is reported unreliable until its predictions settle again, which
    sends the controller to its AIMD fallback meanwhile.

    Until two distinct batch sizes have been seen, ``a`` and ``c`` cannot be separated; the fit
    then scales the prior's split between fixed and per-sample cost to the observed latency.
    """

    def __init__(self, *, prior_base_s: float = PRIOR_BASE_S,
                 prior_per_sample_s: float = PRIOR_PER_SAMPLE_S,
                 forgetting: float = 0.95, min_weight: float = 3.0) -> None:
        if not 0.0 < forgetting < 1.0:
            raise ValueError("forgetting must be in (0, 1)")
        prior_base_s, prior_per_sample_s = floored_prior(prior_base_s, prior_per_sample_s)
        self._prior = LatencyFit(prior_base_s, prior_per_sample_s, reliable=False)
        self._forgetting = forgetting
        self._min_weight = min_weight
        self._w = self._wb = self._wbb = self._wt = self._wbt = 0.0
        self._mean_abs_error = 1.0
        self._surprises: list[tuple[int, float]] = []
        self.num_step_changes = 0
        self._fit = self._prior

    @property
    def fit(self) -> LatencyFit:
        return self._fit

    @property
    def observed(self) -> bool:
        """Whether any batch has been measured (before that the fit is only the prior)."""
        return self._w > 0.0 or bool(self._surprises)

    def predict_s(self, batch_size: int) -> float:
        return self._fit.predict_s(batch_size)

    def observe(self, batch_size: int, latency_s: float) -> None:
        latency_s = max(latency_s, MIN_BATCH_S)
        predicted = self._fit.predict_s(batch_size)
        if self._w > 0.0 and predicted > 0.0:
            ratio = latency_s / predicted
            self._mean_abs_error = 0.8 * self._mean_abs_error + 0.2 * abs(ratio - 1.0)
            if ratio > _STEP_RATIO or ratio < 1.0 / _STEP_RATIO:
                # Held back from the fit, so the next observation is judged against the same
                # prediction: a lone outlier joins the fit later, a run of them restarts it.
                self._surprises.append((batch_size, latency_s))
                if len(self._surprises) >= _STEP_COUNT:
                    self._restart_from_surprises()
                return
        for held in self._surprises:
            self._add(*held)
        self._surprises.clear()
        self._add(batch_size, latency_s)
        self._fit = self._solve()

    def _restart_from_surprises(self) -> None:
        self._w = self._wb = self._wbb = self._wt = self._wbt = 0.0
        for batch_size, latency_s in self._surprises:
            self._add(batch_size, latency_s)
        self._surprises.clear()
        self._mean_abs_error = 1.0
        self.num_step_changes += 1
        self._fit = self._solve()

    def _add(self, batch_size: int, latency_s: float) -> None:
        self._forget(self._forgetting)
        b = float(batch_size)
        self._w += 1.0
        self._wb += b
        self._wbb += b * b
        self._wt += latency_s
        self._wbt += b * latency_s

    def _forget(self, keep: float) -> None:
        self._w *= keep
        self._wb *= keep
        self._wbb *= keep
        self._wt *= keep
        self._wbt *= keep

    def _solve(self) -> LatencyFit:
        w = self._w
        mean_b = self._wb / w
        mean_t = self._wt / w
        var_b = self._wbb / w - mean_b * mean_b
        if var_b < _MIN_SPREAD_SAMPLES2:
            # One batch size seen: keep the prior's split between fixed and per-sample cost,
            # scaled at the whole size nearest the mean. Routing and admission read this fit;
            # scaled at the mean itself (exact for the mean), their SLO goodput measured lower
            # (docs/benchmarks.md, Placement). The cost book rescales at the mean
            # (``CostBook.observe_at``), where capacity is priced.
            scale = mean_t / self._prior.predict_s(round(mean_b))
            base, per_sample = self._prior.base_s * scale, self._prior.per_sample_s * scale
            return LatencyFit(base, per_sample, reliable=False, settled=self._settled(),
                              batch_size=mean_b, latency_s=mean_t)
        per_sample = (self._wbt / w - mean_b * mean_t) / var_b
        base = mean_t - per_sample * mean_b
        if per_sample <= 0.0:  # noise made the slope vanish: charge everything per batch
            per_sample, base = 1e-9, mean_t
        elif base < 0.0:  # fit through the origin instead of a negative fixed cost
            per_sample, base = self._wbt / self._wbb, 0.0
        settled = self._settled()
        return LatencyFit(base, per_sample, reliable=settled, settled=settled,
                          batch_size=mean_b, latency_s=mean_t)

    def _settled(self) -> bool:
        return self._w >= self._min_weight and self._mean_abs_error <= _MAX_RELIABLE_ERROR
