"""Metrics: known values of the distances, correlations, classification scores and detection."""

import math

import numpy as np
import pytest
import torch

from fedlib import metrics as m


def test_jsd_is_zero_for_equal_and_one_bit_for_disjoint_distributions():
    assert m.jsd([1, 2, 3], [2, 4, 6]) == 0.0  # histograms are normalised first
    assert m.jsd([1, 0, 0, 0], [0, 0, 1, 1]) == pytest.approx(1.0)
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    mid = (p + q) / 2
    expected = 0.5 * sum(p * np.log2(p / mid)) + 0.5 * sum(q * np.log2(q / mid))
    assert m.jsd(p, q) == pytest.approx(expected)
    rows = m.jsd([[1, 0], [1, 1]], [[0, 1], [1, 1]])
    assert rows.shape == (2,) and rows == pytest.approx([1.0, 0.0])


def test_kl_known_values_and_infinity():
    assert m.kl([0.5, 0.5], [0.25, 0.75]) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3))
    assert m.kl([0.5, 0.5], [0.25, 0.75], base=2) == pytest.approx(0.5 + 0.5 * math.log2(2 / 3))
    assert m.kl([1, 0], [1, 0]) == 0.0
    assert m.kl([0.5, 0.5], [1, 0]) == math.inf


def test_hellinger_bounds():
    assert m.hellinger([1, 2], [1, 2]) == 0.0
    assert m.hellinger([1, 0], [0, 1]) == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    values = m.hellinger(rng.random((50, 6)), rng.random((50, 6)))
    assert values.shape == (50,) and ((values > 0) & (values < 1)).all()
    assert m.hellinger([0.5, 0.5], [1, 0]) == pytest.approx(math.sqrt(1 - math.sqrt(0.5)))


