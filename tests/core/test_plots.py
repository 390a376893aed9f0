import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from fedlib import partition as P  # noqa: E402
from fedlib import splits  # noqa: E402
from fedlib.plots import ROLE_COLORS, bubble_plot  # noqa: E402


@pytest.fixture(scope="module")
def labels():
    return np.random.default_rng(0).permutation(np.repeat(np.arange(10), 600))


def test_bubble_plot_axes_bubbles_and_marginals(labels, tmp_path):
    p = P.dirichlet(labels, 5, 0.05, seed=0)
    fig = bubble_plot(p.counts, title="Dirichlet 0.05")
    assert isinstance(fig, Figure)
    main, top, right = fig.axes  # no legend panel when every client is benign
    assert len(main.collections[0].get_offsets()) == np.count_nonzero(p.counts)
    np.testing.assert_array_equal([bar.get_height() for bar in top.patches], p.counts.sum(axis=0))
    np.testing.assert_array_equal([bar.get_width() for bar in right.patches], p.sizes)
    fig.savefig(tmp_path / "dirichlet.png")
    assert (tmp_path / "dirichlet.png").stat().st_size > 10_000


def test_bubble_area_is_proportional_to_count():
    counts = np.array([[100, 0], [25, 50]])
    sizes = bubble_plot(counts).axes[0].collections[0].get_sizes()
    np.testing.assert_allclose(sizes / sizes[0], [1.0, 0.25, 0.5])


def test_bubble_plot_names_non_benign_roles(labels, tmp_path):
    p = splits.adversarial(labels, gamma=0.1, seed=0, n_random_data=0)
    fig = bubble_plot(p.counts, p.roles, class_names=[f"c{i}" for i in range(10)])
    main, top, right, corner = fig.axes
    legend = corner.get_legend()
    names = [text.get_text() for text in legend.get_texts()]
    assert names == ["benign", "maverick", "free_rider", "label_flip", "random_update"]
    bars = right.patches
    assert matplotlib.colors.same_color(bars[48].get_facecolor(), ROLE_COLORS["maverick"])
    assert [t.get_text() for t in main.get_xticklabels()][:2] == ["c0", "c1"]
    client_ticks = {tick.get_text(): tick for tick in main.get_yticklabels()}
    assert client_ticks["48"].get_color() == ROLE_COLORS["maverick"]
    fig.savefig(tmp_path / "adversarial.png")


def test_bubble_plot_into_given_axes_and_many_clients(labels, tmp_path):
    fig = Figure(figsize=(10, 12))
    ax_a, ax_b = fig.subplots(1, 2)
    assert bubble_plot(P.dirichlet(labels, 100, 0.1, seed=0).counts, ax=ax_a, title="100") is fig
    bubble_plot(P.sls(labels, 5, seed=0).counts, ax=ax_b)
    assert len(fig.axes) == 6 and ax_a not in fig.axes  # each cell replaced by 3 panels
    assert len(fig.axes[0].get_yticklabels()) <= 40  # thinned client labels
    fig.savefig(tmp_path / "two.png")


def _result(history, final=None, roles=("benign", "benign", "free_rider")):
    from fedlib.run import RunResult

    return RunResult(config={}, history=history, final=final or {},
                     meta={"client_sizes": [10] * len(roles), "client_roles": list(roles)})


def test_true_contributions_are_the_final_rounds_exact_shapley_normalized():
    from fedlib.plots import true_contributions

    assert true_contributions(_result([])) is None
    # clients 0 and 2 were in the final round with Shapley 0.3 and 0.1: 0.75 and 0.25 of the total
    truth = true_contributions(_result([], {"reference": {"clients": [0, 2], "shapley": [0.3, 0.1]}}))
    np.testing.assert_allclose(truth, [0.75, 0.0, 0.25])


def test_contribution_bars_put_the_true_contribution_beside_the_methods():
    from fedlib.plots import contribution_bars

    history = [{"round": 0, "scores": [2.0, 1.0, 1.0], "aggregated": [0, 1, 2], "weights": [0.5, 0.25, 0.25]}]
    with_truth = _result(history, {"reference": {"clients": [0, 1, 2], "shapley": [0.2, 0.2, 0.0]}})
    fig = contribution_bars({"a": _result(history), "b": with_truth})
    ax = fig.axes[0]
    bars = [p for p in ax.patches]
    assert len(bars) == 9  # 3 clients x (2 methods + the truth)
    truth_heights = [b.get_height() for b in bars if b.get_hatch() == "///"]
    np.testing.assert_allclose(truth_heights, [0.5, 0.5, 0.0])
    assert "true (exact Shapley)" in [t.get_text() for t in ax.get_legend().get_texts()]
    without = contribution_bars({"a": _result(history)})
    assert len(without.axes[0].patches) == 3 and not [p for p in without.axes[0].patches if p.get_hatch()]


def test_per_round_curves_draw_each_numeric_column_of_a_table():
    import pandas as pd

    from fedlib.plots import per_round_curves

    frame = pd.DataFrame({"FedAvg": [0.5, 0.6, 0.7], "CELM": [0.4, 0.65, 0.75], "note": ["a", "b", "c"]},
                         index=pd.Index([1, 2, 3], name="round"))
    ax = per_round_curves(frame, percent=True).axes[0]
    assert [line.get_label() for line in ax.lines] == ["FedAvg", "CELM"]
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [40.0, 65.0, 75.0])
    assert ax.get_xlabel() == "round"
    with pytest.raises(ValueError, match="no numeric column"):
        per_round_curves(frame[["note"]])


def test_contribution_vs_truth_normalizes_each_vector_and_draws_nan_as_zero():
    from fedlib.plots import contribution_vs_truth

    fig = contribution_vs_truth({"m": [2.0, np.nan, 2.0]}, [1.0, 1.0, 2.0], ["benign", "maverick", "benign"])
    heights = [p.get_height() for p in fig.axes[0].patches]
    np.testing.assert_allclose(heights, [0.5, 0.0, 0.5, 0.25, 0.25, 0.5])  # m, then the truth
    assert fig.axes[0].get_ylabel() == "contribution (share)"
