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

Poisoning (issue 33): on one more federation (IID, ``poisoning.n_clients`` clients of which
``poisoning.sign_flips`` send sign-flipped updates ``2 w_g - w`` every round), every method of the
list and the robust aggregation rules (coordinate-wise median, trimmed mean, Krum, multi-Krum, each
told the attacker count f) run once more: final accuracy, whether the run warned of poisoning
(``final["poisoning_warning"]``, ``fedlib.screening``), and which clients the warning named; a
clean FedAvg run on the same federation is the reference. The monitor (issue 43) warns on exact signs
(unchanged or bit-identical uploads) and on a group of >= 2 clients, >= 20 % of a round, against or far
larger than a majority that agrees; calibrated so that no committed run without a hostile client
warns. It stays silent where its statistics cannot tell an attack from label skew (:data:`POISONING_NOTE`).

Logit-based UWA cannot enter a parameter-averaging federation (clients share logits on a public
set, not models), so it gets its own rows on the logit protocol's federation (``uwa_configs``):
accuracy, server time relative to simple logit averaging, and the fidelity of its mean
per-client weight to the data-size share.
"""

from __future__ import annotations

import itertools
import warnings
from functools import partial
from typing import Any, Callable

import numpy as np

from ... import contributions
from ...config import RunConfig, make_config
from ...metrics import detection_summary, kl, spearman
from ...screening import judge
from . import Paper, run_options
from .celm import protocol as celm_chapter
from .base import Chapter, queue_item
from .logitfl.protocol import protocol_config
from .profiles import FederationProfile, Names, Part, Seeds

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
# the poisoning table's robust rules: key -> (registered method, its parameters from (n clients, f attackers), label)
ROBUST: dict[str, tuple[str, Callable[[int, int], dict[str, Any]], str]] = {
    "fedmedian": ("fedmedian", lambda n, f: {}, "Median"),
    "fedtrimmedavg": ("fedtrimmedavg", lambda n, f: {"beta": f / n}, "Trimmed mean (β = f/n)"),
    "krum": ("krum", lambda n, f: {"num_malicious_clients": f}, "Krum"),
    "multi_krum": ("krum", lambda n, f: {"num_malicious_clients": f, "num_clients_to_keep": n - f}, "multi-Krum (keep n − f)"),
}
CLEAN = "FedAvg, no attack"  # the poisoning table's reference row
POISONING_NOTE = (  # what the poisoning table's "warned" column cannot show (fedlib.screening, issue 43)
    "The warning is calibrated, not complete: no committed run without a hostile client warns. It cannot tell "
    "one attacker from a Maverick (both point against the median; a Maverick's update can be 100 times the "
    "median norm), nor label flipping from label skew (flipped clients still point with the majority), and "
    "under label skew (PLS, Dirichlet) the rest of a round do not agree, so it stays silent there. Krum keeps "
    "identical uploads (free-riders, colluders): they are each other's nearest neighbours at distance 0, as in "
    "Flower's aggregate_krum.")

SPLITS: dict[str, dict[str, Any]] = {
    "IID": {"name": "iid"},
    "Dir(0.05)": {"name": "dirichlet", "alpha": 0.05},
    "PLS": {"name": "pls"},
    "Maverick": {"name": "celm_maverick"},
    "Free-rider": {"name": "celm_free_rider"},
    "Adversarial": {"name": "adversarial"},  # role counts from the profile's ``adversarial``
}
FREE_RIDER_ROLES = ("free_rider", "weak_free_rider")
REFERENCE_NAMES = {"shapley": "exact Shapley", "loo": "leave-one-out", "size": "data-size share"}
KL_SMOOTHING = 0.01  # share of the uniform distribution mixed into both sides of a KL


def label(key: str) -> str:
    if key in ROBUST:
        return ROBUST[key][2]
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


def poisoning_config(params: dict[str, Any], key: str, seed: int, attacked: bool = True) -> RunConfig:
    """One run of the poisoning table: ``key`` of :data:`ENTRIES` or :data:`ROBUST` on the IID
    federation of ``params["poisoning"]`` with its sign-flippers (none when not ``attacked``)."""
    p = params["poisoning"]
    n, f = p["n_clients"], p["sign_flips"]
    if key in ROBUST:
        name, hyper, _ = ROBUST[key]
        method = {"name": name, **hyper(n, f)}
    elif key in ENTRIES:
        name, fixed, _, _ = ENTRIES[key]
        method = {"name": name, **fixed, **params.get("method_params", {}).get(key, {})}
    else:
        raise ValueError(f"poisoning: unknown method {key!r}; known: {', '.join([*ENTRIES, *ROBUST])}")
    split = {"name": "iid", **({"sign_flips": f} if attacked else {})}
    return make_config(
        dataset=p["dataset"], model=params["models"][p["dataset"]], fraction=params["fraction"],
        test_samples=params["test_samples"], server_val=params["server_val"], n_clients=n, rounds=params["rounds"],
        lr=params["lr"], lr_milestones=params["lr_milestones"], batch_size=params["batch_size"],
        local_epochs=params["local_epochs"], split=split, method=method, seed=seed, **run_options(params))


def poisoning_methods(params: dict[str, Any]) -> list[str]:
    """The poisoning table's rows: the leaderboard's methods, then the robust rules."""
    return [*params["methods"], *ROBUST]


def poisoning_configs(params: dict[str, Any]) -> list[RunConfig]:
    """Every run of the poisoning table: each method under attack, and clean FedAvg, per seed."""
    return ([poisoning_config(params, m, seed) for m in poisoning_methods(params) for seed in params["seeds"]]
            + [poisoning_config(params, BASELINE, seed, attacked=False) for seed in params["seeds"]])


def poisoning_metrics(result) -> dict[str, Any]:
    """Accuracy, whether the run warns of poisoning under today's rule (``fedlib.screening.judge`` on its
    stored per-round statistics, so a run stored under an earlier rule is judged again), and the
    sign-flippers / benign clients it named."""
    roles = np.asarray(result.meta["client_roles"])
    found = judge(result.history, result.meta.get("client_sizes"))
    named = set(found["clients"]) if found else set()
    flippers = set(np.flatnonzero(roles == "sign_flip").tolist())
    return {"accuracy": 100 * result.final["accuracy"], "warned": found is not None,
            "flippers_named": len(named & flippers) / len(flippers) if flippers else float("nan"),
            "benign_named": len(named - flippers)}


def uwa_configs(params: dict[str, Any], dataset: str) -> list[RunConfig]:
    """The logit protocol's federations (k-classes split, public set) for UWA and simple averaging
    (methods ``logit_uwa``, ``logit_simple``: ordinary rows, run by ``fedlib.run``)."""
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
    # lazy: scipy.stats (~1 s); the queue imports the chapters without it
    from scipy.stats import rankdata

    roles = list(roles)
    c = np.asarray(contribution, dtype=float)
    if "maverick" not in roles or not np.isfinite(c).all():
        return float("nan")
    return float(rankdata(-c)[roles.index("maverick")])


def free_rider_auroc(history: np.ndarray, roles) -> float:
    """CELM §6.2: mean per-round AUROC of the z-score rule (rounds with a NaN left out)."""
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
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    rows = []
    for d, s, seed, m in itertools.product(datasets, params["splits"], params["seeds"], params["methods"]):
        r, base = (results.get(run_config(params, d, s, key, seed).key()) for key in (m, BASELINE))
        if r is not None:
            rows.append({"dataset": d, "split": s, "seed": seed, "method": label(m), "key": m, **run_metrics(r, m),
                         "server_ratio": server_time(r) / server_time(base) if base is not None else np.nan})
    return pd.DataFrame(rows)


def on_shared_federations(frame):
    """The rows of the (dataset, split, seed) federations every method of ``frame`` ran, so that means,
    bests and ranks compare the methods on the same runs."""
    if frame is None or frame.empty:
        return frame
    keys = ["dataset", "split", "seed"]
    return frame[frame.groupby(keys)["method"].transform("nunique") == frame["method"].nunique()]


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


def reference_ranks(result) -> dict[str, float]:
    """The Maverick's rank under each reference of a run's final round (exact Shapley, LOO, data size)."""
    roles = result.meta["client_roles"]
    clients = result.final["reference"]["clients"]
    return {name: maverick_rank(_full(values, clients, len(roles)), roles)
            for name, values in references(result).items()}


# ----------------------------------------------------------------------------- the results queue


def runs(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.app.queue); not a paper's
    table, so it ranks after the papers' main tables; headline: the Maverick split."""
    item = partial(queue_item, "leaderboard", params, table_rank=2)
    items = [item("Leaderboard", f"{d} {s}", label(m), run_config(params, d, s, m, seed), headline=s == "Maverick")
             for d, s, m, seed in itertools.product(params["datasets"], params["splits"], params["methods"],
                                                    params["seeds"])]
    for d in params["datasets"]:
        items += [item("Leaderboard (logit)", f"{d} k={c.split.params['k']}", aggregator(c), c)
                  for c in uwa_configs(params, d)]
    p = params["poisoning"]
    column = f"{p['dataset']} IID, {p['sign_flips']} of {p['n_clients']} sign-flipping"
    items += [item("Leaderboard (poisoning)", column, label(m), poisoning_config(params, m, seed))
              for m in poisoning_methods(params) for seed in params["seeds"]]
    items += [item("Leaderboard (poisoning)", column, CLEAN, poisoning_config(params, BASELINE, seed, attacked=False))
              for seed in params["seeds"]]
    return items


