"""The leaderboard chapter: every valuation method of the book on the same seeded federations.

For each dataset (Fashion-MNIST, MNIST, CIFAR-10 when the data root has it), split (IID,
Dir(0.05), PLS, a Maverick, a free-rider and an adversarial split) and seed, every method runs
on the SAME federation: the same held-out server validation set, client split and
initialisation (``server_val`` is fixed for all methods, so the split does not depend on the
method). Every run asks the engine for the reference values of its final round
(``RunConfig.reference_values``): exact Shapley and leave-one-out values of the final round's
clients (validation accuracy of sample-count coalition averages), plus their data-size share.

Per run (:func:`run_metrics`): final accuracy and balanced accuracy; the fidelity of the
method's final contribution vector to each reference (Spearman ρ and KL); the free-rider AUROC
of the z-score rule (CELM §6.2) over the run's contribution history; the Maverick's rank; the
server time per round relative to FedAvg on the same federation.

Logit-based UWA cannot enter a parameter-averaging federation (clients share logits on a public
set, not models), so it gets its own rows on the logit protocol's federation (``uwa_configs``):
accuracy, server time relative to simple logit averaging, and the fidelity of its mean
per-client weight to the data-size share.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import RunConfig, make_config
from . import run_options
from .. import contributions
from . import celm as celm_chapter

# leaderboard key -> (registered method, its parameters, where its contribution vector comes from, label);
# the vector itself is ``fedlib.contributions.contribution_vector`` (the same for every page):
#   "scores"      the method's own per-client scores (``Method.scores``, recorded each round)
#   "similarity"  cos(w_k, w_g) the engine records (the rule for methods without scores, FLCE §4.1.3)
#   "rewards_gtg" GTG-Shapley's per-round rewards (``shapley_rewards`` diagnostics), by the same rule
ENTRIES: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "fedavg": ("fedavg", {}, "similarity", "FedAvg (sample count)"),
    "fedavg_uniform": ("fedavg_uniform", {}, "similarity", "FedAvg (uniform)"),
    "celm": ("celm", {}, "scores", "CELM"),
    "flce": ("flce", {}, "scores", "FLCE"),
    "cgsv": ("cgsv", {}, "scores", "CGSV"),
    "shapfed": ("shapfed", {}, "scores", "ShapFed"),
    "cffl": ("cffl", {}, "scores", "CFFL"),
    "gtg_shapley": ("shapley_rewards", {"estimator": "gtg"}, "rewards_gtg", "GTG-Shapley"),
    "fedms": ("fedms", {}, "scores", "FedMS (MS-GTG)"),
    "fedscm": ("fedscm_select", {}, "scores", "FedSCM selection"),
}
BASELINE = "fedavg"  # server time is relative to sample-count FedAvg on the same federation

SPLITS: dict[str, dict[str, Any]] = {
    "IID": {"name": "iid"},
    "Dir(0.05)": {"name": "dirichlet", "alpha": 0.05},
    "PLS": {"name": "pls"},
    "Maverick": {"name": "celm_maverick"},
    "Free-rider": {"name": "celm_free_rider"},
    "Adversarial": {"name": "adversarial"},  # role counts from the profile's ``adversarial``
}
FREE_RIDER_ROLES = ("free_rider", "weak_free_rider")
REFERENCES = ("shapley", "loo", "size")
KL_SMOOTHING = 0.01  # share of the uniform distribution mixed into both sides of a KL


def label(key: str) -> str:
    return ENTRIES[key][3] if key in ENTRIES else key


def split_spec(params: dict[str, Any], split: str) -> dict[str, Any]:
    if split not in SPLITS:
        raise ValueError(f"splits: unknown split {split!r}; known: {', '.join(SPLITS)}")
    spec = dict(SPLITS[split])
    if split == "Adversarial":
        spec.update(params["adversarial"])
    return spec


def run_config(params: dict[str, Any], dataset: str, split: str, key: str, seed: int) -> RunConfig:
    """One leaderboard run: ``key`` of :data:`ENTRIES` on one federation."""
    if key not in ENTRIES:
        raise ValueError(f"methods: unknown leaderboard method {key!r}; known: {', '.join(ENTRIES)}")
    name, fixed, _, _ = ENTRIES[key]
    method = {"name": name, **fixed, **params.get("method_params", {}).get(key, {})}
    return make_config(
        dataset=dataset, model=params["models"][dataset], fraction=params["fraction"],
        test_samples=params["test_samples"], server_val=params["server_val"], n_clients=params["n_clients"],
        rounds=params["rounds"], lr=params["lr"], lr_milestones=params["lr_milestones"],
        batch_size=params["batch_size"], local_epochs=params["local_epochs"], split=split_spec(params, split),
        method=method, seed=seed, reference_values=True, **run_options(params),
    )


def configs(params: dict[str, Any], datasets: list[str] | None = None) -> list[RunConfig]:
    """Every parameter-averaging run of the chapter (dataset x split x method x seed)."""
    return [run_config(params, d, s, m, seed) for d in (datasets or params["datasets"]) for s in params["splits"]
            for m in params["methods"] for seed in params["seeds"]]


def uwa_configs(params: dict[str, Any], dataset: str) -> list[RunConfig]:
    """The logit protocol's federations (k-classes split, public set) for UWA and simple averaging
    (methods ``logit_uwa``, ``logit_simple``: ordinary rows, run by ``fedlib.run``)."""
    from .logitfl import protocol_config

    return [protocol_config(agg, dataset=dataset, model=params["models"][dataset], n_clients=params["n_clients"],
                            fraction=params["fraction"], test_samples=params["test_samples"], seed=seed,
                            **params["uwa"])
            for agg in ("simple", "uwa") for seed in params["seeds"]]


def aggregator(config: RunConfig) -> str:
    """'simple' or 'uwa' for a logit-protocol run."""
    return config.method.name.removeprefix("logit_")


# ----------------------------------------------------------------------------- reading one run


def _full(values, clients, n: int) -> np.ndarray:
    out = np.full(n, np.nan)
    out[np.asarray(clients, dtype=int)] = np.asarray(values, dtype=float)
    return out


def contribution_history(result, key: str | None = None) -> np.ndarray:
    """[rounds, clients] per-round contribution values (``fedlib.contributions``; ``key`` unused)."""
    return contributions.contribution_history(result)


def as_distribution(values) -> np.ndarray:
    """A contribution vector as a distribution over clients: negative parts clipped to 0,
    normalised (uniform if nothing is left), then mixed with ``KL_SMOOTHING`` of the uniform
    distribution so that KL stays finite."""
    v = np.clip(np.asarray(values, dtype=float), 0.0, None)
    n = len(v)
    p = v / v.sum() if v.sum() > 0 else np.full(n, 1.0 / n)
    return (1 - KL_SMOOTHING) * p + KL_SMOOTHING / n


def fidelity(contribution, reference) -> tuple[float, float]:
    """(Spearman ρ, KL(reference || contribution) in nats) of two per-client vectors; NaN if
    the contribution is missing for a client."""
    from ..metrics import kl, spearman

    c, r = np.asarray(contribution, dtype=float), np.asarray(reference, dtype=float)
    if not np.isfinite(c).all():
        return float("nan"), float("nan")
    return float(spearman(c, r)), float(kl(as_distribution(r), as_distribution(c)))


def references(result) -> dict[str, np.ndarray]:
    ref = result.final["reference"]
    sizes = np.asarray(ref["sizes"], dtype=float)
    return {"shapley": np.asarray(ref["shapley"]), "loo": np.asarray(ref["loo"]), "size": sizes / sizes.sum()}


def maverick_rank(contribution, roles) -> float:
    """Rank of the (first) Maverick's contribution among all clients: 1 = valued highest
    (ties share their mean rank); NaN without a Maverick or a finite contribution."""
    from scipy.stats import rankdata

    roles = list(roles)
    c = np.asarray(contribution, dtype=float)
    if "maverick" not in roles or not np.isfinite(c).all():
        return float("nan")
    return float(rankdata(-c)[roles.index("maverick")])


def free_rider_auroc(history: np.ndarray, roles) -> float:
    """CELM §6.2: mean per-round AUROC of the z-score rule (rounds with a NaN left out)."""
    from ..metrics import detection_summary

    mask = np.isin(np.asarray(roles), FREE_RIDER_ROLES)
    rows = history[np.isfinite(history).all(1)] if len(history) else history
    if not mask.any() or mask.all() or len(rows) == 0:
        return float("nan")
    return detection_summary(rows, mask)["auroc"]


def server_time(result) -> float:
    """Mean server seconds per round."""
    return float(np.mean([h["time_server"] for h in result.history]))


def run_metrics(result, key: str) -> dict[str, Any]:
    """The leaderboard's numbers for one run (ratios to FedAvg are added by :func:`table`)."""
    roles = result.meta["client_roles"]
    history = contributions.contribution_history(result)
    final = contributions.contribution_vector(result) if len(history) else np.full(len(roles), np.nan)
    out: dict[str, Any] = {
        "accuracy": 100 * result.final["accuracy"], "balanced_accuracy": 100 * result.final["balanced_accuracy"],
        "server_s": server_time(result), "wall_s": result.meta["wall_time"],
        "maverick_rank": maverick_rank(final, roles), "fr_auroc": free_rider_auroc(history, roles),
        "n_clients": len(roles),
    }
    if "maverick" in roles:
        out["rare_accuracy"] = celm_chapter.rare_class_accuracy(result)
    ref = result.final.get("reference")
    if ref is not None:
        clients = np.asarray(ref["clients"], dtype=int)
        for name, values in references(result).items():
            out[f"rho_{name}"], out[f"kl_{name}"] = fidelity(final[clients], values)
        out["reference_s"] = ref["time"]
    return out


