"""Evaluation metrics: distribution distances, rank correlation, classification scores and
CELM's free-rider detection (§6.2).

Inputs are array-likes (numpy arrays, lists, CPU torch tensors). Functions act on the last
axis, so a 2-D input gives one value per row; a single vector gives a float.

Distributions: ``p`` and ``q`` are non-negative histograms (e.g. class counts) of the same
shape, each normalised to sum 1 along the last axis; a negative entry or an all-zero
histogram raises ValueError.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _value(x):
    """A float for 0-d results, the array otherwise."""
    x = np.asarray(x, dtype=float)
    return float(x) if x.ndim == 0 else x


def _distributions(p, q) -> tuple[np.ndarray, np.ndarray]:
    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape (got {p.shape} and {q.shape})")
    if (p < 0).any() or (q < 0).any():
        raise ValueError("p and q must be non-negative")
    sp, sq = p.sum(-1, keepdims=True), q.sum(-1, keepdims=True)
    if (sp <= 0).any() or (sq <= 0).any():
        raise ValueError("every histogram in p and q needs a positive total")
    return p / sp, q / sq


def _kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Σ_k p_k ln(p_k / q_k) on normalised inputs, with 0 ln 0 = 0 and p_k > 0 = q_k giving inf."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p / q), 0.0)
    return terms.sum(-1)


def _js(p, q, base: float) -> np.ndarray:
    """½ KL(p || m) + ½ KL(q || m) with m = ½ (p + q), logarithms in ``base``."""
    p, q = _distributions(p, q)
    m = 0.5 * (p + q)
    return 0.5 * (_kl(p, m) + _kl(q, m)) / np.log(base)


# ----------------------------------------------------------------------------- distributions


def kl(p, q, base: float = np.e):
    """Kullback-Leibler divergence KL(p || q) = Σ_k p_k log(p_k / q_k), in nats by default
    (``base=2``: bits). 0 log 0 = 0; inf where q_k = 0 < p_k."""
    p, q = _distributions(p, q)
    return _value(_kl(p, q) / np.log(base))


def jsd(p, q):
    """Jensen-Shannon divergence in bits (base-2 logarithm), so it lies in [0, 1]:
    JSD(p, q) = ½ KL(p || m) + ½ KL(q || m) with m = ½ (p + q). 0 iff p = q, 1 iff the
    supports are disjoint. (The divergence, not its square root, the JS distance.)"""
    return _value(np.clip(_js(p, q, 2), 0.0, 1.0))


def js_distance(p, q, base: float = np.e):
    """Jensen-Shannon *distance*: the square root of the JS divergence taken with logarithms in
    ``base`` (natural by default), sqrt(½ KL(p || m) + ½ KL(q || m)), m = ½ (p + q). This is
    ``scipy.spatial.distance.jensenshannon``'s definition and default base; it lies in
    [0, sqrt(ln 2)] ≈ [0, 0.833] in base e and [0, 1] in base 2."""
    return _value(np.sqrt(np.clip(_js(p, q, base), 0.0, None)))


def hellinger(p, q):
    """Hellinger distance H(p, q) = (1/√2) ||√p - √q||_2 in [0, 1]: 0 iff p = q, 1 iff the
    supports are disjoint."""
    p, q = _distributions(p, q)
    return _value(np.sqrt(0.5 * np.square(np.sqrt(p) - np.sqrt(q)).sum(-1)))


def emd_1d(p, q):
    """Earth mover's (Wasserstein-1) distance between class histograms on the ordered class
    axis with ground distance |i - j| between classes i and j (adjacent classes are 1 apart):
    EMD(p, q) = Σ_k |F_p(k) - F_q(k)|, F the cumulative sums. Range [0, C - 1]; moving all
    mass by one class costs 1. Divide by C - 1 for a [0, 1] scale."""
    p, q = _distributions(p, q)
    return _value(np.abs(np.cumsum(p - q, axis=-1)).sum(-1))


def emd_classes(p, q, weights=None):
    """Earth mover's distance over class bins, per client, on a [0, 1] scale: each row of
    ``p`` and ``q`` (a client's class histogram, normalised) is compared by the 1-D
    Wasserstein distance with ground distance |i - j| / (C - 1) between classes i and j,
    and the rows are averaged with ``weights`` (normalised; uniform when None).
    A single pair of vectors gives that pair's normalised EMD."""
    p, q = _distributions(p, q)
    per_row = np.abs(np.cumsum(p - q, axis=-1)).sum(-1) / max(p.shape[-1] - 1, 1)
    if per_row.ndim == 0:
        return _value(per_row)
    w = np.full(per_row.shape, 1.0) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != per_row.shape or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be {per_row.shape[0]} non-negative numbers with a positive sum")
    return _value((w * per_row).sum() / w.sum())


def joint_distances(true_counts, other) -> dict[str, float]:
    """CELM Table 4's distances between a true client x class count matrix [N, C] and another
    non-negative matrix of the same shape (the uniform matrix, or CELM's evidence Q):

    - ``JSD``: :func:`js_distance` (natural log, square root) between the two joint
      distributions over the N C client-class cells (each matrix divided by its total);
    - ``Hellinger``: :func:`hellinger` between the same joint distributions;
    - ``EMD``: :func:`emd_classes` between each client's class distributions (rows
      normalised; a zero row of ``other`` counts as uniform), weighted by the true client shares.

    JSD and Hellinger reproduce the paper's Uniform column from the split (CELM chapter);
    the EMD is our reading of "mass transport across class bins" (no tested definition
    reproduces the paper's EMD column)."""
    true = np.asarray(true_counts, dtype=float)
    other = np.asarray(other, dtype=float)
    if true.ndim != 2 or true.shape != other.shape:
        raise ValueError(f"true_counts and other must be [N, C] of one shape (got {true.shape}, {other.shape})")
    rows = np.where(other.sum(1, keepdims=True) > 0, other, 1.0)
    return {"JSD": float(js_distance(true.ravel(), other.ravel())),
            "EMD": float(emd_classes(true, rows, weights=true.sum(1))),
            "Hellinger": float(hellinger(true.ravel(), other.ravel()))}


def spearman(a, b):
    """Spearman's rank correlation: the Pearson correlation of the ranks of ``a`` and ``b``
    (ties get their average rank), in [-1, 1]. NaN when either input is constant (undefined)."""
    # lazy: scipy.stats (~1 s) stays out of the queue, whose chapters import this module
    from scipy.stats import rankdata

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape (got {a.shape} and {b.shape})")
    ra, rb = rankdata(a, axis=-1), rankdata(b, axis=-1)
    ra = ra - ra.mean(-1, keepdims=True)
    rb = rb - rb.mean(-1, keepdims=True)
    denominator = np.sqrt(np.square(ra).sum(-1) * np.square(rb).sum(-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return _value(np.where(denominator > 0, (ra * rb).sum(-1) / denominator, np.nan))


# ----------------------------------------------------------------------------- classification


def _confusion(confusion) -> np.ndarray:
    c = np.asarray(confusion, dtype=float)
    if c.ndim < 2 or c.shape[-1] != c.shape[-2]:
        raise ValueError(f"confusion must be [..., C, C] (got shape {c.shape})")
    return c


def balanced_accuracy(confusion):
    """Mean recall over the classes present: confusion[..., i, j] counts samples of true class
    i predicted as j; recall_i = confusion[i, i] / Σ_j confusion[i, j], averaged over classes
    with at least one sample (0 for an empty matrix)."""
    c = _confusion(confusion)
    support = c.sum(-1)
    recall = np.diagonal(c, axis1=-2, axis2=-1) / np.maximum(support, 1)
    present = support > 0
    return _value((recall * present).sum(-1) / np.maximum(present.sum(-1), 1))


def macro_f1(confusion):
    """Macro-averaged F1 (rows = true class): F1_i = 2 TP_i / (2 TP_i + FP_i + FN_i), averaged
    over the classes that occur as a label or a prediction (0 for an empty matrix)."""
    c = _confusion(confusion)
    tp = np.diagonal(c, axis1=-2, axis2=-1)
    denominator = c.sum(-1) + c.sum(-2)  # 2 TP + FN + FP
    f1 = 2 * tp / np.maximum(denominator, 1e-300)
    occurring = denominator > 0
    return _value((f1 * occurring).sum(-1) / np.maximum(occurring.sum(-1), 1))


def rare_class_accuracy(per_class_acc, rare_classes: Sequence[int]):
    """Mean per-class accuracy over the rare (e.g. Maverick-held) classes:
    (1 / |R|) Σ_{c∈R} acc_c (CELM Table 2)."""
    rare = list(rare_classes)
    if not rare:
        raise ValueError("rare_classes must name at least one class")
    return _value(np.asarray(per_class_acc, dtype=float)[..., rare].mean(-1))


# ----------------------------------------------------------------------------- free-rider detection


def _labels(is_free_rider, n: int) -> np.ndarray:
    labels = np.asarray(is_free_rider, dtype=bool)
    if labels.shape != (n,):
        raise ValueError(f"is_free_rider must have one entry per client ({n}), got shape {labels.shape}")
    return labels


def zscores(scores):
    """Per-round standardisation of the clients' contributions (last axis):
    z_i = (s_i - mean(s)) / std(s) (population std). A round whose scores are all equal
    (std <= 1e-12 · max(1, |mean|)) gives z = 0 for every client, never NaN."""
    s = np.asarray(scores, dtype=float)
    mean = s.mean(-1, keepdims=True)
    std = s.std(-1, keepdims=True)
    flat = std <= 1e-12 * np.maximum(1.0, np.abs(mean))
    return _value(np.where(flat, 0.0, (s - mean) / np.where(flat, 1.0, std)))


def auroc(scores, is_free_rider):
    """AUROC of free-rider detection from contribution scores (last axis = clients).

    Free-riders are the positive class and a LOWER score is more suspicious, so
    AUROC = P(s_free < s_benign) + ½ P(s_free = s_benign) over all (free-rider, benign) pairs:
    1 when every free-rider scores below every benign client, 0 when above, 0.5 for a round
    of equal scores. Needs at least one client of each kind."""
    s = np.asarray(scores, dtype=float)
    labels = _labels(is_free_rider, s.shape[-1])
    if labels.all() or not labels.any():
        raise ValueError("auroc: needs at least one free-rider and one benign client")
    free = s[..., labels][..., :, None]
    benign = s[..., ~labels][..., None, :]
    return _value(((free < benign) + 0.5 * (free == benign)).mean((-2, -1)))


def fpr_at_thresholds(z, is_free_rider, thresholds):
    """False-positive rate of the rule "flag client i when z_i < threshold" for each threshold:
    FPR = (benign clients flagged) / (benign clients). Shape [..., len(thresholds)]."""
    z = np.asarray(z, dtype=float)
    labels = _labels(is_free_rider, z.shape[-1])
    if labels.all():
        raise ValueError("fpr_at_thresholds: needs at least one benign client")
    t = np.asarray(thresholds, dtype=float).reshape(-1)
    flagged = z[..., None, ~labels] < t[:, None]  # [..., K, benign]
    return flagged.mean(-1)


def detection_summary(score_history, is_free_rider, thresholds=np.linspace(-3, 0, 31)) -> dict:
    """CELM §6.2: z-score free-rider detection over the rounds of a run.

    ``score_history`` [T, N] holds the contribution scores of the N clients in each of T rounds
    (rounds without scores left out). Returns
    ``auroc`` (mean over rounds), ``auroc_per_round`` [T], ``fpr`` (mean over thresholds of the
    round-averaged FPR), ``fpr_curve`` [K] (round-averaged FPR at each threshold) and
    ``thresholds`` [K]. Both use the z-scores (AUROC is unchanged by the standardisation), so
    a round of equal scores counts as AUROC 0.5 and flags nobody at thresholds <= 0."""
    history = np.asarray(score_history, dtype=float)
    if history.ndim != 2 or history.shape[0] == 0:
        raise ValueError(f"score_history must be [T, N] with T >= 1 (got shape {history.shape})")
    t = np.asarray(thresholds, dtype=float).reshape(-1)
    z = zscores(history)
    per_round = np.atleast_1d(auroc(z, is_free_rider))
    curve = fpr_at_thresholds(z, is_free_rider, t).mean(0)
    return {"auroc": float(per_round.mean()), "auroc_per_round": per_round, "fpr": float(curve.mean()),
            "fpr_curve": curve, "thresholds": t}
