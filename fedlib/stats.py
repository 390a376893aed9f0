"""The book's statistics, in one place: a value's spread over seeds, a paired margin's 95 %
interval and its verdict, and the rule for "reproduces the paper".

- Spread: mean ± the sample standard deviation (ddof 1) over n seeds, written
  "82.19 ± 1.00 (3)"; a single seed has no spread: "82.19 (1)".
- Margin verdict (:func:`margin_verdict`): the 95 % Student t-interval of the mean of the
  per-seed differences, mean ± t(0.975, n − 1) · sd / √n. With n ≥ 3 it *holds* when the
  interval lies above 0, *does not hold* when it lies below 0, is *within noise* when it
  contains 0; below 3 seeds it is *indicative (n seeds)* whatever its sign.
- Reproduction (:func:`reproduces`): |ours − paper| ≤ max(2 points, the paper's std, our
  interval's half-width).
"""

from __future__ import annotations

import math
from typing import Iterable, NamedTuple

import numpy as np

HOLDS, FAILS, NOISE, INDICATIVE = "holds", "does not hold", "within noise", "indicative"
MIN_SEEDS = 3  # below this a verdict is only indicative
LEVEL = 0.95
INTERVAL_NAME = "95 % Student t-interval of the mean paired margin (mean ± t₀.₉₇₅,ₙ₋₁ · sd/√n)"
TOLERANCE_POINTS = 2.0  # the reproduction rule's floor, in points


class Spread(NamedTuple):
    """Mean, sample std (ddof 1; NaN below 2 values) and count of a value over seeds."""

    mean: float
    std: float
    n: int


class SeedSpread(Spread):
    """A :class:`Spread` that keeps its values by seed (``by_seed``), so that methods can be
    compared on the seeds they share."""

    by_seed: dict

    @classmethod
    def of(cls, by_seed: dict) -> "SeedSpread":
        kept = {s: float(v) for s, v in by_seed.items() if v == v}
        spread = cls(*mean_std(kept.values()))
        spread.by_seed = kept
        return spread


def mean_std(values: Iterable[float]) -> Spread:
    """Mean ± sample std (ddof 1) over ``values``, with their count; NaNs are left out."""
    arr = np.asarray(list(values), dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return Spread(float("nan"), float("nan"), 0)
    return Spread(float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else float("nan"), int(arr.size))


def pm(mean: float, std: float = float("nan"), n: int | None = None, digits: int = 2) -> str:
    """"mean ± std (n)": no ± where ``std`` is NaN (one seed, or a paper value without one),
    no "(n)" where ``n`` is None (a paper's value); "—" for a NaN mean."""
    if mean != mean:
        return "—"
    text = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std == std else "")
    return text + (f" ({n})" if n is not None else "")


def t_quantile(n: int) -> float:
    """t(0.975, n − 1): the two-sided 95 % quantile of Student's t with n − 1 degrees of freedom."""
    # lazy: scipy.stats (~1 s) stays out of `import fedlib` and the queue; only t-intervals need it
    from scipy.stats import t

    return float(t.ppf(0.5 + LEVEL / 2, n - 1))


def interval(values: Iterable[float]) -> tuple[float, float]:
    """The 95 % t-interval of the mean of ``values`` ((NaN, NaN) below 2 values)."""
    s = mean_std(values)
    if s.n < 2:
        return float("nan"), float("nan")
    half = t_quantile(s.n) * s.std / math.sqrt(s.n)
    return s.mean - half, s.mean + half


def half_width(values: Iterable[float]) -> float:
    """Half the width of :func:`interval` (0 for one value: no spread is known; NaN for none)."""
    values = list(values)
    if not values:
        return float("nan")
    lo, hi = interval(values)
    return 0.0 if lo != lo else (hi - lo) / 2


def margin_verdict(values: Iterable[float]) -> str | None:
    """The verdict of a paired margin's per-seed values (the claim: margin > 0); None when empty."""
    values = list(values)
    if not values:
        return None
    if len(values) < MIN_SEEDS:
        return indicative(len(values))
    lo, hi = interval(values)
    if lo > 0:
        return HOLDS
    if hi < 0:
        return FAILS
    return NOISE


def indicative(n: int) -> str:
    return f"{INDICATIVE} ({n} seed{'s' if n != 1 else ''})"


def interval_text(values: Iterable[float], digits: int = 2) -> str:
    """"[lo, hi]", or "—" below 2 values."""
    lo, hi = interval(values)
    return "—" if lo != lo else f"[{lo:+.{digits}f}, {hi:+.{digits}f}]"


def tolerance(ours: Iterable[float], paper_std: float | None = None) -> float:
    """max(2 points, the paper's std, our interval's half-width)."""
    ours = list(ours)
    return max(TOLERANCE_POINTS, paper_std if paper_std is not None and paper_std == paper_std else 0.0,
               half_width(ours) if ours else 0.0)


def reproduces(ours: Iterable[float], paper: float | None, paper_std: float | None = None) -> bool | None:
    """Whether our seeds' mean reproduces the paper's value: |ours − paper| ≤ :func:`tolerance`;
    None when either side is missing."""
    ours = [v for v in ours if v == v]
    if not ours or paper is None or paper != paper:
        return None
    return abs(float(np.mean(ours)) - paper) <= tolerance(ours, paper_std)


def reproduction_text(ours: Iterable[float], paper: float | None, paper_std: float | None = None) -> str:
    """"yes" / "no" (with "indicative (n seeds)" below 3 seeds), "—" when not comparable."""
    ours = [v for v in ours if v == v]
    verdict = reproduces(ours, paper, paper_std)
    if verdict is None:
        return "—"
    text = "yes" if verdict else "no"
    return text if len(ours) >= MIN_SEEDS else f"{text}, {indicative(len(ours))}"