def table(results: dict, params: dict[str, Any], datasets: list[str]) -> "pd.DataFrame":  # noqa: F821
    """One row per run: dataset, split, seed, method + :func:`run_metrics`, and ``server_ratio``
    (mean server time per round / FedAvg's on the same federation and seed)."""
    import pandas as pd

    rows = []
    for d in datasets:
        for s in params["splits"]:
            for seed in params["seeds"]:
                base = results.get(run_config(params, d, s, BASELINE, seed).key())
                for m in params["methods"]:
                    r = results.get(run_config(params, d, s, m, seed).key())
                    if r is None:
                        continue
                    row = {"dataset": d, "split": s, "seed": seed, "method": label(m), "key": m,
                           **run_metrics(r, m)}
                    row["server_ratio"] = row["server_s"] / server_time(base) if base is not None else np.nan
                    rows.append(row)
    return pd.DataFrame(rows)


def summary(frame, split: str | None = None, columns=None) -> "pd.DataFrame":  # noqa: F821
    """Mean over datasets and seeds (and splits unless ``split``) of each method's columns."""
    sub = frame if split is None else frame[frame["split"] == split]
    cols = columns or [c for c in sub.columns if c not in ("dataset", "split", "seed", "method", "key")]
    return sub.groupby("method", sort=False)[cols].mean(numeric_only=True)


