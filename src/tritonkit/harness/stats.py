"""Statistics for comparing two sets of timings: is a speedup real?

Samples come from interleaved runs (timing.time_interleaved). Outliers are removed with the
1.5 x IQR rule, the speedup is the ratio of medians, and its 95% confidence interval comes from
a bootstrap over both sample sets. When the interval contains 1 the verdict is "no significant
difference". A Mann-Whitney U test gives a second, rank-based opinion. A speedup above 10x is
flagged for review: it usually means a broken baseline or skipped work, not a great kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

SUSPICIOUS_SPEEDUP = 10.0


def remove_outliers(samples: Sequence[float]) -> np.ndarray:
    """Samples inside [Q1 - 1.5 IQR, Q3 + 1.5 IQR] (Tukey's fences)."""
    a = np.asarray(samples, dtype=np.float64)
    if a.size < 4:
        return a
    q1, q3 = np.percentile(a, [25, 75])
    iqr = q3 - q1
    kept = a[(a >= q1 - 1.5 * iqr) & (a <= q3 + 1.5 * iqr)]
    return kept if kept.size else a


def bootstrap_ratio_ci(
    baseline: Sequence[float],
    ours: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(median(baseline) / median(ours), low, high): the speedup and its bootstrap interval."""
    b = np.asarray(baseline, dtype=np.float64)
    o = np.asarray(ours, dtype=np.float64)
    if b.size == 0 or o.size == 0:
        raise ValueError("bootstrap_ratio_ci: both sample sets must be non-empty")
    rng = np.random.default_rng(seed)
    bi = rng.integers(0, b.size, size=(resamples, b.size))
    oi = rng.integers(0, o.size, size=(resamples, o.size))
    ratios = np.median(b[bi], axis=1) / np.median(o[oi], axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [alpha, 1.0 - alpha])
    return float(np.median(b) / np.median(o)), float(low), float(high)


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie-corrected)."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    n1, n2 = x.size, y.size
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney_p: both sample sets must be non-empty")
    both = np.concatenate([x, y])
    order = both.argsort(kind="mergesort")
    ranks = np.empty_like(both)
    ranks[order] = np.arange(1, both.size + 1, dtype=np.float64)
    # Average ranks over ties.
    _, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    rank_sums = np.bincount(inverse, weights=ranks)
    ranks = (rank_sums / counts)[inverse]
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    mu = n1 * n2 / 2.0
    tie_term = (counts**3 - counts).sum() / ((n1 + n2) * (n1 + n2 - 1)) if n1 + n2 > 1 else 0.0
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n1 + n2 + 1) - tie_term))
    if sigma == 0:
        return 1.0
    z = (u1 - mu) / sigma
    return float(math.erfc(abs(z) / math.sqrt(2.0)))


@dataclass(frozen=True)
class Comparison:
    speedup: float  # baseline median / ours (above 1: ours is faster)
    ci_low: float
    ci_high: float
    p_value: float
    verdict: str  # "faster", "slower" or "no significant difference"
    flag: str | None  # set when the speedup is too large to trust without review
    n_ours: int
    n_baseline: int

    def as_dict(self) -> dict:
        return asdict(self)


def compare(ours: Sequence[float], baseline: Sequence[float], seed: int = 0) -> Comparison:
    """Compare two interleaved sample sets after removing outliers from each."""
    o, b = remove_outliers(ours), remove_outliers(baseline)
    speedup, low, high = bootstrap_ratio_ci(b, o, seed=seed)
    p = mann_whitney_p(o, b)
    if low > 1.0:
        verdict = "faster"
    elif high < 1.0:
        verdict = "slower"
    else:
        verdict = "no significant difference"
    flag = None
    if speedup > SUSPICIOUS_SPEEDUP:
        flag = (
            f"speedup {speedup:.1f}x is above {SUSPICIOUS_SPEEDUP:g}x: check the baseline is "
            "doing the same work"
        )
    return Comparison(speedup, low, high, p, verdict, flag, int(o.size), int(b.size))
