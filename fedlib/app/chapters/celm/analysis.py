"""The CELM chapter's analyses: pure functions on run results and split counts (no page, no store).

Maverick readings' calibration, Table 4's Uniform column (``split_counts``, the PLS allocation search),
best-method counts, why a baseline falls short (``diagnose_baseline``) and the CFFL study's table.
pandas is imported inside the functions that build frames.
"""

from __future__ import annotations

from itertools import combinations_with_replacement
from typing import Any

import numpy as np

from .... import partition
from ....metrics import joint_distances
from ...kit import frames
from .protocol import (
    CFFL_STUDY_BASELINE,
    _only_held_by,
    keeps_rare,
    rare_class_accuracy,
    score_history,
)


def calibrate_maverick_readings(rows: list[tuple[str, Any]], results: dict[str, Any], paper: dict[str, float]):
    """Every reading of ``rows`` (``maverick_reading_configs``) against the paper's uniform FedAvg in Table 2.

    Rule (FedAvg only, never CELM): among the readings that keep the Maverick's classes rare
    (``keeps_rare``: the text calls them rare, so a reading that does not is not the paper's), the one with
    the smallest mean |ours − paper| over the two cells Table 2 prints, balanced accuracy and rare-class
    accuracy (``paper``: those two values); a tie goes to the earlier reading. Returns (frame: ours, the
    gaps and whether each reading is permitted; the chosen reading or None while no permitted reading has
    a run)."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    lines = []
    for reading, config in rows:
        run = results.get(config.key())
        ours = {"Balanced Acc.": 100 * run.final["balanced_accuracy"] if run is not None else float("nan"),
                "Rare Class Acc.": rare_class_accuracy(run) if run is not None else float("nan")}
        line: dict[str, Any] = {"reading": reading}
        for metric, value in ours.items():
            line[f"{metric} ours"], line[f"{metric} paper"] = value, paper[metric]
        gaps = [abs(ours[m] - paper[m]) for m in ours if np.isfinite(ours[m])]
        line["mean |ours − paper|"] = float(np.mean(gaps)) if len(gaps) == len(ours) else float("nan")
        line["keeps its classes rare"] = keeps_rare({"name": config.split.name, **config.split.params})
        lines.append(line)
    frame = pd.DataFrame(lines).set_index("reading")
    measured = frame.loc[frame["keeps its classes rare"], "mean |ours − paper|"].dropna()
    return frame, (None if measured.empty else measured.index[int(np.argmin(measured.to_numpy()))])

# ----------------------------------------------------------------------------- Table 4, Uniform column

# Table 4's rows: (dataset label, paper row, split label); the Uniform column needs only the split.
# Full training sets: Fashion-MNIST 6,000 and CIFAR-10 5,000 images per class, 5 clients.
TABLE4_ROWS = (("F.MNIST", "Dir. (0.05)", "Dir(0.05)"), ("F.MNIST", "PLS", "PLS"),
               ("CIFAR-10", "Dir. (0.01)", "Dir(0.01)"), ("CIFAR-10", "SLS", "SLS"))
CLASS_SIZES = {"F.MNIST": 6000, "CIFAR-10": 5000}
# Equal-size PLS splits (k_i classes, samples split evenly) whose Uniform JSD and Hellinger
# round to the paper's 0.508 and 0.586 (found by `pls_class_count_search`).
PLS_MATCHES = ((1, 3, 4, 8, 8), (2, 2, 6, 6, 7), (2, 3, 4, 5, 9))


def split_counts(spec: dict[str, Any], class_size: int, n_clients: int = 5, n_classes: int = 10,
                 seed: int = 0) -> np.ndarray:
    """The client x class counts of a split spec on a balanced label set (no data needed)."""
    labels = np.repeat(np.arange(n_classes), class_size)
    params = {k: v for k, v in spec.items() if k != "name"}
    return getattr(partition, spec["name"])(labels, n_clients=n_clients, seed=seed, **params).counts


def _even_counts(classes_per_client, sizes) -> np.ndarray:
    """Client i holds sizes[i] samples spread evenly over k_i classes (which classes does not
    change the joint JSD or Hellinger)."""
    k, sizes = np.asarray(classes_per_client), np.asarray(sizes, dtype=float)
    columns = np.arange(max(10, int(k.max())))
    return np.where(columns[None, :] < k[:, None], (sizes / k)[:, None], 0.0)


def pls_class_count_search(target: tuple[float, float] = (0.508, 0.586), n_clients: int = 5,
                           n_classes: int = 10, tolerance: float = 5e-4) -> list[tuple[int, ...]]:
    """Every equal-size PLS allocation k_1 <= ... <= k_N (k_i in 1..C, Σ k_i >= C, samples
    split evenly) whose Uniform (JSD, Hellinger) under ``metrics.joint_distances`` is within
    ``tolerance`` of ``target``. Vectorized over the allocations."""
    ks = np.array([k for k in combinations_with_replacement(range(1, n_classes + 1), n_clients)
                   if sum(k) >= n_classes])
    cells = 1.0 / (n_clients * ks)  # the joint mass of a held cell, [A, N]
    u = 1.0 / (n_clients * n_classes)
    m = 0.5 * (cells + u)
    kl_p = (ks * cells * np.log(cells / m)).sum(1)
    kl_q = (ks * u * np.log(u / m)).sum(1) + (n_clients * n_classes - ks.sum(1)) * u * np.log(2.0)
    jsd = np.sqrt(0.5 * (kl_p + kl_q))
    bhattacharyya = (ks * np.sqrt(cells * u)).sum(1)
    hel = np.sqrt(np.clip(1.0 - bhattacharyya, 0.0, None))
    hits = (np.abs(jsd - target[0]) <= tolerance) & (np.abs(hel - target[1]) <= tolerance)
    return [tuple(int(v) for v in k) for k in ks[hits]]


def choose_pls_allocation(matches, target: tuple[float, float] = (0.508, 0.586)) -> tuple[tuple[int, ...], str]:
    """The PLS allocation among ``matches`` (each reproduces the paper's Uniform JSD and Hellinger):
    first the ones in which every client holds a different number of classes (CELM §5: PLS 'assigns
    different numbers of classes to different clients'), then the nearest to the printed values
    (|JSD - 0.508| + |Hellinger - 0.586| on the equal-size counts). The EMD column cannot decide: no
    EMD definition tried reproduces it (``CELM.definitions``). Returns (allocation, the rule applied)."""
    if not matches:
        raise ValueError("choose_pls_allocation: no allocation to choose from")
    distinct = [k for k in matches if len(set(k)) == len(k)]
    pool = distinct or list(matches)

    def gap(k):
        counts = _even_counts(k, np.ones(len(k)))
        d = joint_distances(counts, np.ones_like(counts))
        return abs(d["JSD"] - target[0]) + abs(d["Hellinger"] - target[1])

    best = min(pool, key=gap)
    rule = (f"{len(distinct)} of {len(matches)} give every client a different number of classes"
            + ("; nearest to the printed values among them" if len(pool) > 1 else "")
            + f": k = {', '.join(map(str, best))} (|ΔJSD| + |ΔHellinger| = {gap(best):.5f})")
    return tuple(int(v) for v in best), rule


# ----------------------------------------------------------------------------- tables


def best_counts(rows: list[tuple[str, dict, dict]], source: str, method: str = "celm") -> tuple[int, int, int]:
    """(rows where ``method`` is best in ours (on the seeds the methods share), rows where it is best
    in the paper, rows compared)."""
    def is_best(values):
        return method in frames.best_on_shared_seeds(values)

    compared = [(paper, ours[source]) for _, paper, ours in rows  # the rows ``source`` ran
                if any(v[0] == v[0] for v in ours.get(source, {}).values())]
    return sum(is_best(o) for _, o in compared), sum(is_best(p) for p, _ in compared), len(compared)


# ----------------------------------------------------------------------------- why a baseline falls short

DIAGNOSED = ("cffl", "cgsv", "shapfed")  # baselines whose shortfall the page explains from the run's history


def removal_rounds(result) -> list[int | None]:
    """CFFL: the 1-based round after which each client left the reputable set (None: never),
    from the run's history: the ``removed`` diagnostics where recorded, else the last round a
    client was selected while CFFL selected the whole reputable set."""
    n = len(result.meta["client_sizes"])
    recorded = [h for h in result.history if "removed" in h.get("diagnostics", {})]
    key, source = ("removed", recorded) if recorded else ("selected", result.history)
    clients = [np.asarray((h["diagnostics"] if recorded else h)[key], dtype=int) for h in source]  # per round
    rounds = np.repeat([h["round"] for h in source], [len(c) for c in clients])
    last = np.full(n, -1)
    np.maximum.at(last, np.concatenate(clients + [np.zeros(0, dtype=int)]), rounds)  # latest round per client
    if recorded:
        return [None if r < 0 else int(r) + 1 for r in last]
    return [None if r >= result.history[-1]["round"] else int(r) + 1 for r in last]


def diagnose_baseline(result, method: str) -> tuple[str, "Any"]:
    """(one-paragraph explanation, per-client table) of a baseline run, read from its history:
    CFFL's removal rounds, CGSV's reputation concentration, ShapFed's weights (per class where
    the run recorded them). The table lists, per client, the classes it holds and the rule's
    final numbers."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    counts = np.asarray(result.meta["client_class_counts"])
    held = [", ".join(str(c) for c in np.flatnonzero(row)) for row in counts]
    table = pd.DataFrame({"client": range(len(held)), "samples": counts.sum(1), "classes held": held})
    rounds = len(result.history)
    if method == "cffl":
        removed = removal_rounds(result)
        table["removed after round"] = ["—" if r is None else r for r in removed]
        gone_mask = np.asarray([r is not None for r in removed])
        gone = np.flatnonzero(gone_mask).tolist()
        lost = _only_held_by(counts, gone_mask)
        text = (f"CFFL removed {len(gone)} of {len(held)} clients "
                + (f"(after rounds {', '.join(str(removed[i]) for i in gone)}); " if gone else "; ")
                + (f"classes {', '.join(map(str, lost))} were held only by removed clients, so the global model "
                   f"stops learning them. This is CFFL's reputation threshold at work: a client whose upload "
                   f"scores low on the server's validation set (e.g. one holding a single class) falls below "
                   f"coef/|R| (coef = 1/3, or their 1/6 on a label-imbalance split) and is excluded for good."
                   if lost else "no class was lost with them."))
    elif method == "cgsv":
        scores = score_history(result)
        final = scores[-1]
        table["final reputation"] = np.round(final, 3)
        effective = 1.0 / np.square(final).sum()
        top = int(np.argmax(final))
        crossed = next((i + 1 for i, row in enumerate(scores) if row.max() > 0.5), None)
        text = (f"CGSV's reputations end concentrated: client {top} holds {final[top]:.2f} of the total "
                f"(effective number of clients {effective:.1f} of {len(final)})"
                + (f"; one client passed half of the total in round {crossed}" if crossed else "")
                + ". Reputations grow with the cosine between a client's update and the reputation-weighted "
                  "aggregate, so the clients whose updates form that aggregate keep gaining and the others, "
                  "whose labels differ, lose weight in every later step.")
    elif method == "shapfed":
        weights = np.asarray(result.history[-1]["weights"], dtype=float)
        clients = np.asarray(result.history[-1]["aggregated"])
        final_weights = np.zeros(len(held))
        final_weights[clients] = weights
        table["final weight"] = np.round(final_weights, 3)
        per_class = next((np.asarray(h["diagnostics"]["class_values"]) for h in reversed(result.history)
                          if "class_values" in h.get("diagnostics", {})), None)
        weak = np.flatnonzero(final_weights < 0.05).tolist()
        if per_class is not None:
            for c in range(per_class.shape[1]):
                table[f"σ class {c}"] = np.round(per_class[:, c], 2)
        lost = _only_held_by(counts, final_weights < 0.05)
        text = (f"ShapFed's final weights give {len(weak)} client(s) less than 5 % "
                + (f"(clients {', '.join(map(str, weak))}); the classes only they hold ({', '.join(map(str, lost))}) "
                   f"barely reach the global model. " if lost else "; ")
                + "A client's weight is the mean over classes of the cosine between its classifier rows and the "
                  "weighted coalition's, so a client whose head points elsewhere (other labels) is weighted down "
                  f"in every later round (over {rounds} rounds here).")
    else:
        raise ValueError(f"diagnose_baseline: method must be one of {', '.join(DIAGNOSED)} (got {method!r})")
    return text, table.set_index("client")


def cffl_study_frame(runs: list[tuple[str, Any]], gap_points: float = 5.0):
    """The CFFL study's table, conclusion and numbers from ``runs`` [(label, result)]: uniform FedAvg
    first, then ``CFFL_VARIANTS`` in order. Per row the final accuracy, its difference to FedAvg, the
    clients removed and after which (1-based) round (``removal_rounds``). The conclusion: whether CFFL
    with every client kept (removal off) ends within ``gap_points`` of FedAvg, i.e. whether the removal
    threshold is what holds CFFL's server model back."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    fedavg = 100.0 * runs[0][1].final["accuracy"]
    lines, removed, accuracy = [], [], []
    for label, result in runs:
        acc = 100.0 * result.final["accuracy"]
        line = {"run": label, "final accuracy (%)": round(acc, 2), "vs uniform FedAvg (points)": round(acc - fedavg, 2),
                "clients removed": "—", "removed after round (client: round)": "—"}
        if label != CFFL_STUDY_BASELINE:
            rounds = removal_rounds(result)
            gone = [(i, r) for i, r in enumerate(rounds) if r is not None]
            removed.append((len(gone), max((r for _, r in gone), default=None), len(rounds)))
            accuracy.append(acc)
            line["clients removed"] = f"{len(gone)} of {len(rounds)}"
            line["removed after round (client: round)"] = ", ".join(f"{i}: {r}" for i, r in gone) or "—"
        lines.append(line)
    (third, third_last, n), (sixth, sixth_last, _), _ = removed
    third_acc, sixth_acc, off = accuracy

    def removals(count, last, acc):
        return f"{count} of {n} clients" + (f" (the last after round {last})" if count else "") + f", ending at {acc:.1f} %"

    reaches, short = off - fedavg >= -gap_points, third_acc - fedavg < -gap_points
    if not reaches:
        verdict = (f"more than {gap_points:g} points below FedAvg although no client is removed, so the removal "
                   f"threshold (1/3 or 1/6) is not what holds CFFL's server model back; the rest of its rule "
                   f"(clipped, sparsified uploads summed into the server model) does.")
    elif short:
        verdict = (f"keeping every client brings CFFL within {gap_points:g} points of FedAvg, so the removals are "
                   f"what hold it back on this run.")
    else:
        verdict = (f"CFFL ends within {gap_points:g} points of FedAvg (or above it) with and without removal, so "
                   f"this run has no shortfall for the removals to explain.")
    text = (f"Uniform FedAvg ends at {fedavg:.1f} %. With the coefficient 1/3 CFFL removes "
            f"{removals(third, third_last, third_acc)}; with their 1/6, {removals(sixth, sixth_last, sixth_acc)}. "
            f"With removal off it keeps all {n} clients and ends at {off:.1f} % ({off - fedavg:+.1f} points from "
            f"FedAvg): " + verdict)
    values = {"cs_fedavg": fedavg, "cs_third": third_acc, "cs_sixth": sixth_acc, "cs_removed_third": third,
              "cs_removed_sixth": sixth, "cs_off": off, "cs_off_gap": off - fedavg,
              "cs_off_reaches_fedavg": "yes" if reaches else "no"}
    return pd.DataFrame(lines).set_index("run"), text, values
