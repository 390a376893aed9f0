import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from fedlib import partition as P  # noqa: E402
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
    p = P.adversarial(labels, gamma=0.1, seed=0, n_random_data=0)
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
