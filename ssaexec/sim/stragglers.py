"""Stragglers and jitter: a synchronous step lasts as long as its slowest rank.

Policy. Each rank's step time is an independent draw, per step, from one normal
distribution of mean ``mu`` (the replayed step) and standard deviation
``sigma = cv * mu``; ``cv`` is the cluster's ``jitter_cv``. The ranks meet at every
step's gradient all-reduce, so the step lasts ``mu + sigma * E[max of N standard
normals]``: the expected maximum of ``N`` draws. One rank loses nothing; the loss
grows as ``sqrt(2 ln N)`` (1.42 sigma at 8 ranks, 2.34 at 64, 3.04 at 512).

Where ``cv`` comes from: the spread of measured step times, read robustly from their
percentiles (``cv_from_percentiles``: the 50th and 90th of a normal are 1.2816 sigma
apart), so that a few outliers in a short run do not set it. The presets' values
and their sources are in ``ssaexec.sim.cluster`` and docs/simulator.md.

Invariants: ``expected_max(1) == 0``; ``expected_max`` never falls as ``N`` grows;
``jitter_s`` is 0 for one rank or ``cv == 0``.
"""

import functools
import math

__all__ = ["expected_max", "jitter_s", "cv_from_percentiles", "cv_from_samples"]

_Z90 = 1.2815515655446004  # the 90th percentile of the standard normal


@functools.lru_cache(maxsize=256)
def expected_max(n):
    """E[max of ``n`` independent standard normal draws] (0 for ``n <= 1``).

    Simpson's rule on ``x * n * phi(x) * Phi(x)**(n-1)`` over [-12, 12]: exact to
    1e-9 for any ``n`` a cluster has.
    """
    n = int(n)
    if n <= 1:
        return 0.0
    lo, hi, steps = -12.0, 12.0, 4800  # even
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * h
        phi = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        big_phi = 0.5 * math.erfc(-x / math.sqrt(2))
        f = x * n * phi * big_phi ** (n - 1)
        w = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += w * f
    return total * h / 3


def jitter_s(step_s, cv, ranks):
    """Seconds the slowest of ``ranks`` ranks adds to a step of mean ``step_s``."""
    if ranks <= 1 or cv <= 0 or step_s <= 0:
        return 0.0
    return cv * step_s * expected_max(ranks)


def cv_from_percentiles(p50, p90):
    """The coefficient of variation of a normal whose median is ``p50`` and 90th
    percentile ``p90`` (``(p90 - p50) / 1.2816 / p50``)."""
    if p50 <= 0 or p90 < p50:
        raise ValueError(f"need 0 < p50 <= p90, got p50={p50}, p90={p90}")
    return (p90 - p50) / _Z90 / p50


def cv_from_samples(samples):
    """``cv_from_percentiles`` of measured step times (at least 5 of them)."""
    xs = sorted(samples)
    if len(xs) < 5:
        raise ValueError(f"need at least 5 step times, got {len(xs)}")

    def q(p):
        k = (len(xs) - 1) * p
        i = int(k)
        return xs[i] + (xs[min(i + 1, len(xs) - 1)] - xs[i]) * (k - i)
    return cv_from_percentiles(q(0.5), q(0.9))