def uwa_metrics(result) -> dict[str, Any]:
    """UWA's (or simple averaging's) numbers on its logit federation."""
    out = {"accuracy": 100 * result.final["accuracy"], "balanced_accuracy": 100 * result.final["balanced_accuracy"],
           "server_s": server_time(result)}
    weights = result.final.get("uwa_weights")
    if weights:
        per_client = np.asarray(weights["class_weight"], dtype=float).mean(1)  # mean weight over classes
        sizes = np.asarray(result.meta["client_sizes"], dtype=float)
        out["rho_size"], out["kl_size"] = fidelity(per_client, sizes / sizes.sum())
    return out


def radar_scores(summary_frame) -> "pd.DataFrame":  # noqa: F821
    """Each method's summary on [0, 1] axes (1 = best): accuracy / 100, balanced accuracy / 100,
    (ρ_Shapley + 1) / 2, free-rider AUROC, Maverick score 1 − (rank − 1)/(N − 1), and
    cheapness 1 / max(1, server time ratio to FedAvg)."""
    import pandas as pd

    f = summary_frame
    n = f["n_clients"].clip(lower=2)
    return pd.DataFrame({
        "accuracy": f["accuracy"] / 100, "balanced acc.": f["balanced_accuracy"] / 100,
        "ρ Shapley": (f["rho_shapley"] + 1) / 2, "free-rider AUROC": f["fr_auroc"],
        "Maverick": 1 - (f["maverick_rank"] - 1) / (n - 1), "cheapness": 1 / f["server_ratio"].clip(lower=1),
    })


def reference_ranks(result) -> dict[str, float]:
    """The Maverick's rank under each reference of a run's final round (exact Shapley, LOO, data size)."""
    roles = result.meta["client_roles"]
    clients = result.final["reference"]["clients"]
    return {name: maverick_rank(_full(values, clients, len(roles)), roles)
            for name, values in references(result).items()}


def best(frame, column: str, higher_is_better: bool = True, tol: float = 1e-9) -> list[str]:
    """The index labels tied for the best finite value of ``column`` (empty if none is finite)."""
    values = frame[column].dropna()
    if values.empty:
        return []
    top = values.max() if higher_is_better else values.min()
    return [str(i) for i, v in values.items() if abs(v - top) <= tol]


# ----------------------------------------------------------------------------- the results queue


def queue_items(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.queue); not a paper's
    table, so it ranks after the papers' main tables; headline: the Maverick split."""
    from ..queue import QueueItem, run_round

    first = params["seeds"][0]
    items = [QueueItem("leaderboard", "Leaderboard", f"{d} {s}", label(m), seed, run_config(params, d, s, m, seed),
                       run_round, headline=s == "Maverick", table_rank=2, first_seed=seed == first)
             for d in params["datasets"] for s in params["splits"] for m in params["methods"] for seed in params["seeds"]]
    for d in params["datasets"]:
        items += [QueueItem("leaderboard", "Leaderboard (logit)", f"{d} k={c.split.params['k']}", aggregator(c),
                            c.seed, c, run_round,
                            table_rank=2, first_seed=c.seed == first) for c in uwa_configs(params, d)]
    return items
