"""The CELM chapter: logit-maximization contribution estimation and its baselines.

Experiments (CELM §5–6 and Appendix B–C), each a list of run configs sharing one protocol
(5 clients, the 4-layer MLP on Fashion-MNIST, 1 local epoch, batch 128, SGD lr 0.1
decayed x0.1 at half the rounds):
  table1  accuracy under Dir(0.01/0.05/0.10), PLS, SLS            (Table 1)
  table1_cifar10  the same on CIFAR-10 with the 5-layer CNN, when the data root has it
  table2  balanced and rare-class accuracy under a Maverick split   (Table 2)
  table3  free-rider detection (z-score rule) under FR and FRM      (Table 3, Fig. 4)
  table4  fidelity of CELM's evidence to the true client-class counts (Table 4, Fig. 5)
  table5  an IID federation, Dir(100)                               (Table 5)
  table6  20 clients                                                (Table 6)
  table7  EMNIST (balanced, 47 classes) under the same splits, when the data root has it (Table 7)
  table8  the warm-up horizon T_w / T                               (Table 8)
  fig6    sensitivity to the probe steps L and Adam step size eta   (Fig. 6)
  fig7    the final probe images                                    (Fig. 7)
  cffl_study  CFFL's removals at coefficient 1/3 and 1/6 and with removal off, beside uniform
              FedAvg, on one reduced run (``cffl_study``: split, fraction, rounds, lr milestones, seed)
  cifar10_readings   uniform FedAvg under readings of the CIFAR-10 recipe the paper leaves open
  maverick_readings  uniform FedAvg under readings of §6.1's Maverick split (how much of its rare
                     classes a Maverick holds), seed 0: the Table 2 reading the paper's FedAvg supports

PLS holds the class allocation ``PLS_ALLOCATION`` (k_i classes for client i), the one chosen by
``choose_pls_allocation`` among those that reproduce Table 4's Uniform column; CFFL runs with
``split_kind = "label_imbalance"`` (its authors' 1/6 removal coefficient) on PLS and SLS.

Table 7 (App. B.3) states only EMNIST's 47 classes and 5 clients; the rest of its protocol is our reading:
the chapter's own (the profile's model, rounds, lr schedule, batch, seeds and Table 1's splits) on
EMNIST balanced, PLS and SLS by the partition's step rule over the 47 classes (``PLS_ALLOCATION`` is a
10-class allocation), see ``table7_split``.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from functools import partial
from typing import Any

import numpy as np

from ... import partition
from ...config import RunConfig, make_config
from ...contributions import contribution_history
from ...data import data_missing
from ...methods import build_method
from ...results import RunResult
from ...stats import mean_std, pm
from ..kit import frames
from ..kit.claim_types import Claim, Comparison, Side, cells_row
from ..kit.items import items_of, run_round
from ..kit.pages import PROSE_SYMBOLS
from ..kit.sources import reference_value
from ..kit.stored import stored_results
from . import Paper, readings, resolved_methods, run_options, unique_configs
from .base import OURS_STORED, Chapter, dataset_label, queue_item
from .profiles import FederationProfile, Names, Part, Seeds

METHOD_LABELS = {"fedavg_uniform": "FedAvg", "cffl": "CFFL", "cgsv": "CGSV", "shapfed": "ShapFed", "celm": "CELM"}
DETECTORS = ("cffl", "cgsv", "shapfed", "celm")  # methods with contribution scores (Table 3)

# PLS: classes per client, the allocation that reproduces Table 4's Uniform column, chosen by
# ``choose_pls_allocation`` among ``pls_class_count_search()``'s (tests/test_celm.py checks both).
PLS_ALLOCATION = (2, 3, 4, 5, 9)

# split label -> (split spec, CELM table row without the dataset prefix)
SPLITS: dict[str, tuple[dict[str, Any], str]] = {
    "Dir(0.01)": ({"name": "dirichlet", "alpha": 0.01}, "Dir. (0.01)"),
    "Dir(0.05)": ({"name": "dirichlet", "alpha": 0.05}, "Dir. (0.05)"),
    "Dir(0.10)": ({"name": "dirichlet", "alpha": 0.1}, "Dir. (0.10)"),
    "PLS": ({"name": "pls", "classes_per_client": list(PLS_ALLOCATION)}, "PLS"),
    "SLS": ({"name": "sls"}, "SLS"),
    "IID": ({"name": "dirichlet", "alpha": 100.0}, "IID"),
}
# Splits whose clients hold different numbers of classes: CFFL's authors' 'classimbalance' kind,
# where their removal coefficient is 1/6 (fedlib.methods.fairness.CFFL.split_kind).
LABEL_IMBALANCE_SPLITS = ("pls", "sls")
MAVERICK = {"name": "celm_maverick"}
# Table 7 (App. B.3): EMNIST balanced, 47 classes (fedlib.data's ``emnist``), as the paper's rows name it.
TABLE7_DATASET, TABLE7_PREFIX = "emnist", "EMNIST"


def run_config(params: dict[str, Any], split: dict, method: str, seed: int, n_clients: int | None = None,
               cifar10: bool = False, dataset: str | None = None, **method_params) -> RunConfig:
    """One run of the chapter's protocol (``cifar10``: the CIFAR-10 variant of Table 1,
    the CNN with its own data fraction, rounds and lr milestones; ``dataset``: another dataset under
    the profile's own protocol, e.g. Table 7's EMNIST)."""
    spec = {"name": method, **params.get("method_params", {}).get(method, {}), **method_params}
    if method == "cffl" and split["name"] in LABEL_IMBALANCE_SPLITS:
        spec.setdefault("split_kind", "label_imbalance")
    data = {f: params[("cifar10_" if cifar10 else "") + f] for f in ("fraction", "rounds", "lr_milestones")}
    fields = dict(
        **data, dataset="cifar10" if cifar10 else (dataset or params["dataset"]),
        model="cnn" if cifar10 else params["model"],
        n_clients=n_clients or params["n_clients"], lr=params["lr"], batch_size=params["batch_size"],
        local_epochs=params["local_epochs"], test_samples=params["test_samples"],
        server_val=params.get("server_val"), split=split, method=spec, seed=seed, **run_options(params),
    )
    return make_config(**{**fields, **(readings.recipe(params) if cifar10 else {})})


def table7_split(split: str) -> dict[str, Any]:
    """Table 7's spec of a split label: ``SPLITS``' own, except PLS and SLS, whose class counts follow the
    partition's step rule over EMNIST's 47 classes (k = 1, 13, 24, 36, 47 for 5 clients; ``partition.pls``):
    ``PLS_ALLOCATION`` covers only 23 classes, and the paper gives no EMNIST allocation."""
    spec = SPLITS[split][0]
    return {"name": spec["name"]} if spec["name"] in LABEL_IMBALANCE_SPLITS else spec


def table7_configs(params: dict[str, Any]) -> list[RunConfig]:
    """Table 7's runs: every method and seed of the profile on EMNIST under each of its ``splits``."""
    return [run_config(params, table7_split(s), m, seed, dataset=TABLE7_DATASET)
            for s in params["splits"] for m in params["methods"] for seed in params["seeds"]]


