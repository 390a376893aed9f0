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
  table8  the warm-up horizon T_w / T                               (Table 8)
  fig6    sensitivity to the probe steps L and Adam step size eta   (Fig. 6)
  fig7    the final probe images                                    (Fig. 7)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import RunConfig, make_config
from . import unique_configs

METHOD_LABELS = {"fedavg_uniform": "FedAvg", "cffl": "CFFL", "cgsv": "CGSV", "shapfed": "ShapFed", "celm": "CELM"}
DETECTORS = ("cffl", "cgsv", "shapfed", "celm")  # methods with contribution scores (Table 3)

# split label -> (split spec, CELM table row without the dataset prefix)
SPLITS: dict[str, tuple[dict[str, Any], str]] = {
    "Dir(0.01)": ({"name": "dirichlet", "alpha": 0.01}, "Dir. (0.01)"),
    "Dir(0.05)": ({"name": "dirichlet", "alpha": 0.05}, "Dir. (0.05)"),
    "Dir(0.10)": ({"name": "dirichlet", "alpha": 0.1}, "Dir. (0.10)"),
    "PLS": ({"name": "pls"}, "PLS"),
    "SLS": ({"name": "sls"}, "SLS"),
    "IID": ({"name": "dirichlet", "alpha": 100.0}, "IID"),
}
MAVERICK = {"name": "celm_maverick"}
DETECTION_SPLITS = {"FR": {"name": "celm_free_rider"}, "FRM": {"name": "celm_free_rider", "with_maverick": True}}
DATASET_PREFIX = {"fmnist": "F.MNIST", "cifar10": "CIFAR-10"}


def run_config(params: dict[str, Any], split: dict, method: str, seed: int, n_clients: int | None = None,
               cifar10: bool = False, **method_params) -> RunConfig:
    """One run of the chapter's protocol (``cifar10``: the CIFAR-10 variant of Table 1,
    the CNN with its own data fraction, rounds and lr milestones)."""
    spec = {"name": method, **params.get("method_params", {}).get(method, {}), **method_params}
    data = dict(dataset=params["dataset"], model=params["model"], fraction=params["fraction"],
                rounds=params["rounds"], lr_milestones=params["lr_milestones"])
    if cifar10:
        data = dict(dataset="cifar10", model="cnn", fraction=params["cifar10_fraction"],
                    rounds=params["cifar10_rounds"], lr_milestones=params["cifar10_lr_milestones"])
    return make_config(
        **data, n_clients=n_clients or params["n_clients"], lr=params["lr"], batch_size=params["batch_size"],
        local_epochs=params["local_epochs"], test_samples=params["test_samples"],
        server_val=params.get("server_val"), split=split, method=spec, seed=seed,
    )


def experiment_configs(params: dict[str, Any], experiment: str) -> list[RunConfig]:
    """The runs of one experiment (see the module docstring)."""
    seeds, methods = params["seeds"], params["methods"]
    if experiment == "table1":
        return [run_config(params, SPLITS[s][0], m, seed) for s in params["splits"] for m in methods for seed in seeds]
    if experiment == "table1_cifar10":
        return [run_config(params, SPLITS[s][0], m, seed, cifar10=True) for s in params["splits"] for m in methods
                for seed in seeds]
    if experiment == "table2":
        return [run_config(params, MAVERICK, m, seed) for m in methods for seed in seeds]
    if experiment == "table3":
        return [run_config(params, spec, m, seed) for spec in DETECTION_SPLITS.values()
                for m in methods if m in DETECTORS for seed in seeds]
    if experiment == "table4":
        return [run_config(params, SPLITS[s][0], "celm", seed) for s in params["fidelity_splits"] for seed in seeds]
    if experiment == "table5":
        return [run_config(params, SPLITS["IID"][0], m, seed) for m in methods for seed in seeds]
    if experiment == "table6":
        return [run_config(params, SPLITS[s][0], m, seed, n_clients=params["many_clients"])
                for s in params["many_client_splits"] for m in methods for seed in seeds]
    if experiment == "table8":
        return [run_config(params, SPLITS[s][0], "celm", seed, warmup_fraction=f)
                for s in params["warmup_splits"] for f in params["warmup_fractions"] for seed in seeds]
    if experiment == "fig6":
        return [run_config(params, SPLITS[params["sensitivity_split"]][0], "celm", seeds[0], lm_steps=steps,
                           lm_lr=lr) for steps in params["lm_steps_grid"] for lr in params["lm_lr_grid"]]
    if experiment == "fig7":
        return [run_config(params, SPLITS["PLS"][0], "celm", seeds[0], keep_probe_images=True)]
    raise ValueError(f"experiments: unknown experiment {experiment!r}")


def configs(params: dict[str, Any]) -> list[RunConfig]:
    """Every run of the chapter, without duplicates (e.g. Table 8's 5 % is Table 1's CELM)."""
    return unique_configs(experiment_configs, params)


# ----------------------------------------------------------------------------- reading runs


def finals(results: dict, configs_: list[RunConfig], metric: str = "accuracy") -> list[float]:
    """Final ``metric`` (in %) of the runs present, over seeds."""
    return [100.0 * results[c.key()].final[metric] for c in configs_
            if c.key() in results and results[c.key()].final.get(metric) is not None]


def maverick_classes(result) -> list[int]:
    """Classes held only by Maverick clients (from the run's client x class counts)."""
    counts = np.asarray(result.meta["client_class_counts"])
    roles = np.asarray(result.meta["client_roles"])
    holders = counts > 0
    mav = roles == "maverick"
    return [c for c in range(counts.shape[1]) if holders[mav, c].any() and not holders[~mav, c].any()]