# ----------------------------------------------------------------------------- the page


def best(frame, column: str, higher_is_better: bool = True, empty: str = "", tol: float = 1e-9):
    """The index labels tied for the best finite value of ``column``, as Markdown (``empty`` if none is finite)."""
    # lazy: IPython (book extra); the queue imports the chapters without it
    from IPython.display import Markdown

    values = frame[column].dropna()
    top = values.max() if higher_is_better else values.min()
    return Markdown(", ".join(str(i) for i, v in values.items() if abs(v - top) <= tol) or empty)


class Leaderboard(Chapter):
    """The page: accuracy, fidelity, Mavericks, free-riders, cost, UWA, radars and the closing table."""

    name = "leaderboard"

    def __init__(self, profile: str, params: dict[str, Any]):
        super().__init__(profile, params)
        self.datasets, self.frame = [], None

    def configs(self, params=None) -> list[RunConfig]:
        """Per dataset, the parameter-averaging runs, then UWA's logit runs."""
        p = self.params if params is None else params
        return [c for d in p["datasets"] for c in configs(p, [d]) + uwa_configs(p, d)] + poisoning_configs(p)

    def stored_runs(self, configs=None):
        """None: the page shows this build's runs only."""
        return None

    def run(self) -> list:
        """This build's runs (a dataset not under the data root is skipped), the per-run table, a summary line.
        The poisoning runs' warnings are expected: the poisoning table reports them, the page does not repeat them."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*possible poisoning", category=RuntimeWarning)
            super().run(quiet=True)
        self.datasets = [d for d in self.params["datasets"] if self.has(d)]
        self.frame = table(self.results, self.params, self.datasets)
        logit = sum(len(uwa_configs(self.params, d)) for d in self.datasets)
        poisoned = sum(self.result(c) is not None for c in poisoning_configs(self.params))
        wall = sum(r.meta["wall_time"] for r in self.runs)
        print(f"profile {self.profile}; datasets {', '.join(self.datasets)}; seeds {self.params['seeds']}; "
              f"{len(self.runs)} runs ({len(self.runs) - logit - poisoned} parameter-averaging, {logit} logit, "
              f"{poisoned} poisoning); {wall:.0f} s of compute when first computed; device {self.runs[0].meta['device']}")
        return self.runs

    def overview(self) -> dict[str, Any]:
        # lazy: IPython (book extra); the queue imports the chapters without it
        from IPython.display import Markdown

        return {"lb_seeds": Markdown(", ".join(map(str, self.params["seeds"]))),
                "lb_datasets": Markdown(", ".join(self.datasets)), "lb_runs": len(self.runs),
                "lb_profile": Markdown(f"`{self.profile}`")}

    def summary(self, columns: dict[str, str] | None = None, split: str | None = None, sort: str | None = None,
                ascending: bool = True):
        """Each method's mean of ``columns`` (renamed) over datasets and seeds (and splits unless ``split``), on the
        federations every method ran (:func:`on_shared_federations`)."""
        frame = on_shared_federations(self.frame)
        sub = frame if split is None else frame[frame["split"] == split]
        cols = list(columns or [c for c in sub.columns if c not in ("dataset", "split", "seed", "method", "key")])
        out = sub.groupby("method", sort=False)[cols].mean(numeric_only=True)
        return (out if sort is None else out.sort_values(sort, ascending=ascending)).rename(columns=columns or {})

    def accuracy_table(self):
        """Final accuracy (%) per split and the mean balanced accuracy, mean over datasets and seeds (on the
        federations every method ran); best first."""
        f = on_shared_federations(self.frame)
        acc = f.pivot_table(index="method", columns="split", values="accuracy", aggfunc="mean")[
            [s for s in self.params["splits"] if s in set(f["split"])]]
        acc["mean"] = acc.mean(axis=1)
        acc["balanced (mean)"] = f.groupby("method")["balanced_accuracy"].mean()
        acc = acc.sort_values("mean", ascending=False)
        fedavg = label("fedavg")
        values = {"lb_acc_best": best(acc, "mean"), "lb_acc_best_value": float(acc["mean"].max()),
                  "lb_acc_fedavg": float(acc.loc[fedavg, "mean"]) if fedavg in acc.index else float("nan")}
        return acc.style.format("{:.2f}").background_gradient(cmap="Greens", axis=0), values

    def fidelity_table(self):
        """Spearman ρ and KL of the final contributions to each reference, mean over federations."""
        short = {"shapley": "Shapley", "loo": "LOO", "size": "size"}
        columns = {f"{k}_{r}": f"{sym} {short[r]}" for k, sym in (("rho", "ρ"), ("kl", "KL")) for r in short}
        fid = self.summary(columns, sort="rho_shapley", ascending=False)
        values = {"lb_fid_best": best(fid, "ρ Shapley"), "lb_fid_best_value": float(fid["ρ Shapley"].max()),
                  "lb_fid_size_best": best(fid, "ρ size")}
        return (fid.style.format("{:.3f}", na_rep="—")  # ρ is undefined for a constant contribution vector
                .background_gradient(cmap="Greens", subset=[c for c in fid if "ρ" in c])
                .background_gradient(cmap="Reds", subset=[c for c in fid if "KL" in c])), values

    def show_contributions(self) -> None:
        """Shows each method's final-round contribution beside the exact Shapley value on the first Maverick and
        free-rider federation (smoke profile: the first only), each figure under its caption."""
        # lazy: IPython (book extra), matplotlib (~0.5 s); the queue imports the chapters without them
        import matplotlib.pyplot as plt
        from IPython.display import Markdown, display

        # lazy: fedlib.plots (matplotlib, ~0.5 s); the queue imports the chapters without it
        from ...plots import contribution_vs_truth

        p, dataset, seed = self.params, self.datasets[0], self.params["seeds"][0]
        for split in [s for s in ("Maverick", "Free-rider") if s in p["splits"]][:1 if self.profile == "smoke" else 2]:
            runs = {label(k): self.result(run_config(p, dataset, split, k, seed)) for k in p["methods"]}
            first = next(iter(runs.values()))
            display(Markdown(f"Each method's final-round contribution on the **{split}** federation ({dataset}, seed "
                             f"{seed}), as a share of its total, beside the exact Shapley value of that round."))
            histories = {name: contribution_history(r) for name, r in runs.items()}
            fig, ax = plt.subplots(figsize=(8, 3.5), layout="constrained")
            contribution_vs_truth({k: h[-1] for k, h in histories.items() if len(h)}, references(first)["shapley"],
                                  first.meta["client_roles"], ax=ax)
            plt.show()

    def maverick_table(self):
        """On the Maverick split: the Maverick's rank, rare-class and balanced accuracy, ρ Shapley, and its rank
        under each reference of sample-count FedAvg's final round."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        p = self.params
        mav = self.summary({"maverick_rank": "Maverick rank", "rare_accuracy": "rare-class acc. %",
                            "balanced_accuracy": "balanced acc. %", "rho_shapley": "ρ Shapley"}, "Maverick",
                           sort="maverick_rank")
        methods = mav.copy()
        ref_runs = [self.result(run_config(p, d, "Maverick", BASELINE, s)) for d in self.datasets for s in p["seeds"]
                    ] if "Maverick" in p["splits"] and BASELINE in p["methods"] else []
        ranks = pd.Series(np.nan, index=list(REFERENCE_NAMES))
        if ref_runs:
            ranks = pd.DataFrame([reference_ranks(r) for r in ref_runs]).mean()
            for name, text in REFERENCE_NAMES.items():
                mav.loc[f"reference: {text}", "Maverick rank"] = ranks[name]
        values = {"lb_mav_best": best(methods, "Maverick rank", higher_is_better=False, empty="none"),
                  "lb_mav_best_rank": float(methods["Maverick rank"].min()),
                  "lb_mav_shapley": float(ranks["shapley"]), "lb_mav_size": float(ranks["size"]),
                  "lb_mav_rare_best": best(methods, "rare-class acc. %", empty="none"), "lb_n": p["n_clients"]}
        return (mav.style.format("{:.2f}", na_rep="—").background_gradient(cmap="Greens_r", subset=["Maverick rank"]),
                values)

    def free_rider_table(self):
        """Free-rider AUROC on the free-rider and the adversarial split."""
        # lazy: pandas and IPython (book extra); the queue imports the chapters without them
        import pandas as pd
        from IPython.display import Markdown

        det = pd.DataFrame({f"AUROC {s}": self.summary(split=s)["fr_auroc"] for s in ("Free-rider", "Adversarial")
                            if s in self.params["splits"]})
        key = det.columns[0] if len(det.columns) else None
        if key == "AUROC Free-rider":
            det = det.sort_values(key, ascending=False)
        values = {"lb_fr_best": best(det, key) if key else Markdown("none"),
                  "lb_fr_best_value": float(det[key].max()) if key else float("nan"),
                  "lb_fr_split": Markdown(key.removeprefix("AUROC ") if key else "none"),
                  "lb_fr_chance": int((det[key] <= 0.5).sum()) if key else 0}
        return det.style.format("{:.2f}", na_rep="—").background_gradient(cmap="Greens", axis=None), values

    def cost_table(self):
        """Server time per round relative to FedAvg, absolute server and wall time, and the references' time."""
        ratio = "server time / FedAvg"
        cost = self.summary({"server_ratio": ratio, "server_s": "server s / round", "wall_s": "run wall s",
                             "reference_s": "exact references s"}, sort="server_ratio")
        valuers = cost.drop(index=[label("fedavg"), label("fedavg_uniform")], errors="ignore")
        values = {"lb_cost_cheap": best(valuers, ratio, higher_is_better=False),
                  "lb_cost_cheap_value": float(valuers[ratio].min()),
                  "lb_cost_dear": best(valuers, ratio), "lb_cost_dear_value": float(valuers[ratio].max())}
        style = cost.style.format({ratio: "{:.1f}×", "server s / round": "{:.4f}", "run wall s": "{:.1f}",
                                   "exact references s": "{:.2f}"})
        return style.background_gradient(cmap="Reds", subset=[ratio]), values

    def uwa_table(self):
        """Simple logit averaging and UWA on the logit protocol's federation, mean over datasets and seeds."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        names = {"simple": "simple average", "uwa": "UWA"}
        logit_configs = [c for d in self.datasets for c in uwa_configs(self.params, d)]
        frame = pd.DataFrame([{"dataset": c.dataset, "seed": c.seed, "aggregator": names[aggregator(c)],
                               **uwa_metrics(self.result(c))} for c in logit_configs])
        simple = frame[frame["aggregator"] == "simple average"].groupby(["dataset", "seed"])["server_s"].mean()
        frame["server time / simple"] = [r.server_s / simple[(r.dataset, r.seed)] for r in frame.itertuples()]
        uwa = frame.groupby("aggregator").mean(numeric_only=True).drop(columns=["seed"])
        values = {"lb_uwa_gap": float(uwa.loc["UWA", "accuracy"] - uwa.loc["simple average", "accuracy"]),
                  "lb_uwa_rho": float(uwa.loc["UWA"].get("rho_size", float("nan")))}
        return uwa.style.format("{:.3f}", na_rep="—"), values

    def poisoning_table(self):
        """Under 40 %-style sign-flipping (``poisoning``): each method's accuracy, the share of seeds whose
        run warned, the share of the sign-flippers the warning named and the benign clients it named (mean over
        seeds); the first row is clean FedAvg on the same federation. Best accuracy under attack first."""
        # lazy: pandas and IPython (book extra); the queue imports the chapters without them
        import pandas as pd
        from IPython.display import Markdown

        p, seeds = self.params, self.params["seeds"]
        rows = [{"method": label(m), "seed": s, **poisoning_metrics(r)} for m in poisoning_methods(p) for s in seeds
                if (r := self.result(poisoning_config(p, m, s))) is not None]
        clean = [self.result(poisoning_config(p, BASELINE, s, attacked=False)) for s in seeds]
        rows += [{"method": CLEAN, "seed": s, **poisoning_metrics(r)} for s, r in zip(seeds, clean) if r is not None]
        frame = pd.DataFrame(rows)
        if frame.empty:
            return frame, {"lb_poison_best": Markdown("none"), "lb_poison_best_value": float("nan"),
                           "lb_poison_fedavg": float("nan"), "lb_poison_clean": float("nan"),
                           "lb_poison_warned": 0, "lb_poison_runs": 0, "lb_poison_setting": Markdown("not run"),
                           "lb_poison_note": Markdown(POISONING_NOTE)}
        frame["warned"] = frame["warned"].astype(float)
        out = frame.groupby("method", sort=False)[["accuracy", "warned", "flippers_named", "benign_named"]].mean()
        attacked = out.drop(index=[CLEAN], errors="ignore").sort_values("accuracy", ascending=False)
        out = pd.concat([out.loc[[CLEAN]], attacked]) if CLEAN in out.index else attacked
        under_attack = frame[frame["method"] != CLEAN]
        values = {"lb_poison_best": best(attacked, "accuracy"), "lb_poison_best_value": float(attacked["accuracy"].max()),
                  "lb_poison_fedavg": float(attacked.loc[label(BASELINE), "accuracy"]) if label(BASELINE) in
                  attacked.index else float("nan"),
                  "lb_poison_clean": float(out.loc[CLEAN, "accuracy"]) if CLEAN in out.index else float("nan"),
                  "lb_poison_warned": int(under_attack["warned"].sum()), "lb_poison_runs": len(under_attack),
                  "lb_poison_setting": Markdown(f"{p['poisoning']['sign_flips']} of {p['poisoning']['n_clients']}"),
                  "lb_poison_note": Markdown(POISONING_NOTE)}
        out = out.rename(columns={"accuracy": "accuracy %", "warned": "warned (share of seeds)",
                                  "flippers_named": "sign-flippers named", "benign_named": "benign clients named"})
        style = out.style.format({"accuracy %": "{:.2f}", "warned (share of seeds)": "{:.2f}",
                                  "sign-flippers named": "{:.2f}", "benign clients named": "{:.1f}"}, na_rep="—")
        return style.background_gradient(cmap="Greens", subset=["accuracy %"]), values

    def radars(self):
        """One radar per method, six axes on [0, 1] (1 = best; a missing axis at 0): accuracy and balanced accuracy
        / 100, (ρ_Shapley + 1) / 2, free-rider AUROC, Maverick 1 − (rank − 1)/(N − 1), 1 / max(1, server ratio)."""
        # lazy: pandas (book extra), matplotlib (~0.5 s); the queue imports the chapters without them
        import matplotlib.pyplot as plt
        import pandas as pd

        f = self.summary()
        radar = pd.DataFrame({
            "accuracy": f["accuracy"] / 100, "balanced acc.": f["balanced_accuracy"] / 100,
            "ρ Shapley": (f["rho_shapley"] + 1) / 2, "free-rider AUROC": f["fr_auroc"],
            "Maverick": 1 - (f["maverick_rank"] - 1) / (f["n_clients"].clip(lower=2) - 1),
            "cheapness": 1 / f["server_ratio"].clip(lower=1)}).fillna(0.0).clip(0, 1)
        angles = np.linspace(0, 2 * np.pi, len(radar.columns), endpoint=False)
        closed = np.r_[angles, angles[:1]]
        cols, rows = 5, -(-len(radar) // 5)
        fig, axs = plt.subplots(rows, cols, figsize=(3.0 * cols, 3.1 * rows), subplot_kw={"projection": "polar"},
                                layout="constrained")
        axs = np.atleast_1d(axs).ravel()
        for ax in axs[len(radar):]:
            ax.set_visible(False)
        for ax, (name, scores) in zip(axs, radar.iterrows()):
            v = np.r_[scores.to_numpy(), scores.iloc[0]]
            ax.plot(closed, v, color="C0")
            ax.fill(closed, v, color="C0", alpha=0.25)
            ax.set_xticks(angles, list(radar.columns), fontsize=7)
            ax.set_ylim(0, 1)
            ax.set_yticks([0.5, 1.0], ["", ""])
            ax.set_title(name, fontsize=10, pad=12)
        return fig

    def closing_table(self):
        """One line per method, means over every federation of this build; best accuracy first."""
        closing = self.summary({"accuracy": "accuracy %", "balanced_accuracy": "balanced acc. %",
                                "rho_shapley": "ρ Shapley", "rho_loo": "ρ LOO", "rho_size": "ρ size",
                                "fr_auroc": "free-rider AUROC", "maverick_rank": "Maverick rank",
                                "server_ratio": "server time / FedAvg"}, sort="accuracy", ascending=False)
        values = {"lb_close_fr": best(closing, "free-rider AUROC", empty="none"),
                  "lb_close_mav": best(closing, "Maverick rank", higher_is_better=False, empty="none")}
        return closing, values


# ----------------------------------------------------------------------------- the declaration


class AdversarialSplit(Part):
    """The adversarial split's clients by role (``fedlib.partition``'s ``adversarial`` split)."""

    gamma: float
    n_benign: int
    n_mavericks: int
    n_label_flip: int
    n_random_data: int
    n_random_update: int
    n_free_riders: int


class UwaProtocol(Part):
    """UWA's own rows: the logit protocol's federation."""

    k: int
    public_size: int
    meta_labeled: int
    rounds: int
    batch_size: int
    lr: float


class PoisoningFederation(Part):
    """The poisoning table's federation: IID, ``sign_flips`` of its clients send sign-flipped updates."""

    dataset: str
    n_clients: int
    sign_flips: int


class LeaderboardProfile(FederationProfile):
    datasets: Names
    models: dict[str, str]  # dataset -> model
    lr_milestones: list[int]
    server_val: int
    methods: Names  # keys of ENTRIES
    method_params: dict[str, dict[str, Any]]  # entry -> hyper-parameters over its defaults
    splits: Names
    adversarial: AdversarialSplit
    uwa: UwaProtocol
    poisoning: PoisoningFederation
    threads: int  # torch CPU threads; 0: torch's default


PAPER = Paper("leaderboard", "Leaderboard", LeaderboardProfile, runs, reference=None, ours=True, rank=6)
