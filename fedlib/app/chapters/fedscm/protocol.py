"""The FedSCM chapter: sparse consensus matching, its theory checked by simulation, and
the one-shot selection pipeline (Algorithm 2) against its baselines.

Theory (simulated client predictions under the Dirichlet expertise model, Def. 4):
  sparsity   Theorem 3: the solvers' own outputs (before any rounding) per γ
  recovery   Theorem 6: P(exact recovery of the experts) vs n and vs K
  optimum    Theorem 9: PGD and SLSQP against exhaustive search over vertices (small K)
Pipeline (``fedlib.scm_pipeline``; one federation per shift, α and seed):
  table2     label + quantity shift, Dirichlet α in ``alphas``            (Table 2)
  table4     covariate shift, per-client affine maps with σ                (Table 4)
  table1     stability of repeated selections with/without the size regulariser (Table 1)
  fig5/fig8  client weights and η̂ against target accuracy                (Fig. 5, Fig. 8)
The page (book/fedscm.ipynb) is ``FedSCM``: one method per table or figure.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ....config import ScmConfig
from ....results import RunResult
from ....store import Store
from ....scm_pipeline import run_pipeline
from ...kit.claim_types import Claim, Comparison, Side
from ...kit.items import run_scm
from ...kit.sources import load_profile
from .. import configs_of
from ..base import dataset_label, queue_item
from ..profiles import Names, Profile, Seeds

if TYPE_CHECKING:
    pass


PIPELINE_KEYS = ("dataset", "model", "fraction", "n_clients", "sigma", "server_samples", "eval_samples",
                 "local_epochs", "batch_size", "lr", "momentum", "post_rounds", "post_steps", "post_lr", "prox_mu",
                 "gammas", "solver", "random_sizes", "sdea_clients", "fedavg_per_round")
OPTIONAL_KEYS = ("projection", "rounding", "temperatures", "adapt_steps", "vote_gate", "cf_permutations", "ot_reg",
                 "ot_samples", "comda_clients")  # ScmConfig's defaults when a profile omits them


def pipeline_config(params: dict[str, Any], shift: str, alpha: float, seed: int) -> ScmConfig:
    """One federation of the chapter's protocol; Table 1's repeated selections ride on the
    federation with ``alpha == stability_alpha`` (seed 0 of the profile)."""
    data = {k: params[k] for k in PIPELINE_KEYS}
    data.update({k: params[k] for k in OPTIONAL_KEYS if params.get(k) is not None})
    stability = (shift == "label" and alpha == params["stability_alpha"] and seed == params["seeds"][0])
    return ScmConfig.make(data, source="fedscm params", shift=shift, alpha=alpha, seed=seed,
                           stability_runs=params["stability_runs"] if stability else 0,
                           stability_kappa=params["stability_kappa"])


def experiment_configs(params: dict[str, Any], experiment: str) -> list[ScmConfig]:
    if experiment == "table2":
        return [pipeline_config(params, "label", a, s) for a in params["alphas"] for s in params["seeds"]]
    if experiment == "table4":
        return [pipeline_config(params, "covariate", params["alphas"][0], s) for s in params["seeds"]]
    raise ValueError(f"experiments: unknown experiment {experiment!r}")




def diagnosis_configs(params: dict[str, Any]) -> list[tuple[str, ScmConfig]]:
    """Issue 22 (c): selection-only federations (no post-training, FedSCM and Best Source
    only) at label shift α = ``stability_alpha``, first seed, each with one protocol change
    from ``diagnosis_variants`` (a list of ScmConfig overrides) — the profile's own protocol
    first, as ``as profiled``."""
    base = pipeline_config(params, "label", params["stability_alpha"], params["seeds"][0]).to_dict()
    base.update(methods=("fedscm", "best_source"), post_rounds=0, stability_runs=0,
                expertise_repeats=max(base["expertise_repeats"], 2))
    out = [("as profiled", ScmConfig.make(base, source="fedscm params"))]
    for change in params.get("diagnosis_variants") or []:
        name = ", ".join(f"{k} = {v}" for k, v in change.items())
        out.append((name, ScmConfig.make({**base, **change}, source=f"fedscm params: diagnosis_variants {name}")))
    return out


# ----------------------------------------------------------------------------- reading runs


def selected_vs_unselected(result: RunResult, gamma_key: str) -> dict[str, dict[str, float]]:
    """Fig. 6's comparison as numbers: mean accuracy on the target set and 1 − JSD to the
    target's label distribution of selected and unselected clients."""
    cl = result.parts["clients"]
    sel = np.zeros(len(cl["sizes"]), dtype=bool)
    sel[result.parts["selections"][gamma_key]["selected"]] = True
    out = {}
    for name, mask in (("selected", sel), ("unselected", ~sel)):
        out[name] = {"target accuracy (%)": 100 * float(np.mean(np.asarray(cl["target_accuracy"])[mask])),
                     "1 − JSD to target labels": float(np.mean(np.asarray(cl["similarity"])[mask])),
                     "mean prediction entropy": float(np.mean(np.asarray(cl["mean_entropy"])[mask])),
                     "local samples": float(np.mean(np.asarray(cl["sizes"])[mask]))}
    return out


# ----------------------------------------------------------------------------- stored runs