def rare_class_accuracy(result) -> float:
    rare = maverick_classes(result)
    per_class = np.asarray(result.final["per_class_accuracy"])
    return float(100.0 * per_class[rare].mean()) if rare else float("nan")


def score_history(result) -> np.ndarray:
    """[rounds, clients] contribution scores recorded by the method."""
    return np.asarray([h["scores"] for h in result.history if "scores" in h], dtype=float)


def free_riders(result) -> np.ndarray:
    roles = result.meta["client_roles"]
    return np.asarray([r in ("free_rider", "weak_free_rider") for r in roles])


def last_evidence(result) -> np.ndarray | None:
    """CELM's evidence matrix Q [clients, classes] of the last warm-up round."""
    rows = [h["diagnostics"]["evidence"] for h in result.history if "evidence" in h.get("diagnostics", {})]
    return np.asarray(rows[-1], dtype=float) if rows else None


def fidelity(result) -> dict[str, float]:
    """Distances between the true client x class distribution and (i) the uniform one,
    (ii) CELM's normalised evidence — both as joint distributions over client-class cells.
    JSD in base 2; Hellinger; EMD = 1-D Wasserstein distance between the two sets of cell
    probabilities (scipy.stats.wasserstein_distance)."""
    from scipy.stats import wasserstein_distance

    from ..metrics import hellinger, jsd

    true = np.asarray(result.meta["client_class_counts"], dtype=float)
    q = last_evidence(result)
    true = (true / true.sum()).ravel()
    estimate = (q / q.sum()).ravel() if q is not None and q.sum() > 0 else np.full_like(true, np.nan)
    uniform = np.full_like(true, 1.0 / true.size)
    out = {}
    for name, other in (("Uniform", uniform), ("CELM", estimate)):
        out[f"JSD {name}"] = float(jsd(true, other))
        out[f"EMD {name}"] = float(wasserstein_distance(true, other))
        out[f"Hellinger {name}"] = float(hellinger(true, other))
    return out


# ----------------------------------------------------------------------------- tables


def method_row(results: dict, per_method: dict[str, list[RunConfig]], value=None) -> dict[str, tuple[float, float]]:
    """Mean and std (over seeds) of a per-run value for each method; default final accuracy %."""
    from ..book import mean_std

    out = {}
    for method, cfgs in per_method.items():
        runs = [results[c.key()] for c in cfgs if c.key() in results]
        values = [value(r) for r in runs] if value else [100.0 * r.final["accuracy"] for r in runs]
        out[method] = mean_std(values) if values else (float("nan"), float("nan"))
    return out


def comparison(rows: list[tuple[str, dict, dict]], profile: str, digits: int = 2):
    """A paper-vs-ours frame: for each row label, a 'paper' line and one line per source of
    ours; columns are methods. ``rows`` holds (label, paper {method: (mean, std)},
    {source label: {method: (mean, std)}})."""
    import pandas as pd

    from ..book import pm

    lines = []
    for label, paper, ours in rows:
        lines.append({"row": label, "source": "paper", **{METHOD_LABELS[m]: pm(*v, digits) for m, v in paper.items()}})
        for source, values in ours.items():
            lines.append({"row": label, "source": source,
                          **{METHOD_LABELS[m]: pm(*v, digits) for m, v in values.items()}})
    return pd.DataFrame(lines).set_index(["row", "source"])


def best_counts(rows: list[tuple[str, dict, dict]], source: str, method: str = "celm",
                higher_is_better: bool = True) -> tuple[int, int, int]:
    """(rows where ``method`` is best in ours, rows where it is best in the paper, rows compared)."""
    def is_best(values):
        finite = {m: v[0] for m, v in values.items() if v[0] == v[0]}
        if method not in finite:
            return False
        pick = max if higher_is_better else min
        return finite[method] == pick(finite.values())

    compared = [(paper, ours[source]) for _, paper, ours in rows if source in ours]
    return (sum(is_best(o) for _, o in compared), sum(is_best(p) for p, _ in compared), len(compared))


def paper_values(reference, table: str, row: str, methods) -> dict[str, tuple[float, float]]:
    from ..book import reference_value

    out = {}
    for m in methods:
        try:
            out[m] = reference_value(reference, table, row, METHOD_LABELS[m])
        except KeyError:
            out[m] = (float("nan"), float("nan"))
    return out


# ----------------------------------------------------------------------------- the results queue


def queue_items(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.queue), labelled with
    the paper cell it backs; headline rows: Dir(0.05) (Tables 1, 6), PLS (Table 4)."""
    from ..queue import items_of, run_round

    prefix = DATASET_PREFIX.get(params["dataset"], params["dataset"])
    labels = {_split_json(spec): row for spec, row in SPLITS.values()}

    def row(c, pre=prefix):
        return f"{pre} {labels.get(_split_json(c.split), c.split.name)}"

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
    add("table8", "Table 8", row, lambda c: f"{round(100 * c.method.params.get('warmup_fraction', 0.05)):d}%", rank=2)
    add("fig6", "Fig. 6", lambda c: f"L = {c.method.params.get('lm_steps')}",
        lambda c: f"η = {c.method.params.get('lm_lr')}", rank=3)
    add("fig7", "Fig. 7", lambda c: "PLS", lambda c: "probe images", rank=3)
    return items


def _split_json(spec) -> str:
    """A split spec (dict or Spec) as canonical JSON, to look its label up."""
    import json

    data = spec if isinstance(spec, dict) else {"name": spec.name, **spec.params}
    return json.dumps({k: float(v) if isinstance(v, int) and not isinstance(v, bool) and k != "name" else v
                       for k, v in data.items()}, sort_keys=True)
