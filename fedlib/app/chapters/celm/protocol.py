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
  precision_screen   uniform FedAvg on CIFAR-10 Dir(0.05) in float32 and in bfloat16 local training, every
                     seed: bfloat16 backs the CIFAR-10 cells only if the paired difference's 95 % interval
                     lies within ±1 point (``precisions.PRECISION_MARGIN``; issue 45)

PLS holds the class allocation ``PLS_ALLOCATION`` (k_i classes for client i), the one chosen by
``choose_pls_allocation`` among those that reproduce Table 4's Uniform column; CFFL runs with
``split_kind = "label_imbalance"`` (its authors' 1/6 removal coefficient) on PLS and SLS.

Table 7 (App. B.3) states only EMNIST's 47 classes and 5 clients; the rest of its protocol is our reading:
the chapter's own (the profile's model, rounds, lr schedule, batch, seeds and Table 1's splits) on
EMNIST balanced, PLS and SLS by the partition's step rule over the 47 classes (``PLS_ALLOCATION`` is a
10-class allocation), see ``table7_split``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import numpy as np

from .... import partition
from ....config import RunConfig, make_config
from ....contributions import contribution_history
from ....metrics import joint_distances
from ....results import RunResult
from ...kit.claim_types import Claim, Comparison, Side, cells_row
from ...kit.items import items_of, run_round
from .. import precisions, readings, run_options, configs_of
from ..base import dataset_label, queue_item
from ..profiles import FederationProfile, Names, Part

METHOD_LABELS = {"fedavg_uniform": "FedAvg", "cffl": "CFFL", "cgsv": "CGSV", "shapfed": "ShapFed", "celm": "CELM"}
DETECTORS = ("cffl", "cgsv", "shapfed", "celm")  # methods with contribution scores (Table 3)

# PLS: classes per client, the allocation that reproduces Table 4's Uniform column, chosen by
# ``choose_pls_allocation`` among ``pls_class_count_search()``'s (tests/app/test_celm.py checks both).
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
               cifar10: bool = False, dataset: str | None = None, precision: str | None = None,
               **method_params) -> RunConfig:
    """One run of the chapter's protocol (``cifar10``: the CIFAR-10 variant of Table 1, the CNN with
    its own data fraction, rounds, lr milestones and the precision the screen adopted, ``cifar10_precision``;
    ``dataset``: another dataset under the profile's own protocol, e.g. Table 7's EMNIST; ``precision``:
    local training's, over the profile's)."""
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
        precision=precision or (precisions.in_force(params) if cifar10 else "float32"),
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
    if experiment == "precision_screen":
        return [config for _, config in precision_screen_configs(params)]
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


def cifar10_reading_configs(params: dict[str, Any], seed: int | None = None) -> list:
    """(split, reading, config): uniform FedAvg's CIFAR-10 Table 1 run on the profile's
    ``cifar10_reading_splits`` (default the headline Dir(0.05)) under each reading of the CIFAR-10 recipe
    the paper leaves open (``fedlib.app.chapters.readings``; issue 30), on one seed (default the first), each
    changing the original recipe whichever the profile adopted (``cifar10_reading``)."""
    seed = params["seeds"][0] if seed is None else seed
    base = readings.screen_params(params)
    return readings.reading_configs(lambda s: run_config(base, SPLITS[s][0], "fedavg_uniform", seed, cifar10=True),
                                    params.get("cifar10_reading_splits", ["Dir(0.05)"]))


PRECISION_SPLIT = "Dir(0.05)"  # the headline split the screen runs on


def precision_screen_configs(params: dict[str, Any]) -> list[tuple[str, RunConfig]]:
    """(precision, config): uniform FedAvg's CIFAR-10 Table 1 run on ``PRECISION_SPLIT`` in each of
    ``precisions.PRECISIONS``, every seed of the profile; the arm of the adopted precision (``cifar10_precision``)
    is Table 1's own FedAvg runs."""
    return precisions.screen_configs(lambda seed, p: run_config(params, SPLITS[PRECISION_SPLIT][0], "fedavg_uniform",
                                                               seed, cifar10=True, precision=p), params["seeds"])




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
    true, q = np.asarray(result.meta["client_class_counts"], dtype=float), last_evidence(result)
    uniform = joint_distances(true, np.ones_like(true))
    celm = joint_distances(true, q) if q is not None and q.sum() > 0 else dict.fromkeys(uniform, float("nan"))
    return {f"{m} {s}": d[m] for m in uniform for s, d in (("Uniform", uniform), ("CELM", celm))}


def _only_held_by(counts: np.ndarray, clients: np.ndarray) -> list[int]:
    """Classes held by some of the masked clients and by none of the others."""
    inside, outside = counts[clients].sum(0) > 0, counts[~clients].sum(0) > 0
    return np.flatnonzero(inside & ~outside).tolist()


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


# ----------------------------------------------------------------------------- the results queue


def runs(params: dict[str, Any]) -> list:
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
    if "precision_screen" in params["experiments"]:  # float32 vs bfloat16 local training (issue 45)
        items.extend(queue_item("celm", params, "Precision screen", f"CIFAR-10 {SPLITS[PRECISION_SPLIT][1]}",
                                precision, config, table_rank=1, headline=True)
                     for precision, config in precision_screen_configs(params))
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
    cifar10_precision: Literal["float32", "bfloat16"] = "float32"  # CIFAR-10 local training's: the screen's call
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


configs = partial(configs_of, runs)  # every run once, in the order of the first cell naming it