def experiment_configs(params: dict[str, Any], experiment: str) -> list[RunConfig]:
    """The runs of one experiment (see the module docstring)."""
    seeds, methods = params["seeds"], params["methods"]
    if experiment in ("table1", "table1_cifar10"):
        return [run_config(params, SPLITS[s][0], m, seed, cifar10=experiment == "table1_cifar10")
                for s in params["splits"] for m in methods for seed in seeds]
    if experiment == "table2":
        return [run_config(params, table2_split(params), m, seed) for m in methods for seed in seeds]
    if experiment == "table3":
        return [run_config(params, spec, m, seed) for spec in detection_splits(params).values()
                for m in methods if m in DETECTORS for seed in seeds]
    if experiment == "table4":
        return [run_config(params, SPLITS[s][0], "celm", seed) for s in params["fidelity_splits"] for seed in seeds]
    if experiment == "table5":
        return [run_config(params, SPLITS["IID"][0], m, seed) for m in methods for seed in seeds]
    if experiment == "table6":
        return [run_config(params, SPLITS[s][0], m, seed, n_clients=params["many_clients"])
                for s in params["many_client_splits"] for m in methods for seed in seeds]
    if experiment == "table7":
        return table7_configs(params)
    if experiment == "table8":
        return [run_config(params, SPLITS[s][0], "celm", seed, warmup_fraction=f)
                for s in params["warmup_splits"] for f in params["warmup_fractions"] for seed in seeds]
    if experiment == "fig6":
        return [run_config(params, SPLITS[params["sensitivity_split"]][0], "celm", seeds[0], lm_steps=steps,
                           lm_lr=lr) for steps in params["lm_steps_grid"] for lr in params["lm_lr_grid"]]
    if experiment == "fig7":
        return [run_config(params, SPLITS["PLS"][0], "celm", seeds[0], keep_probe_images=True)]
    if experiment == "cffl_study":
        return [config for _, config in cffl_study_configs(params)]
    if experiment == "cifar10_readings":
        return [config for *_, config in cifar10_reading_configs(params)]
    if experiment == "maverick_readings":
        return [config for _, config in maverick_reading_configs(params)]
    raise ValueError(f"experiments: unknown experiment {experiment!r}")


# §6.1 says a Maverick holds classes "absent globally", "rare but informative", but not how many of their
# samples it holds (Fig. 3a's bubbles give no count), nor whether it also holds common classes. Each
# reading is a split: the share of each rare class the Maverick keeps (``celm_maverick``'s
# ``rare_fraction``), or a Maverick that also shares the common classes (``celm_maverick_shared``).
# The first is the chapter's protocol so far (Table 2's own run).
MAVERICK_READINGS: dict[str, dict[str, Any]] = {
    "a Maverick keeps 10 % of each rare class": MAVERICK,
    "25 % of each rare class": {**MAVERICK, "rare_fraction": 0.25},
    "50 % of each rare class": {**MAVERICK, "rare_fraction": 0.5},
    "the whole of each rare class": {**MAVERICK, "rare_fraction": 1.0},
    "the Maverick also shares the common classes, 10 % of each rare class":
        {"name": "celm_maverick_shared", "rare_fraction": 0.1},
    "the Maverick also shares the common classes, the whole of each rare class": {"name": "celm_maverick_shared"},
}


def table2_reading(params: dict[str, Any]) -> str:
    """The profile's ``table2_reading`` (absent: the first reading, the chapter's split so far)."""
    name = params.get("table2_reading", next(iter(MAVERICK_READINGS)))
    if name not in MAVERICK_READINGS:
        raise ValueError(f"table2_reading: must be one of {', '.join(map(repr, MAVERICK_READINGS))} (got {name!r})")
    return name


def table2_split(params: dict[str, Any]) -> dict[str, Any]:
    """Table 2's Maverick split under the profile's ``table2_reading``."""
    return MAVERICK_READINGS[table2_reading(params)]


def rare_fraction(spec: dict[str, Any]) -> float:
    """The share of each of its classes a Maverick split's Maverick keeps (the split's default if unset)."""
    return float(spec.get("rare_fraction", partition.split_defaults(spec["name"])["rare_fraction"]))


def keeps_rare(spec: dict[str, Any]) -> bool:
    """Whether a Maverick reading keeps the Maverick's classes rare, as §6.1 calls them ("rare but
    informative", "minority-class"): each holds fewer samples in the federation than any common class.
    Fashion-MNIST's and CIFAR-10's classes are equal in size, so that is a share below the whole class."""
    return rare_fraction(spec) < 1


