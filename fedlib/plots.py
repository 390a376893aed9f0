"""Figures for partitions and experiment results.

Functions draw into a given ``ax`` or build a new ``matplotlib.figure.Figure`` without
pyplot (no global figure state; a notebook displays a returned figure, scripts call
``fig.savefig``), and return the Figure.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator, StrMethodFormatter

from fedlib.contributions import contribution_vector
from fedlib.allocation import ROLES

ROLE_COLORS = dict(
    zip(ROLES, ["#4c72b0", "#dd8452", "#c44e52", "#da8bc3", "#8172b3", "#937860", "#55a868"])
)
_MARGINAL_COLOR = "#8c8c8c"


def bubble_plot(counts, roles=None, class_names=None, ax=None, title=None) -> Figure:
    """Client x class allocation bubbles with per-class (top) and per-client (right) totals.

    As CELM Fig. 2: classes on x, clients on y (client 0 on top), bubble area
    proportional to the count. Clients with a non-benign role are coloured (bubbles,
    bars and tick labels) and named in a legend. Markers and labels shrink with the
    number of clients (readable up to ~100). A given subplot ``ax`` is replaced by the
    three panels (main, top, right) in its grid cell; otherwise a new figure is sized
    to the matrix.
    """
    counts = np.asarray(counts)
    n_clients, n_classes = counts.shape
    roles = ["benign"] * n_clients if roles is None else list(roles)
    colors = [ROLE_COLORS.get(role, "black") for role in roles]
    fig, grid = _bubble_grid(ax, n_clients, n_classes)
    main = fig.add_subplot(grid[1, 0])
    top = fig.add_subplot(grid[0, 0], sharex=main)
    right = fig.add_subplot(grid[1, 1], sharey=main)

    _draw_bubbles(main, counts, colors)
    top.bar(np.arange(n_classes), counts.sum(axis=0), color=_MARGINAL_COLOR, width=0.7)
    right.barh(np.arange(n_clients), counts.sum(axis=1), color=colors, height=0.7)
    names = [str(c) for c in range(n_classes)] if class_names is None else list(class_names)
    _label_axes(main, top, right, names, colors)
    _role_legend(fig, grid[0, 1], roles)
    if title:
        top.set_title(title)
    return fig


def _bubble_grid(ax, n_clients, n_classes):
    """Figure and a 2 x 2 grid (in ax's cell or a new figure) whose marginal row and
    column are ~0.9 and ~1.1 inches."""
    if ax is None:
        width = np.clip(1.6 + 0.45 * n_classes, 4.0, 14.0) + 1.5
        height = np.clip(1.6 + 0.18 * n_clients, 3.5, 17.0) + 1.0
        fig = Figure(figsize=(width, height), layout="constrained")
        cell = fig.add_gridspec(1, 1)[0]
    else:
        fig, cell = ax.figure, ax.get_subplotspec()
        ax.remove()
    box = cell.get_position(fig)
    fig_w, fig_h = fig.get_size_inches()
    grid = cell.subgridspec(
        2,
        2,
        width_ratios=[max(box.width * fig_w - 1.1, 1.0), 1.1],
        height_ratios=[0.9, max(box.height * fig_h - 0.9, 1.0)],
        wspace=0.02,
        hspace=0.02,
    )
    return fig, grid


def _draw_bubbles(ax, counts, colors):
    """Bubble area proportional to count; the largest spans ~3/4 of a grid cell."""
    n_clients, n_classes = counts.shape
    box = ax.get_position()
    fig_w, fig_h = ax.figure.get_size_inches()
    cell_pts = 72 * min(box.width * fig_w / n_classes, box.height * fig_h / n_clients)
    max_area = (0.75 * cell_pts) ** 2
    client, cls = np.nonzero(counts)
    sizes = counts[client, cls] / max(counts.max(), 1) * max_area
    ax.scatter(cls, client, s=sizes, c=np.asarray(colors)[client], alpha=0.75, linewidths=0)
    ax.set_xlim(-0.6, n_classes - 0.4)
    ax.set_ylim(n_clients - 0.4, -0.6)
    ax.grid(True, color="#e5e5e5", linewidth=0.5)
    ax.set_axisbelow(True)


def _label_axes(ax, ax_top, ax_right, class_names, colors):
    """Class and client ticks (client labels thinned to <= 40, coloured by role)."""
    n_clients = len(colors)
    slanted = max(len(name) for name in class_names) > 3 or len(class_names) > 15
    ax.set_xticks(
        np.arange(len(class_names)),
        class_names,
        rotation=45 if slanted else 0,
        ha="right" if slanted else "center",
        fontsize=8,
    )
    step = int(np.ceil(n_clients / 40))
    shown = np.arange(0, n_clients, step)
    ax.set_yticks(shown, [str(i) for i in shown], fontsize=max(5, min(8, 320 / n_clients)))
    for tick, client in zip(ax.get_yticklabels(), shown):
        tick.set_color(colors[client])
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax_top.set_ylabel("samples", fontsize=8)
    ax_right.set_xlabel("samples", fontsize=8)
    ax_right.xaxis.set_major_locator(MaxNLocator(3))
    for marginal in (ax_top, ax_right):
        marginal.tick_params(labelsize=7)
        marginal.spines[["top", "right"]].set_visible(False)
    ax_top.tick_params(labelbottom=False)
    ax_right.tick_params(labelleft=False)


def _role_legend(fig, corner, roles):
    """Legend of the roles in the top-right corner, if any client is not benign."""
    present = [role for role in ROLE_COLORS if role in roles and role != "benign"]
    present += sorted(set(roles) - set(ROLE_COLORS))
    if not present:
        return
    handles = [
        Line2D([], [], marker="o", linestyle="", color=ROLE_COLORS.get(role, "black"), label=role)
        for role in ["benign"] + present
    ]
    legend_ax = fig.add_subplot(corner)
    legend_ax.axis("off")
    legend_ax.legend(
        handles=handles,
        loc="center left",
        frameon=False,
        fontsize=7,
        labelspacing=0.25,
        handletextpad=0.2,
        borderaxespad=0.0,
    )


# ----------------------------------------------------------------------------- run results

_RESULT_FIGSIZE = (8.0, 3.5)  # inches: a book page's width


def _result_axes(ax):
    """The given axes and its figure, or a new book-width figure with one axes."""
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=_RESULT_FIGSIZE, layout="constrained")
    return fig, fig.add_subplot()


def accuracy_curves(results, metric="accuracy", ax=None) -> Figure:
    """Test accuracy per round, one line per label of ``results`` (label -> RunResult).

    ``metric`` is a per-round accuracy of the history ("accuracy" or
    "balanced_accuracy"), drawn in percent; rounds are numbered from 1.
    """
    fig, ax = _result_axes(ax)
    for label, result in results.items():
        rounds, values = result.series(metric)
        ax.plot(np.asarray(rounds) + 1, 100 * np.asarray(values, dtype=float), marker="o", markersize=4,
                label=label)
    _round_axes(ax, "round", f"test {metric.replace('_', ' ')}", percent=True, legend=True)
    return fig


def _round_axes(ax, xlabel: str, ylabel: str, percent: bool, legend: bool) -> None:
    """The axes of a per-round figure: integer rounds, a light grid, no top and right spines."""
    ax.set_xlabel(xlabel, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=10)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if percent:
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}%"))
    ax.tick_params(labelsize=9)
    ax.grid(True, color="#e5e5e5", linewidth=0.5)
    ax.spines[["top", "right"]].set_visible(False)
    if legend:
        ax.legend(fontsize=9, frameon=False)


final_contributions = contribution_vector  # the one rule (fedlib.contributions), name kept for the explorer


def true_contributions(result) -> np.ndarray | None:
    """Each client's exact Shapley value in the final round (``RunConfig.reference_values``),
    normalized like :func:`final_contributions` (zero for clients not in that round); None when
    the run did not compute it."""
    reference = result.final.get("reference") if isinstance(result.final, dict) else None
    if not reference:
        return None
    values = np.zeros(len(result.meta["client_sizes"]))
    values[np.asarray(reference["clients"], dtype=int)] = reference["shapley"]
    total = np.abs(values).sum()
    return values / total if total > 0 else values


def contribution_bars(results, ax=None) -> Figure:
    """Grouped bars: per client, each label's final-round contribution (label -> RunResult),
    and beside them the true contribution (hatched, outlined) when the runs computed one.

    See :func:`final_contributions`, :func:`true_contributions` (the exact Shapley value of the
    first result that has it) and :func:`contribution_vs_truth`.
    """
    first = next(iter(results.values()))
    truth = next((t for t in map(true_contributions, results.values()) if t is not None), None)
    vectors = {label: final_contributions(result) for label, result in results.items()}
    return contribution_vs_truth(vectors, truth, first.meta["client_roles"], ax=ax, normalize=False)


def contribution_vs_truth(contributions, truth, roles, ax=None, normalize: bool = True,
                          truth_label: str = "true (exact Shapley)", title: str | None = None) -> Figure:
    """Grouped bars: per client, each label's contribution vector (label -> [N]) and the true
    contribution beside them (hatched, outlined; left out when ``truth`` is None).

    With ``normalize`` every vector (the truth too) is divided by the sum of its absolute
    values, so non-negative contributions sum to 1 and methods on different scales compare;
    NaN (a client a method did not value) is drawn as 0. A dashed line marks the equal share
    1/N; clients with a non-benign role are named and coloured in the ticks.
    """
    fig, ax = _result_axes(ax)
    n_clients = len(roles)

    def prepared(vector):
        v = np.nan_to_num(np.asarray(vector, dtype=float))
        total = np.abs(v).sum()
        return v / total if normalize and total > 0 else v

    groups = len(contributions) + (truth is not None)
    width = 0.8 / groups
    for i, (label, vector) in enumerate(contributions.items()):
        offset = (i - (groups - 1) / 2) * width
        ax.bar(np.arange(n_clients) + offset, prepared(vector), width=width, label=label)
    if truth is not None:
        ax.bar(np.arange(n_clients) + (groups - 1) / 2 * width, prepared(truth), width=width, label=truth_label,
               facecolor="white", edgecolor="black", hatch="///", linewidth=0.8)
    ax.axhline(1 / n_clients, color=_MARGINAL_COLOR, linestyle="--", linewidth=1, label="equal share")
    _client_role_ticks(ax, list(roles))
    ax.set_xlim(-0.6, n_clients - 0.4)
    ax.set_xlabel("client", fontsize=10)
    ax.set_ylabel("contribution" + (" (share)" if normalize else ""), fontsize=10)
    ax.tick_params(labelsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=9, frameon=False, ncols=min(groups + 1, 4), loc="lower left", bbox_to_anchor=(0, 1))
    if title:
        ax.set_title(title, fontsize=10, loc="right")
    return fig


def per_round_curves(frame, ax=None, percent: bool = False, ylabel: str = "") -> Figure:
    """The curve of a table of per-round numbers: one line per numeric column against the
    index (the rounds, numbered as in the table). ``percent`` draws fractions as percents."""
    fig, ax = _result_axes(ax)
    numeric = frame.select_dtypes("number")
    if numeric.empty:
        raise ValueError("per_round_curves: the table has no numeric column")
    scale = 100.0 if percent else 1.0
    for column in numeric.columns:
        ax.plot(np.asarray(frame.index), scale * numeric[column].to_numpy(dtype=float), marker="o", markersize=3,
                label=str(column))
    _round_axes(ax, str(frame.index.name or "round"), ylabel, percent, legend=len(numeric.columns) > 1)
    return fig


def _client_role_ticks(ax, roles):
    """Client ids as x ticks (benign ones thinned to ~30); non-benign ones also name
    their role, in its colour, vertically when there are many clients."""
    n_clients = len(roles)
    step = int(np.ceil(n_clients / 30))
    shown = [i for i, role in enumerate(roles) if role != "benign" or i % step == 0]
    vertical = n_clients > 12
    joiner = " " if vertical else "\n"
    labels = [str(i) if roles[i] == "benign" else f"{i}{joiner}{roles[i]}" for i in shown]
    ax.set_xticks(shown, labels, rotation=90 if vertical else 0, fontsize=9)
    for tick, client in zip(ax.get_xticklabels(), shown):
        if roles[client] != "benign":
            tick.set_color(ROLE_COLORS.get(roles[client], "black"))