def test_emd_uses_the_class_index_as_ground_distance():
    assert m.emd_1d([0, 1, 0, 0], [0, 0, 1, 0]) == pytest.approx(1.0)  # one class over
    assert m.emd_1d([1, 0, 0, 0], [0, 0, 0, 1]) == pytest.approx(3.0)  # C - 1 = 3 classes over
    assert m.emd_1d([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(1.0)  # half the mass, two moves
    assert m.emd_1d([[1, 0], [1, 1]], [[0, 1], [1, 1]]) == pytest.approx([1.0, 0.0])


def test_distribution_inputs_are_checked():
    with pytest.raises(ValueError, match="same shape"):
        m.jsd([1, 0], [1, 0, 0])
    with pytest.raises(ValueError, match="non-negative"):
        m.hellinger([1, -1], [1, 1])
    with pytest.raises(ValueError, match="positive total"):
        m.emd_1d([0, 0], [1, 1])


def test_spearman():
    assert m.spearman([1, 2, 3, 4], [10, 20, 35, 1000]) == pytest.approx(1.0)  # monotone
    assert m.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert m.spearman(torch.tensor([1.0, 2.0, 2.0]), [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)  # a tie
    assert math.isnan(m.spearman([1, 1, 1], [1, 2, 3]))


def test_balanced_accuracy_macro_f1_and_rare_classes():
    confusion = np.array([[8, 2, 0], [1, 4, 5], [0, 0, 0]])  # class 2 has no samples
    assert m.balanced_accuracy(confusion) == pytest.approx((0.8 + 0.4) / 2)
    f1 = [2 * 8 / (16 + 2 + 1), 2 * 4 / (8 + 6 + 2), 0.0]  # class 2 is predicted 5 times, never right
    assert m.macro_f1(confusion) == pytest.approx(sum(f1) / 3)
    assert m.balanced_accuracy(np.stack([confusion, np.eye(3)])) == pytest.approx([0.6, 1.0])
    assert m.balanced_accuracy(np.zeros((3, 3))) == 0.0 and m.macro_f1(np.zeros((3, 3))) == 0.0
    assert m.macro_f1(np.diag([3, 0, 2])) == 1.0  # a class never seen nor predicted is left out
    assert m.rare_class_accuracy([0.9, 0.1, 0.3, 0.8], [1, 2]) == pytest.approx(0.2)
    assert m.rare_class_accuracy([[0.9, 0.1], [0.5, 0.7]], [1]) == pytest.approx([0.1, 0.7])


def test_zscores_standardise_each_round_and_are_zero_for_constant_rounds():
    z = m.zscores([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]])
    assert z[0] == pytest.approx([-math.sqrt(1.5), 0.0, math.sqrt(1.5)])
    assert z[1].tolist() == [0.0, 0.0, 0.0]
    assert m.zscores([0.3, 0.3 + 1e-17, 0.3]).tolist() == [0.0, 0.0, 0.0]


def test_auroc_free_riders_lowest_is_one_highest_is_zero():
    free = [False, False, True, False]
    assert m.auroc([0.3, 0.2, 0.1, 0.4], free) == 1.0
    assert m.auroc([0.3, 0.2, 0.9, 0.4], free) == 0.0
    assert m.auroc([0.3, 0.2, 0.25, 0.4], free) == pytest.approx(2 / 3)  # below 2 of the 3 benign
    assert m.auroc([0.5, 0.5, 0.5, 0.5], free) == 0.5
    assert m.auroc([[0.3, 0.2, 0.1, 0.4], [1, 1, 1, 1]], free) == pytest.approx([1.0, 0.5])
    with pytest.raises(ValueError, match="one free-rider and one benign"):
        m.auroc([1, 2], [False, False])


def test_fpr_counts_flagged_benign_clients():
    free = [True, False, False, False]
    z = [-2.0, -1.0, 0.5, 0.5]
    assert m.fpr_at_thresholds(z, free, [-3, -1.5, -0.5, 1.0]).tolist() == [0.0, 0.0, 1 / 3, 1.0]


def test_detection_summary_shapes_and_constant_rounds():
    free = np.array([False, False, False, True, False])
    history = np.array([[0.2, 0.3, 0.25, 0.0, 0.22],
                        [0.2, 0.2, 0.2, 0.2, 0.2],  # degenerate round
                        [-2.0, 0.0, 0.0, 2.0, 0.0]])
    out = m.detection_summary(history, free)
    assert out["thresholds"].shape == (31,) and out["fpr_curve"].shape == (31,)
    assert out["auroc_per_round"].tolist() == [1.0, 0.5, 0.0]
    assert out["auroc"] == pytest.approx(0.5)
    values = [out["auroc"], out["fpr"], *out["fpr_curve"], *out["auroc_per_round"]]
    assert np.isfinite(values).all()
    # benign clients are flagged only in round 3: client 0 (z = -sqrt(2.5)) at thresholds above it
    expected = np.where(out["thresholds"] > -math.sqrt(2.5), 0.25, 0.0) / 3
    assert out["fpr_curve"] == pytest.approx(expected)
    assert out["fpr"] == pytest.approx(expected.mean())
    constant = m.detection_summary(np.ones((4, 5)), free, thresholds=[-1.0, 0.0])
    assert constant["auroc"] == 0.5 and constant["fpr_curve"].tolist() == [0.0, 0.0]


# ----------------------------------------------------------------------------- CELM Table 4 definitions


def test_js_distance_by_hand():
    """p = (1, 0), q = (½, ½): m = (¾, ¼), KL(p‖m) = ln(4/3), KL(q‖m) = ½ ln(2/3) + ½ ln 2 = ½ ln(4/3),
    JSD = ½ (ln(4/3) + ½ ln(4/3)) = ¾ ln(4/3) nats; the distance is its square root ≈ 0.46450."""
    assert m.js_distance([1, 0], [1, 1]) == pytest.approx(math.sqrt(0.75 * math.log(4 / 3)))
    assert m.js_distance([1, 0], [1, 1]) == pytest.approx(0.464501, abs=1e-6)
    assert m.js_distance([1, 0], [0, 1]) == pytest.approx(math.sqrt(math.log(2)))  # disjoint: sqrt(ln 2)
    assert m.js_distance([1, 0], [0, 1], base=2) == pytest.approx(1.0)
    assert m.js_distance([3, 1], [3, 1]) == 0.0
    assert m.js_distance([1, 0], [1, 1]) ** 2 / math.log(2) == pytest.approx(m.jsd([1, 0], [1, 1]))


def test_emd_classes_by_hand():
    # (1, 0, 0) vs (0, 0, 1): |F_p - F_q| = (1, 1, 0), sum 2, over C - 1 = 2 -> 1
    assert m.emd_classes([1, 0, 0], [0, 0, 1]) == pytest.approx(1.0)
    # (1, 0, 0) vs uniform: (2/3, 1/3, 0) -> 1 / 2 = 0.5; (0, 1, 0) vs uniform: (1/3, 1/3, 0) -> 1/3
    assert m.emd_classes([1, 0, 0], [1, 1, 1]) == pytest.approx(0.5)
    rows = m.emd_classes([[1, 0, 0], [0, 1, 0]], [[1, 1, 1], [1, 1, 1]], weights=[3, 1])
    assert rows == pytest.approx((3 * 0.5 + 1 / 3) / 4)  # weighted by 3 : 1
    with pytest.raises(ValueError, match="weights must be 2 non-negative numbers"):
        m.emd_classes([[1, 0], [0, 1]], [[1, 1], [1, 1]], weights=[1, -1])


def test_joint_distances_by_hand():
    """Counts [[2, 0], [0, 2]] against the uniform matrix. Joint cells p = (½, 0, 0, ½), u = ¼ each:
    JSD as above, sqrt(¾ ln(4/3)); Hellinger: BC = 2 sqrt(½ · ¼) = 1/√2, H = sqrt(1 - 1/√2) ≈ 0.54120;
    EMD: each client row (1, 0) or (0, 1) against (½, ½) moves ½ over one class step (C - 1 = 1) -> ½."""
    d = m.joint_distances([[2, 0], [0, 2]], np.ones((2, 2)))
    assert d["JSD"] == pytest.approx(math.sqrt(0.75 * math.log(4 / 3)))
    assert d["Hellinger"] == pytest.approx(math.sqrt(1 - 1 / math.sqrt(2)))
    assert d["EMD"] == pytest.approx(0.5)
    assert m.joint_distances([[2, 0], [0, 2]], [[4, 0], [0, 4]]) == {"JSD": 0.0, "EMD": 0.0, "Hellinger": 0.0}
    with pytest.raises(ValueError, match=r"true_counts and other must be \[N, C\]"):
        m.joint_distances([[1, 2]], [[1, 2, 3]])


def test_joint_hellinger_of_equal_size_label_skew_by_hand():
    """N clients of equal size, client i spread evenly over k_i of C classes: a held cell has mass
    1/(N k_i), the uniform cell 1/(N C), so BC = (1/N) Σ_i sqrt(k_i / C) and H = sqrt(1 - BC).
    k = (1, 3, 6, 8, 10): BC = (√.1 + √.3 + √.6 + √.8 + 1)/5 = 0.706595, H = 0.541669 (our PLS);
    k = (1, 3, 4, 8, 8): BC = (√.1 + √.3 + √.4 + 2 √.8)/5 = 0.657052, H = 0.585617 (the paper's 0.586)."""
    for ks, expected in (((1, 3, 6, 8, 10), 0.541669), ((1, 3, 4, 8, 8), 0.585617)):
        counts = np.zeros((5, 10))
        for i, k in enumerate(ks):
            counts[i, :k] = 120 / k
        assert m.joint_distances(counts, np.ones_like(counts))["Hellinger"] == pytest.approx(expected, abs=1e-6)