def detection_splits(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Table 3's FR and FRM splits. FRM's Maverick is Table 2's (``table2_split``): the same share of its
    two classes, sharing the common classes or not, so the chapter has one Maverick (issue 44)."""
    maverick = table2_split(params)
    frm: dict[str, Any] = {"name": "celm_free_rider", "with_maverick": True}
    if rare_fraction(maverick) != partition.split_defaults("celm_free_rider")["rare_fraction"]:
        frm["rare_fraction"] = rare_fraction(maverick)
    if maverick["name"] == "celm_maverick_shared":
        frm["maverick_shares_common"] = True
    return {"FR": {"name": "celm_free_rider"}, "FRM": frm}


def maverick_reading_configs(params: dict[str, Any], seed: int | None = None) -> list[tuple[str, RunConfig]]:
    """(reading, config): uniform FedAvg's Table 2 run under each of ``MAVERICK_READINGS``, on one seed
    (default the profile's first); the first reading is Table 2's own FedAvg run."""
    seed = params["seeds"][0] if seed is None else seed
    return [(reading, run_config(params, split, "fedavg_uniform", seed)) for reading, split in MAVERICK_READINGS.items()]


def calibrate_maverick_readings(rows: list[tuple[str, Any]], results: dict[str, Any], paper: dict[str, float]):
    """Every reading of ``rows`` (``maverick_reading_configs``) against the paper's uniform FedAvg in Table 2.

    Rule (FedAvg only, never CELM): among the readings that keep the Maverick's classes rare
    (``keeps_rare``: the text calls them rare, so a reading that does not is not the paper's), the one with
    the smallest mean |ours − paper| over the two cells Table 2 prints, balanced accuracy and rare-class
    accuracy (``paper``: those two values); a tie goes to the earlier reading. Returns (frame: ours, the
    gaps and whether each reading is permitted; the chosen reading or None while no permitted reading has
    a run)."""
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


def cifar10_reading_configs(params: dict[str, Any], seed: int | None = None) -> list:
    """(split, reading, config): uniform FedAvg's CIFAR-10 Table 1 run on the profile's
    ``cifar10_reading_splits`` (default the headline Dir(0.05)) under each reading of the CIFAR-10 recipe
    the paper leaves open (``fedlib.app.chapters.readings``; issue 30), on one seed (default the first), each
    changing the original recipe whichever the profile adopted (``cifar10_reading``)."""
    seed = params["seeds"][0] if seed is None else seed
    base = readings.screen_params(params)
    return readings.reading_configs(lambda s: run_config(base, SPLITS[s][0], "fedavg_uniform", seed, cifar10=True),
                                    params.get("cifar10_reading_splits", ["Dir(0.05)"]))


configs = partial(unique_configs, experiment_configs)  # every run once (e.g. Table 8's 5 % is Table 1's CELM)


# ----------------------------------------------------------------------------- reading runs


def maverick_classes(result) -> list[int]:
    """Classes held only by Maverick clients (from the run's client x class counts)."""
    return _only_held_by(np.asarray(result.meta["client_class_counts"]),
                         np.asarray(result.meta["client_roles"]) == "maverick")


def rare_class_accuracy(result) -> float:
    rare = maverick_classes(result)
    per_class = np.asarray(result.final["per_class_accuracy"])
    return float(100.0 * per_class[rare].mean()) if rare else float("nan")


score_history = contribution_history  # [rounds, clients] recorded scores (fedlib.contributions)


def free_riders(result) -> np.ndarray:
    roles = result.meta["client_roles"]
    return np.isin(np.asarray(roles, dtype=object), ("free_rider", "weak_free_rider"))


def last_evidence(result) -> np.ndarray | None:
    """CELM's evidence matrix Q [clients, classes] of the last warm-up round."""
    rows = [h["diagnostics"]["evidence"] for h in result.history if "evidence" in h.get("diagnostics", {})]
    return np.asarray(rows[-1], dtype=float) if rows else None


def fidelity(result) -> dict[str, float]:
    """Table 4 for one CELM run: ``metrics.joint_distances`` between the true client x class
    counts and (i) the uniform matrix, (ii) CELM's evidence Q of the last warm-up round.
    Keys "JSD Uniform", "EMD CELM", ... (NaN for CELM when the run has no evidence)."""
    from ...metrics import joint_distances

    true, q = np.asarray(result.meta["client_class_counts"], dtype=float), last_evidence(result)
    uniform = joint_distances(true, np.ones_like(true))
    celm = joint_distances(true, q) if q is not None and q.sum() > 0 else dict.fromkeys(uniform, float("nan"))
    return {f"{m} {s}": d[m] for m in uniform for s, d in (("Uniform", uniform), ("CELM", celm))}


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
    from itertools import combinations_with_replacement

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
    from ...metrics import joint_distances

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


def _only_held_by(counts: np.ndarray, clients: np.ndarray) -> list[int]:
    """Classes held by some of the masked clients and by none of the others."""
    inside, outside = counts[clients].sum(0) > 0, counts[~clients].sum(0) > 0
    return np.flatnonzero(inside & ~outside).tolist()


def diagnose_baseline(result, method: str) -> tuple[str, "Any"]:
    """(one-paragraph explanation, per-client table) of a baseline run, read from its history:
    CFFL's removal rounds, CGSV's reputation concentration, ShapFed's weights (per class where
    the run recorded them). The table lists, per client, the classes it holds and the rule's
    final numbers."""
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


# ----------------------------------------------------------------------------- CFFL's removals, one reduced run

# (row label, CFFL hyper-parameters): the removal coefficient explicit in every row.
CFFL_VARIANTS = (("CFFL, coefficient 1/3", {"split_kind": "other"}),
                 ("CFFL, coefficient 1/6 (their label-imbalance value)", {"split_kind": "label_imbalance"}),
                 ("CFFL, removal off", {"split_kind": "other", "threshold": 0.0}))
CFFL_STUDY_BASELINE = "uniform FedAvg"


def cffl_study_configs(params: dict[str, Any]) -> list[tuple[str, RunConfig]]:
    """(row label, config) of the CFFL study: uniform FedAvg and the ``CFFL_VARIANTS`` on the profile's
    ``cffl_study`` protocol (split label, fraction, rounds, lr milestones, seed; the rest as the profile)."""
    study = params["cffl_study"]
    protocol = {**params, **{k: study[k] for k in ("fraction", "rounds", "lr_milestones")}}
    spec, seed = SPLITS[study["split"]][0], int(study["seed"])
    return [(CFFL_STUDY_BASELINE, run_config(protocol, spec, "fedavg_uniform", seed))] + [
        (label, run_config(protocol, spec, "cffl", seed, **options)) for label, options in CFFL_VARIANTS]


def cffl_study_frame(runs: list[tuple[str, Any]], gap_points: float = 5.0):
    """The CFFL study's table, conclusion and numbers from ``runs`` [(label, result)]: uniform FedAvg
    first, then ``CFFL_VARIANTS`` in order. Per row the final accuracy, its difference to FedAvg, the
    clients removed and after which (1-based) round (``removal_rounds``). The conclusion: whether CFFL
    with every client kept (removal off) ends within ``gap_points`` of FedAvg, i.e. whether the removal
    threshold is what holds CFFL's server model back."""
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


# ----------------------------------------------------------------------------- the results queue


def queue_items(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.app.queue), labelled with
    the paper cell it backs; headline rows: Dir(0.05) (Tables 1, 6), PLS (Table 4)."""
    prefix = dataset_label(params["dataset"])
    labels = {(spec["name"], spec.get("alpha")): row for spec, row in SPLITS.values()}  # the splits' rows

    def row(c, pre=prefix):
        return f"{pre} {labels.get((c.split.name, c.split.params.get('alpha')), c.split.name)}"

    def method(c):
        return METHOD_LABELS.get(c.method.name, c.method.name)

    first = params["seeds"][0]
    exp = {e: experiment_configs(params, e) for e in params["experiments"]}
    items = []

    def add(e, table, row_of, column_of, runner=run_round, **kw):
        if e in exp:
            items.extend(items_of("celm", table, exp[e], row_of, column_of, runner, first_seed=first, **kw))

    add("table1", "Table 1", row, method, headline=f"{prefix} Dir. (0.05)")
    add("table1_cifar10", "Table 1", lambda c: row(c, "CIFAR-10"), method, headline="CIFAR-10 Dir. (0.05)")
    if "cifar10_readings" in params["experiments"]:  # FedAvg under readings of the CIFAR-10 recipe (issue 30)
        items.extend(queue_item("celm", params, "CIFAR-10 readings", f"CIFAR-10 {SPLITS[s][1]}", reading, config,
                                table_rank=1, headline=s == "Dir(0.05)")
                     for s, reading, config in cifar10_reading_configs(params))
    if "maverick_readings" in params["experiments"]:  # FedAvg under readings of §6.1's Maverick (issue 30)
        items.extend(queue_item("celm", params, "Maverick readings", f"{prefix} Maverick", reading, config,
                                table_rank=1, headline=reading == next(iter(MAVERICK_READINGS)))
                     for reading, config in maverick_reading_configs(params))
    add("table2", "Table 2", lambda c: f"{prefix} Maverick", method, rank=1,
        backs=lambda c: [("Table 2", f"{prefix} Balanced Acc.", method(c)),
                         ("Table 2", f"{prefix} Rare Class Acc.", method(c))])
    def row3(c):
        return f"{prefix} " + ("FRM" if c.split.params.get("with_maverick") else "FR")

    add("table3", "Table 3", row3, method, rank=1,
        backs=lambda c: [("Table 3", row3(c), f"{k} {method(c)}") for k in ("AUROC", "FPR")])
    add("table4", "Table 4", row, lambda c: "CELM evidence", rank=1, headline=f"{prefix} PLS",
        backs=lambda c: [("Table 4", row(c), "*")])
    add("table5", "Table 5", lambda c: f"{prefix} IID", method, rank=2)
    add("table6", "Table 6", row, method, rank=2, headline=f"{prefix} Dir. (0.05)")
    add("table7", "Table 7", lambda c: row(c, TABLE7_PREFIX), method, rank=2, headline=f"{TABLE7_PREFIX} Dir. (0.05)")
    add("table8", "Table 8", row, lambda c: f"{round(100 * c.method.params.get('warmup_fraction', 0.05)):d}%", rank=2)
    add("fig6", "Fig. 6", lambda c: f"L = {c.method.params.get('lm_steps')}",
        lambda c: f"η = {c.method.params.get('lm_lr')}", rank=3)
    add("fig7", "Fig. 7", lambda c: "PLS", lambda c: "probe images", rank=3)
    if "cffl_study" in exp:
        labels_of = {c.key(): label for label, c in cffl_study_configs(params)}
        add("cffl_study", "CFFL study", lambda c: f"{prefix} {params['cffl_study']['split']}, reduced",
            lambda c: labels_of[c.key()], rank=3)
    return items


# ----------------------------------------------------------------------------- the page


def method_configs(spec, methods, **options):
    """``make_configs`` for ``Chapter.sources``: each method's seeds' runs of one split (``options``
    go to ``run_config``; ``spec`` or an option that is callable is read from the profile's parameters)."""
    def make(p):
        kw = {k: v(p) if callable(v) else v for k, v in options.items()}
        split = spec(p) if callable(spec) else spec
        return {m: [run_config(p, split, m, s, **kw) for s in p["seeds"]] for m in methods}

    return make


class CELM(Chapter):
    """The CELM page: Tables 1-8, Figs. 4-7 and why a baseline falls short of FedAvg."""

    name = "celm"
    labels = METHOD_LABELS

    @property
    def prefix(self) -> str:
        """The dataset's name in the paper's table rows."""
        return dataset_label(self.params["dataset"])

    def split_rows(self, table: str, splits, prefix: str | None = None, label: str = "{split}", **options):
        """(label, paper, ours) per split of a paper-vs-ours accuracy table (``options``: ``method_configs``')."""
        methods = self.params["methods"]
        prefix = prefix or self.prefix
        return [(label.format(split=split), self.paper_values(table, f"{prefix} {SPLITS[split][1]}", methods),
                 self.sources(method_configs(SPLITS[split][0], methods, **options))) for split in splits]

    def table1(self):
        """Table 1 on the profile's dataset: the styled frame, its rows and the numbers the text quotes."""
        rows = self.split_rows("Table 1", self.params["splits"])
        best_ours, best_paper, n_rows = best_counts(rows, self.ours)
        gain = [o[self.ours]["celm"][0] - o[self.ours]["fedavg_uniform"][0] for _, _, o in rows]
        return self.styled(rows), rows, {"t1_best_ours": best_ours, "t1_best_paper": best_paper, "t1_rows": n_rows,
                                         "t1_gain": float(np.nanmean(gain))}

    def shortfalls(self, threshold: float = 10.0) -> list:
        """A paragraph and a table (``diagnose_baseline``) per baseline run ``threshold`` points below FedAvg."""
        from IPython.display import Markdown

        source, results, params = self.by_source()[-1]  # the stored paper-profile runs when there are any
        out = []
        for cifar10, split, seed in itertools.product((False, True), params["splits"], params["seeds"]):
            spec, data = SPLITS[split][0], "CIFAR-10 " if cifar10 else ""
            base = results.get(run_config(params, spec, "fedavg_uniform", seed, cifar10=cifar10).key())
            for method in DIAGNOSED:
                run = results.get(run_config(params, spec, method, seed, cifar10=cifar10).key())
                if base is None or run is None or method not in params["methods"]:
                    continue
                acc, ref = 100 * run.final["accuracy"], 100 * base.final["accuracy"]
                if ref - acc > threshold:
                    text, table = diagnose_baseline(run, method)
                    out += [Markdown(f"**{METHOD_LABELS[method]}, {data}{split}, seed {seed}** ({source}): "
                                     f"{acc:.2f} % against uniform FedAvg's {ref:.2f} %. {text}"), table]
        return out or [Markdown(f"No baseline ends more than {threshold:g} points below uniform FedAvg in these runs "
                                f"({source}).")]

    def cifar10_readings(self):
        """Uniform FedAvg's CIFAR-10 Table 1 cells under every reading of the CIFAR-10 recipe
        (``fedlib.app.chapters.readings``; issue 30), from the stored paper-profile runs of seed 0, against the
        paper, and the reading the rule picks. (None, values) while no reading has a stored run."""
        params = self.paper_params
        rows = cifar10_reading_configs(params)
        stored = stored_results(self.name, [c for *_, c in rows]).results

        def paper_of(split):
            return frames.paper_values(self.reference, "Table 1", f"CIFAR-10 {SPLITS[split][1]}", ["fedavg_uniform"],
                                       METHOD_LABELS.get)["fedavg_uniform"][0]

        frame, chosen = readings.calibrate(rows, stored, paper_of)
        return readings.page(frame, chosen, sum(c.key() in stored for *_, c in rows), len(rows), params=params,
                             profile_file="params/celm/paper.yaml")

    def maverick_readings(self):
        """Uniform FedAvg's Table 2 cells (balanced and rare-class accuracy) under every reading of §6.1's
        Maverick split, from the stored paper-profile runs of seed 0, against the paper, and the reading the
        rule picks (``calibrate_maverick_readings``). (None, values) while no reading has a stored run."""
        rows = maverick_reading_configs(self.paper_params)
        stored = stored_results(self.name, [c for _, c in rows]).results
        paper = {metric: frames.paper_values(self.reference, "Table 2", f"F.MNIST {metric}", ["fedavg_uniform"],
                                             METHOD_LABELS.get)["fedavg_uniform"][0]
                 for metric in ("Balanced Acc.", "Rare Class Acc.")}
        frame, chosen = calibrate_maverick_readings(rows, stored, paper)
        shown, values = readings.page(frame, chosen, sum(c.key() in stored for _, c in rows), len(rows), prefix="mr")
        permitted = frame[frame["keeps its classes rare"]].dropna(subset=["mean |ours − paper|"])
        rare_gap = (permitted["Rare Class Acc. ours"] - paper["Rare Class Acc."]).abs()
        values["mr_reproduces"] = (
            "No permitted reading is measured yet." if permitted.empty else
            f"Uniform FedAvg's rare-class accuracy reproduces (within 2 points of the paper's "
            f"{paper['Rare Class Acc.']:.2f}) under: {', '.join(rare_gap.index[rare_gap <= 2])}." if (rare_gap <= 2).any()
            else f"No permitted reading brings uniform FedAvg's rare-class accuracy within 2 points of the paper's "
                 f"{paper['Rare Class Acc.']:.2f}: the closest, {rare_gap.idxmin()}, is "
                 f"{permitted.loc[rare_gap.idxmin(), 'Rare Class Acc. ours']:.2f}, {rare_gap.min():.2f} points away. "
                 f"That cell does not reproduce under any reading the text permits.")
        used = table2_reading(self.paper_params)
        values["mr_protocol"] = (f"the paper profile's Table 2 uses it (`table2_reading` in params/celm/paper.yaml)"
                                 if used == chosen else f"the paper profile's Table 2 still uses “{used}”")
        return shown, values

    def table1_cifar10(self):
        """Table 1's CIFAR-10 rows (this build's, and the stored paper-profile runs' where there are any):
        the styled frame (or None), a note, the numbers."""
        source = self.data_source("cifar10")
        if not source:
            return (None, "No CIFAR-10 data under the data root and no stored CIFAR-10 runs: these rows were not run.",
                    {"t1c_best": 0, "t1c_paper": 0, "t1c_n": 0})
        name = "CIFAR-10 (JPEG copy)" if "JPEG" in source else "CIFAR-10"
        splits = list(dict.fromkeys(split for _, _, params in self.by_source() for split in params["splits"]))
        rows = self.measured(self.split_rows("Table 1", splits, "CIFAR-10", name + " {split}", cifar10=True))
        best, paper, n = best_counts(rows, self.ours)
        return self.styled(rows), f"data: {source}", {"t1c_best": best, "t1c_paper": paper, "t1c_n": n}

    def table1_cifar10_earlier(self):
        """Table 1's CIFAR-10 rows from the stored runs of the original recipe, once the paper profile has
        adopted another (``cifar10_reading``): stale, shown apart under their recipe. (None, values) otherwise."""
        earlier, values = readings.earlier_recipe(self.paper_params)
        if earlier is None or not self.data_source("cifar10"):
            return None, values
        methods = earlier["methods"]
        made = {split: method_configs(SPLITS[split][0], methods, cifar10=True)(earlier) for split in earlier["splits"]}
        stored = stored_results(self.name, [c for by in made.values() for cs in by.values() for c in cs]).results
        rows = self.measured([(f"CIFAR-10 {split}", self.paper_values("Table 1", f"CIFAR-10 {SPLITS[split][1]}", methods),
                               {f"{OURS_STORED}, earlier recipe (stale)": frames.seed_mean_std(stored, by)})
                              for split, by in made.items()])
        values["t1c_earlier_n"] = len(stored)
        return (self.comparison(rows) if rows else None), values

    def table7(self):
        """Table 7, EMNIST (47 classes): the paper's five splits, ours beside them from this build's and the stored
        paper-profile runs where there are any. (styled frame, note, numbers); the note says what the rows need
        when no EMNIST run exists: the data (absent here) and the command that makes them."""
        methods = self.params["methods"]
        splits = list(dict.fromkeys(split for _, _, params in self.by_source() for split in params["splits"]))
        rows = [(f"{TABLE7_PREFIX} {split}",
                 self.paper_values("Table 7", f"{TABLE7_PREFIX} {SPLITS[split][1]}", methods),
                 self.sources(method_configs(table7_split(split), methods, dataset=TABLE7_DATASET)))
                for split in splits]
        measured = self.measured(rows)
        best, paper, n = best_counts(measured, self.ours) if measured else (0, 0, 0)
        values = {"t7_best": best, "t7_paper": paper, "t7_n": n}
        source = self.data_source(TABLE7_DATASET)
        if measured:
            return self.styled(measured), f"data: {source}", values
        missing = data_missing(TABLE7_DATASET)
        runs = len(table7_configs(self.paper_params))
        note = (f"needs {TABLE7_PREFIX}: " + ("it is not under the data root here (torchvision's EMNIST/raw layout, "
                                               "README 'Choosing a data root')" if missing else
                                               "no Table 7 run is stored yet")
                + f"; where it is present, `python -m fedlib results --chapter celm --table 'Table 7'` makes and "
                  f"stores its {runs} paper-protocol runs. The rows show the paper's values only.")
        return self.styled([(label, paper, {}) for label, paper, _ in rows]), note, values

    def table2(self):
        """Table 2, balanced and rare-class accuracy: the styled frame, the Maverick's classes, the numbers."""
        methods = self.params["methods"]
        make = method_configs(table2_split, methods)
        rows = [(row, self.paper_values("Table 2", f"{self.prefix} {row}", methods), self.sources(make, value))
                for row, value in (("Balanced Acc.", lambda r: 100 * r.final["balanced_accuracy"]),
                                   ("Rare Class Acc.", rare_class_accuracy))]
        (_, paper, ours), classes = rows[1], maverick_classes(self.result(make(self.params)["celm"][0]))
        return self.styled(rows), f"Maverick classes: {classes}", {
            "t2_rare_celm": ours[self.ours]["celm"][0], "t2_rare_fedavg": ours[self.ours]["fedavg_uniform"][0],
            "t2_rare_paper_celm": paper["celm"][0]}

    def table3(self):
        """Table 3 and Fig. 4, free-rider detection: AUROC and FPR per method, the FPR curves, the numbers."""
        import matplotlib.pyplot as plt
        import pandas as pd
        from IPython.display import Markdown

        from ...metrics import detection_summary

        detectors = [m for m in DETECTORS if m in self.params["methods"]]
        lines, curves, thresholds = [], {}, None
        for split, spec in detection_splits(self.params).items():
            for m in detectors:
                runs = [self.result(run_config(self.params, spec, m, s)) for s in self.params["seeds"]]
                runs = [r for r in runs if r is not None]  # an evidence build: a stale or missing run is not shown
                summaries = [detection_summary(score_history(r), free_riders(r)) for r in runs]
                if summaries:
                    curves[(split, m)] = np.mean([s["fpr_curve"] for s in summaries], axis=0)
                    thresholds = summaries[0]["thresholds"]
                for metric, key in (("AUROC", "auroc"), ("FPR", "fpr")):
                    paper = reference_value(self.reference, "Table 3", f"{self.prefix} {split}",
                                            f"{metric} {METHOD_LABELS[m]}")[0]
                    lines.append({"split": split, "metric": metric, "method": METHOD_LABELS[m], "paper": paper,
                                  self.ours: float(np.mean([s[key] for s in summaries])) if summaries else np.nan})
        table = pd.DataFrame(lines).pivot_table(index=["split", "metric"], columns="method",
                                                values=["paper", self.ours]).swaplevel(0, 1, axis=1).sort_index(axis=1)
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True, layout="constrained")
        for ax, split in zip(axes, ("FR", "FRM")):
            for m in (m for m in detectors if (split, m) in curves):
                ax.plot(thresholds, curves[(split, m)], label=METHOD_LABELS[m])
            ax.set(title=f"{split}: FPR vs threshold", xlabel="z-score threshold", ylabel="false-positive rate")
            ax.grid(alpha=0.3)
        axes[0].legend()
        frm = [r for r in lines if r["split"] == "FRM" and r["metric"] == "AUROC"]
        measured = [r for r in frm if np.isfinite(r[self.ours])]
        return table.style.format("{:.2f}", na_rep="—"), fig, {
            "t3_celm_frm": next(r[self.ours] for r in frm if r["method"] == "CELM"),
            "t3_best_frm": Markdown(max(measured, key=lambda r: r[self.ours])["method"] if measured else "none measured")}

    def table4(self):
        """Table 4 and Fig. 5: how far CELM's evidence and the uniform matrix are from the true counts."""
        import matplotlib.pyplot as plt
        import pandas as pd

        splits, seed = self.params["fidelity_splits"], self.params["seeds"][0]
        lines = []
        for split in splits:
            spec, row = SPLITS[split]
            values = [fidelity(self.result(run_config(self.params, spec, "celm", s))) for s in self.params["seeds"]]
            mean = {k: float(np.mean([v[k] for v in values])) for k in values[0]}
            lines += [{"split": split, "source": "paper",
                       **{k: reference_value(self.reference, "Table 4", f"{self.prefix} {row}", k)[0] for k in mean}},
                      {"split": split, "source": self.ours, **mean}]
        table = pd.DataFrame(lines).set_index(["split", "source"])
        ours = table.xs(self.ours, level="source")
        values = {"t4_better": int((ours["JSD CELM"] < ours["JSD Uniform"]).sum()), "t4_n": len(ours)}

        run = self.result(run_config(self.params, SPLITS[splits[-1]][0], "celm", seed))
        true, est = np.asarray(run.meta["client_class_counts"], float), last_evidence(run)
        est_total = max(est.sum(), 1e-12)
        fig, axes = plt.subplots(1, 4, figsize=(15, 3.2), layout="constrained")
        for ax, matrix, title in ((axes[0], true / true.sum(), "(a) true"),
                                  (axes[1], est / est_total, "(b) CELM estimate")):
            im = ax.imshow(matrix, cmap="Blues", aspect="auto")
            ax.set(title=title, xlabel="class", ylabel="client")
            fig.colorbar(im, ax=ax, shrink=0.8)
        for ax, axis, what in ((axes[2], 1, "client"), (axes[3], 0, "class")):
            x = np.arange(true.shape[1 - axis])
            ax.bar(x - 0.2, true.sum(axis) / true.sum(), 0.4, label="true")
            ax.bar(x + 0.2, est.sum(axis) / est_total, 0.4, label="CELM")
            ax.set(title=f"({'c' if axis else 'd'}) {what} marginals", xlabel=what)
        axes[3].legend()
        fig.suptitle(f"{splits[-1]}, seed {seed}")
        return table.style.format("{:.3f}"), fig, values

    def table4_uniform(self, seeds=(0, 1, 2)):
        """Table 4's Uniform column from the splits alone, paper vs ours under the Table 4 and the earlier
        definitions (JSD in bits, EMD between cell probabilities) and on the PLS splits of ``PLS_MATCHES``;
        a paper value counts as reproduced within our seed range ± its rounding (0.0005)."""
        import pandas as pd
        from scipy.stats import wasserstein_distance

        from ...metrics import hellinger, joint_distances, jsd

        names = ("JSD", "EMD", "Hellinger")

        def uniform(counts):  # the Table 4 definitions
            return joint_distances(counts, np.ones_like(counts, dtype=float))

        def earlier(counts):
            joint = (counts / counts.sum()).ravel()
            flat = np.full_like(joint, 1.0 / joint.size)
            return {"JSD": float(jsd(joint, flat)), "EMD": float(wasserstein_distance(joint, flat)),
                    "Hellinger": float(hellinger(joint, flat))}

        def spread(part, source):
            return {"source": f"{source}, seeds {list(seeds)}",
                    **{m: pm(*mean_std(part[m]), digits=3) for m in names}}

        lines, inside, means, papers = [], dict.fromkeys(names, 0), {}, {}
        for dataset, paper_row, split in TABLE4_ROWS:
            row = f"{dataset} {paper_row}"
            paper = papers[row] = {m: reference_value(self.reference, "Table 4", row, f"{m} Uniform")[0] for m in names}
            counts = [split_counts(SPLITS[split][0], CLASS_SIZES[dataset], seed=s) for s in seeds]
            ours = pd.DataFrame([uniform(c) for c in counts])
            lines += [{"row": row, "source": "paper", **{m: f"{paper[m]:.3f}" for m in names}},
                      {"row": row, **spread(ours, "ours (Table 4) definitions")},
                      {"row": row, **spread(pd.DataFrame([earlier(c) for c in counts]), "earlier definitions")}]
            inside = {m: inside[m] + int(ours[m].min() - 5e-4 <= paper[m] <= ours[m].max() + 5e-4) for m in names}
            means[row] = {m: float(ours[m].mean()) for m in names}
            for ks in PLS_MATCHES if paper_row == "PLS" else ():
                spec = {"name": "pls", "classes_per_client": list(ks)}
                part = pd.DataFrame([uniform(split_counts(spec, CLASS_SIZES[dataset], seed=s)) for s in seeds])
                lines.append({"row": row, **spread(part, f"our PLS rule with k = {ks}")})
        found = pls_class_count_search()
        chosen, rule = choose_pls_allocation(found)
        pls, sls = means["F.MNIST PLS"], "CIFAR-10 SLS"
        values = {"t4u_rows": len(TABLE4_ROWS), **{f"t4u_{m}": inside[m] for m in names},
                  "t4u_pls": ", ".join(str(k) for k in found), "t4u_pls_JSD": pls["JSD"],
                  "t4u_pls_choice": ", ".join(map(str, PLS_ALLOCATION)), "t4u_pls_rule": rule,
                  "t4u_pls_rule_agrees": "yes" if chosen == PLS_ALLOCATION else "no",
                  "t4u_pls_Hellinger": pls["Hellinger"],
                  "t4u_sls_gap": max(abs(means[sls][m] - papers[sls][m]) for m in ("JSD", "Hellinger"))}
        note = (f"equal-size PLS allocations with the paper's Uniform JSD 0.508 and Hellinger 0.586: {found}; "
                f"the page's PLS split uses {PLS_ALLOCATION} ({rule})")
        return pd.DataFrame(lines).set_index(["row", "source"]), note, values

    @staticmethod
    def definitions():
        """The JSD, Hellinger and EMD variants tried for Table 4's Uniform column on our PLS split
        (``PLS_ALLOCATION``, seed 0), over
        the joint client x class cells, the client rows or the class columns (means)."""
        import pandas as pd
        from scipy.stats import wasserstein_distance

        from ...metrics import emd_1d, hellinger, js_distance, jsd, kl

        c = split_counts(SPLITS["PLS"][0], CLASS_SIZES["F.MNIST"]).astype(float)
        n, k = c.shape
        views = {"joint cells": ((c / c.sum()).ravel()[None], np.full((1, n * k), 1.0 / (n * k))),
                 "client rows (mean)": (c / c.sum(1, keepdims=True), np.full((n, k), 1.0 / k)),
                 "class columns (mean)": ((c / c.sum(0, keepdims=True)).T, np.full((k, n), 1.0 / n))}

        def js_div_nats(p, q):
            m = 0.5 * (p + q)
            return 0.5 * (np.atleast_1d(kl(p, m)) + np.atleast_1d(kl(q, m)))

        candidates = {
            "JSD: divergence, bits": lambda p, q: jsd(p, q),
            "JSD: divergence, nats": js_div_nats,
            "JSD: distance (sqrt), bits": lambda p, q: js_distance(p, q, base=2),
            "JSD: distance (sqrt), nats": lambda p, q: js_distance(p, q),
            "Hellinger (1/√2 scale)": hellinger,
            "Hellinger without 1/√2": lambda p, q: np.sqrt(2.0) * np.asarray(hellinger(p, q)),
            "EMD: class bins |i-j|": lambda p, q: emd_1d(p, q),
            "EMD: class bins |i-j|/(C-1)": lambda p, q: np.asarray(emd_1d(p, q)) / (p.shape[-1] - 1),
            "EMD: scipy on the probability values": lambda p, q: np.array(
                [wasserstein_distance(a, b) for a, b in zip(p, q)]),
        }
        rows = [{"candidate": name, **{view: float(np.mean(np.atleast_1d(f(p, q)))) for view, (p, q) in views.items()}}
                for name, f in candidates.items()]
        return pd.DataFrame(rows).set_index("candidate").style.format("{:.4f}")

    def tables5_6(self):
        """Table 5 (IID) and Table 6 (many clients): the styled frame and Table 6's numbers."""
        many = self.params["many_clients"]
        rows6 = self.split_rows("Table 6", self.params["many_client_splits"], label=f"{{split}}, {many} clients",
                                n_clients=lambda p: p["many_clients"])
        best, paper, n = best_counts(rows6, self.ours)
        return self.styled(self.split_rows("Table 5", ["IID"]) + rows6), {"t6_best": best, "t6_paper": paper, "t6_n": n}

    def table8(self):
        """Table 8: CELM's accuracy per warm-up horizon T_w / T, paper vs ours (styled)."""
        fractions = {f"{round(100 * f)}%": f for f in self.params["warmup_fractions"]}
        rows = []
        for split in self.params["warmup_splits"]:
            spec, row = SPLITS[split]
            per_fraction = {label: [run_config(self.params, spec, "celm", s, warmup_fraction=f)
                                    for s in self.params["seeds"]] for label, f in fractions.items()}
            rows.append((split, frames.paper_values(self.reference, "Table 8", f"{self.prefix} {row}", fractions, str),
                         {self.ours: frames.seed_mean_std(self.results, per_fraction)}))
        return frames.styled_comparison(rows, {label: label for label in fractions}, index="split")

    def fig6(self):
        """Fig. 6: CELM's final accuracy (%) over the probe steps L x Adam step size η grid."""
        import matplotlib.pyplot as plt

        p = self.params
        steps, rates, spec = p["lm_steps_grid"], p["lm_lr_grid"], SPLITS[p["sensitivity_split"]][0]
        grid = np.array([[100.0 * self.result(run_config(p, spec, "celm", p["seeds"][0], lm_steps=st, lm_lr=lr))
                          .final["accuracy"] for lr in rates] for st in steps])
        fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(rates), 1.2 + 0.8 * len(steps)), layout="constrained")
        ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set(xticks=range(len(rates)), xticklabels=rates, yticks=range(len(steps)), yticklabels=steps,
               xlabel="LM learning rate η", ylabel="LM steps L", title=f"CELM accuracy (%), {p['sensitivity_split']}")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, f"{v:.1f}", ha="center", va="center", color="white" if v < grid.mean() else "black")
        return fig, {"f6_spread": float(grid.max() - grid.min())}

    def fig7(self):
        """Fig. 7: the final probe images per model (row 0 global) and class; red: classes the client holds."""
        import matplotlib.pyplot as plt

        run = self.result(run_config(self.params, SPLITS["PLS"][0], "celm", self.params["seeds"][0],
                                     keep_probe_images=True))
        images = np.asarray(next(h["diagnostics"]["probe_images"] for h in reversed(run.history)
                                 if "probe_images" in h.get("diagnostics", {})), dtype=float)  # [N+1, K, C, H, W]
        counts = np.asarray(run.meta["client_class_counts"])
        rows, cols = images.shape[:2]
        fig, axes = plt.subplots(rows, cols, figsize=(1.1 * cols, 1.1 * rows), layout="constrained")
        for (i, c), ax in np.ndenumerate(axes):
            img = images[i, c]
            img = img[0] if img.shape[0] == 1 else np.moveaxis(img, 0, -1)
            ax.imshow((img - img.min()) / max(img.max() - img.min(), 1e-12), cmap="gray")
            ax.set(xticks=[], yticks=[])
            held = i > 0 and counts[i - 1, c] > 0
            for side in ax.spines.values():
                side.set(color="red" if held else "lightgray", linewidth=2.5 if held else 0.5)
            if i == 0:
                ax.set_title(str(c), fontsize=9)
            if c == 0:
                ax.set_ylabel("global" if i == 0 else f"client {i - 1}", fontsize=9)
        return fig

    def cffl_study(self):
        """CFFL's removals at coefficients 1/3 and 1/6 and with removal off, beside uniform FedAvg, on the
        profile's reduced ``cffl_study`` run: (table or None, the computed conclusion, the numbers)."""
        from IPython.display import Markdown

        study = self.params["cffl_study"]
        runs = [(label, self.result(c)) for label, c in cffl_study_configs(self.params)]
        header = (f"{study['split']}, {study['rounds']} rounds, {100 * study['fraction']:g} % of the training data, "
                  f"seed {study['seed']} (reduced: the paper runs 100 rounds on all of it). ")
        if any(r is None for _, r in runs):
            values = dict.fromkeys(("cs_fedavg", "cs_third", "cs_sixth", "cs_removed_third", "cs_removed_sixth",
                                    "cs_off", "cs_off_gap"), float("nan"))
            return None, Markdown(header + "These runs did not run in this build (no data)."), {
                **values, "cs_off_reaches_fedavg": "not run"}
        table, text, values = cffl_study_frame(runs)
        paper = reference_value(self.reference, "Table 1", f"{self.prefix} {SPLITS[study['split']][1]}", "CFFL")[0]
        return table, Markdown(header + text + f" (The paper reports {paper:.2f} % for CFFL on {study['split']} "
                                                f"under its full protocol.)"), values

    def headlines(self, rows1, table2_values: dict):
        """The page's headline claims for the book's front page (Table 1's CELM cells, Table 2's rare classes)."""
        out = [{"claim": f"CELM accuracy, {self.prefix} {split} (Table 1)", "paper": paper["celm"][0],
                "ours": round(src[self.ours]["celm"][0], 2), "unit": "%"}
               for split, paper, src in rows1 if paper["celm"][0] == paper["celm"][0]]
        out.append({"claim": f"CELM rare-class accuracy, {self.prefix} Maverick (Table 2)",
                    "paper": table2_values["t2_rare_paper_celm"], "ours": round(table2_values["t2_rare_celm"], 2),
                    "unit": "%"})
        return self.record_headlines(out)


def baselines_text(params: dict[str, Any]) -> str:
    """The page's "Baselines" paragraph, its hyper-parameters rendered from what the ``params`` runs of Table 1
    resolve (``fedlib.app.chapters.resolved_methods``; the paper profile's values for a method ``params`` does not
    run)."""
    runs = dict(resolved_methods("celm", "paper"))
    table1 = experiment_configs(params, "table1")
    runs |= {c.method.name: {**c.resolved()["method"], "server_val": c.resolved().get("server_val")} for c in table1}
    sym = lambda method, s: PROSE_SYMBOLS[method][s](runs[method])  # noqa: E731
    cffl = runs["cffl"]
    by_coefficient: dict[Fraction, list[str]] = {}  # the removal coefficient each split's CFFL runs use
    for split in params["splits"]:
        run = next((c for c in table1 if c.method.name == "cffl" and c.split.name == SPLITS[split][0]["name"]
                    and c.split.params == {k: v for k, v in SPLITS[split][0].items() if k != "name"}), None)
        if run is not None:
            coefficient = Fraction(build_method("cffl", run.method.params).coefficient).limit_denominator(100)
            by_coefficient.setdefault(coefficient, []).append(split)
    ordered = sorted(by_coefficient.items(), key=lambda item: -len(item[1]))
    coefficients = f"{ordered[0][0]}" if ordered else f"{Fraction(cffl['threshold']).limit_denominator(100)}"
    coefficients += "".join(f", or {c} on {' and '.join(splits)} (its authors' code uses it for their label-imbalance "
                            "split)" for c, splits in ordered[1:])
    return (
        "**Baselines** (as this page's runs resolve them; `fedlib.methods.gradient` / `fairness`): FedAvg with "
        "uniform weights (the paper's choice: no client metadata), CFFL (server validation accuracy `acc_i` → "
        "reputation `r_i ← fade·r_i + (1 − fade)·acc_i / Σ acc`, weights `sinh(α r) / Σ sinh(α r)` with "
        f"α = {sym('cffl', 'α')} and fade = {sym('cffl', 'fade')}, clients below coefficient / |R| of the reputation "
        f"removed, coefficient {coefficients}, updates clipped to ±{cffl['clip']:g} and the largest "
        f"{100 * cffl['theta']:g} % of their entries uploaded; the server holds out {cffl['server_val']:,} training "
        f"samples as its validation set), CGSV (cosine of each update with the aggregate, reputation EMA "
        f"α = {sym('cgsv', 'α')}), ShapFed (class-wise cosine of the classifier rows' "
        f"{SHAPFED_SIGNALS[runs['shapfed']['signal']]}, μ = {sym('shapfed', 'μ')}).")


SHAPFED_SIGNALS = {"params": "parameters", "updates": "updates"}


# ----------------------------------------------------------------------------- the declaration


class CfflStudy(Part):
    """The CFFL study's one reduced run."""

    split: str
    fraction: float
    rounds: int
    lr_milestones: list[int]
    seed: int


class CelmProfile(FederationProfile):
    dataset: str
    model: str
    lr_milestones: list[int]
    server_val: int | None  # null: each method's own validation share
    methods: Names
    method_params: dict[str, dict[str, Any]]  # method -> hyper-parameters over its defaults
    experiments: Names
    splits: Names
    fidelity_splits: list[str]
    many_clients: int
    many_client_splits: list[str]
    warmup_splits: list[str]
    warmup_fractions: list[float]
    sensitivity_split: str
    lm_steps_grid: list[int]
    lm_lr_grid: list[float]
    cifar10_fraction: float
    cifar10_rounds: int
    cifar10_lr_milestones: list[int]
    cifar10_reading_splits: list[str]
    cifar10_reading: str = readings.ORIGINAL  # a name of readings.CIFAR10_READINGS: the CIFAR-10 recipe
    cffl_study: CfflStudy
    table2_reading: str = next(iter(MAVERICK_READINGS))  # a name of MAVERICK_READINGS: Table 2's Maverick split


def rare_class_accuracy_of(result: dict) -> float:
    """A stored run's rare-class accuracy (%): the claims' reading of Table 2."""
    return rare_class_accuracy(RunResult.from_dict(result))


def table1_claim_rows(prefixes=("F.MNIST", "CIFAR-10")) -> list[str]:
    return [f"{p} {s}" for p in prefixes for s in ("Dir. (0.01)", "Dir. (0.05)", "Dir. (0.10)", "PLS", "SLS")]


CLAIMS = (
    Claim("CELM beats uniform FedAvg on every Table 1 split", "Table 1", "table-1-accuracy-under-label-skew",
          cells_row(table1_claim_rows(), "CELM", "FedAvg")),
    Claim("CELM beats ShapFed, the strongest contribution-aware baseline, on every Table 1 split", "Table 1",
          "table-1-accuracy-under-label-skew", cells_row(table1_claim_rows(), "CELM", "ShapFed")),
    Claim("CELM has the best rare-class accuracy under a Maverick split (F.MNIST)", "Table 2", "table-2-mavericks",
          tuple(Comparison(f"vs {m}", Side(("Table 2", "F.MNIST Maverick", "CELM"), "rare_class_accuracy",
                                           ref=("Table 2", "F.MNIST Rare Class Acc.", "CELM")),
                           Side(("Table 2", "F.MNIST Maverick", m), "rare_class_accuracy",
                                ref=("Table 2", "F.MNIST Rare Class Acc.", m)))
                for m in ("FedAvg", "CFFL", "CGSV", "ShapFed"))),
    # §6: "On FashionMNIST, CELM achieves the top score in four of the five reported splits" (all but SLS, where
    # its Table 1 has CFFL best) and "On CIFAR-10, CELM is the strongest method in all five reported splits"
    Claim("CELM beats CFFL on the nine Table 1 splits where the paper has it best (all but F.MNIST SLS)", "Table 1",
          "table-1-accuracy-under-label-skew",
          cells_row([r for r in table1_claim_rows() if r != "F.MNIST SLS"], "CELM", "CFFL")),
    Claim("CELM beats CGSV on every Table 1 split", "Table 1", "table-1-accuracy-under-label-skew",
          cells_row(table1_claim_rows(), "CELM", "CGSV")),
)

PAPER = Paper("celm", "CELM", CelmProfile, configs, queue_items, reference="celm", claims=CLAIMS,
              metrics={"rare_class_accuracy": rare_class_accuracy_of}, rank=1)