def store_results(profile: str = "paper", progress: bool = True, diagnosis: bool = False) -> list:
    """Run a profile's federations and keep each under ``results/runs/<key>.json.zd`` with its
    provenance (``fedlib.results.store_run``; files that exist are not recomputed). ``diagnosis=True``
    runs the issue-22 selection-only variants (``diagnosis_configs``) first — cheap next to the tables."""
    store = Store()
    written = []
    params = load_profile("fedscm", profile)
    cfgs = ([c for _, c in diagnosis_configs(params)] if diagnosis else []) + configs(params)
    for i, config in enumerate(cfgs):
        if store.read(config.key())[0] is not None:
            continue
        if progress:
            print(f"[{i + 1}/{len(cfgs)}] fedscm: {config.shift} α={config.alpha} seed {config.seed}", flush=True)
        result = run_pipeline(config, progress=progress)
        written.append(store.put(config.key(), config.to_dict(), result.to_dict()))
    return written


def stored_results(params: dict[str, Any], diagnosis: bool = False) -> dict[str, RunResult]:
    """Stored pipeline records (``results/runs/``) whose config is one of ``configs(params)``
    (with ``diagnosis=True``: of ``diagnosis_configs(params)``), by config key."""
    store = Store()
    out = {}
    for config in ([c for _, c in diagnosis_configs(params)] if diagnosis else configs(params)):
        payload, _ = store.read(config.key())
        if payload is not None:
            out[config.key()] = RunResult.from_dict(payload["result"])
    return out


# ----------------------------------------------------------------------------- the results queue


def runs(params: dict[str, Any]) -> list:
    """Every federation of the profile for ``python -m fedlib results`` (fedlib.app.queue): one
    pipeline run backs a whole column of Table 2 (all methods); the seed-0 federation at
    ``stability_alpha`` also carries Table 1; headline: α = 0.1."""
    item = partial(queue_item, "fedscm", params, runner=run_scm)
    label, items = dataset_label(params["dataset"]), []
    for experiment in params["experiments"]:
        for c in experiment_configs(params, experiment):
            if experiment == "table2":
                column = f"{label} α={c.alpha:g}" if c.alpha != 1 else f"{label} α=1.0"
                backs = [("Table 2", "*", column)] + ([("Table 1", "*", "*")] if c.stability_runs else [])
                items.append(item("Table 2", "all methods", column, c, headline=c.alpha == 0.1, backs=tuple(backs)))
            else:
                items.append(item("Table 4", "all methods", label, c, table_rank=1, headline=True,
                                  backs=(("Table 4", "*", label),)))
    return items


# ----------------------------------------------------------------------------- the declaration


class FedSCMProfile(Profile):
    dataset: str
    model: str
    fraction: float
    n_clients: int
    alphas: list[float]  # Table 2's Dirichlet α
    sigma: float
    server_samples: int
    eval_samples: int
    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    post_rounds: int
    post_steps: int | None  # null: every local step of an epoch
    post_lr: float
    prox_mu: float
    gammas: list[float]
    solver: str
    random_sizes: list[int]
    sdea_clients: int
    fedavg_per_round: int | None  # null: every client each round
    seeds: Seeds
    experiments: Names
    stability_runs: int
    stability_kappa: float
    stability_alpha: float
    sparsity_gammas: list[float]
    theory_trials: int
    n_grid: list[int]
    k_grid: list[int]
    k_grid_n: int
    optimum_trials: int
    projection: str
    rounding: str
    temperatures: list[float]
    adapt_steps: int
    vote_gate: float
    cf_permutations: int
    ot_reg: float
    ot_samples: int
    comda_clients: int
    diagnosis_variants: list[dict[str, Any]]  # each: the protocol's keys (or alpha) it changes


def scm_accuracy(result: dict, label: str) -> float:
    """A pipeline run's target accuracy (%) of the method ``label``: the claims' reading of Table 2 (the
    claims read a stored run as its dict: ``RunResult.to_dict()``'s layout)."""
    return 100.0 * float(RunResult.from_dict(result).parts["methods"][label]["accuracy"])


def selected_minus_unselected(result: dict, gamma: str) -> float:
    """Target accuracy (points) of the clients FedSCM selects at ``gamma`` minus the others' (Fig. 5), of a
    stored run's dict (as the claims read runs)."""
    split = selected_vs_unselected(RunResult.from_dict(result), gamma)
    return split["selected"]["target accuracy (%)"] - split["unselected"]["target accuracy (%)"]


def table2_claim_columns() -> list[str]:
    return [f"CIFAR-10 α={a}" for a in ("1.0", "0.1", "0.01")]


CLAIMS = (
    Claim("FedSCM (γ = 0.67) beats FedAvg on every CIFAR-10 Table 2 column", "Table 2",
          "tables-23-label-and-quantity-shift",
          tuple(Comparison(col, Side(("Table 2", "all methods", col), "scm_accuracy", "FedSCM (γ = 0.67)",
                                     ref=("Table 2", "FedSCM (γ = 0.67)", col)),
                           Side(("Table 2", "all methods", col), "scm_accuracy", "FedAvg", ref=("Table 2", "FedAvg", col)))
                for col in table2_claim_columns())),
    Claim("FedSCM's selection recovers the experts: the selected clients are more accurate on the target "
          "than the others (γ = 0.67)", "Fig. 5", "fig-5-which-clients-does-fedscm-pick",
          tuple(Comparison(col, Side(("Table 2", "all methods", col), "selected_minus_unselected", "0.67"))
                for col in table2_claim_columns())),
)


configs = partial(configs_of, runs)  # every run once, in the order of the first cell naming it
