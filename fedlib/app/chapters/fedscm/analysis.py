"""The FedSCM chapter's analyses: pure functions on pipeline records (``fedlib.results.RunResult``, their
sections in ``parts``) and the theory's simulations
(no page, no store): selection quality, the issue-22 diagnosis rows, Theorem 6's recovery curves, the
pipeline tables' rows and the constant-predictor demonstration. pandas is imported inside the functions
that build frames.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ....config import ScmConfig
from ....methods import scm
from ....results import RunResult
from ....scm_pipeline import method_labels
from ....stats import mean_std

if TYPE_CHECKING:
    import pandas as pd


# the pipeline's Def. 4 diagnosis keys -> (the variants table's column, the page's glue name)
EXPERTISE = {"max η̂": ("max η̂", "d_eta"), "clients with η̂ ≥ 0.5": ("clients η̂ ≥ 0.5", "d_experts"),
             "trained: mean mode share": ("mode share (trained)", "d_mode"),
             "Def. 4 simulation: mean mode share": ("mode share (Def. 4)", "d_mode_sim"),
             "trained: non-expert pairs agreeing on ≥ 90 % of inputs":
                 ("agreeing non-expert pairs (trained)", "d_pairs"),
             "Def. 4 simulation: non-expert pairs agreeing on ≥ 90 %":
                 ("agreeing non-expert pairs (Def. 4)", "d_pairs_sim")}


def selection_quality(result: RunResult, gamma_key: str | None = None) -> dict[str, float]:
    """Did the selection recover the right clients? The selected clients' mean accuracy on the
    target set against the best client, the mean client and the m most accurate clients
    (m = number selected), and the share of the selection among those m."""
    gk = gamma_key or f"{result.config['gammas'][0]:g}"
    acc = 100 * np.asarray(result.parts["clients"]["target_accuracy"])
    chosen = np.asarray(result.parts["selections"][gk]["selected"], dtype=int)
    m = max(len(chosen), 1)
    top = np.argsort(-acc, kind="stable")[:m]
    return {"selected": len(chosen), "selected accuracy (%)": float(acc[chosen].mean()) if len(chosen) else np.nan,
            "top-m accuracy (%)": float(acc[top].mean()), "mean client (%)": float(acc.mean()),
            "best client (%)": float(acc.max()),
            "share of selection in top-m": float(np.isin(chosen, top).mean()) if len(chosen) else np.nan}


def diagnosis_rows(results: dict[str, RunResult]) -> "pd.DataFrame":
    """One row per issue-22 variant: selection quality and how far the clients are from Def. 4."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    rows = []
    for name, result in results.items():
        cfg, dg = result.config, result.parts["diagnosis"]
        ex = dg.get("expertise", {})
        rows.append({"variant": name, "data": cfg["dataset"], "model": cfg["model"], "K": cfg["n_clients"],
                     "local epochs": cfg["local_epochs"], "α": cfg["alpha"],
                     "mean client size": float(np.mean(result.parts["clients"]["sizes"])),
                     **selection_quality(result), **{col: ex.get(key, np.nan) for key, (col, _) in EXPERTISE.items()}})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- theory


def _expert_sample(k, n, c, experts, seed, hard: bool, noise_alpha: float):
    ranges = {"expert_range": (0.5, 0.8), "other_range": (0.0, 0.4)} if hard else {}
    eta = scm.expertise_levels(k, experts, seed=seed, **ranges)
    return scm.simulate_expertise(k, n, c, eta, noise_alpha=noise_alpha, seed=seed)


SOLVER_VARIANTS = {"PGD (Alg. 1 step)": ("pgd", {"projection": "paper"}),
                   "PGD (Euclidean)": ("pgd", {"projection": "euclidean"}), "SLSQP": ("slsqp", {})}


def recovery_curve(values, vary: str, fixed: dict, trials: int, seed: int = 0, gamma: float = 2 / 3):
    """P(FedSCM selects exactly the 3 experts) as n or K varies, for PGD and SLSQP, in the
    hard regime (experts η ∈ [0.5, 0.8], others η ∈ [0, 0.4], Dirichlet noise α = 0.3)."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    rows = []
    for v in values:
        setting = {**fixed, vary: v}
        hits = {"pgd": 0, "slsqp": 0}
        for t in range(trials):  # independent trials of the experiment
            s = _expert_sample(setting["k"], setting["n"], setting["c"], 3, seed + 1000 * t + v, hard=True,
                               noise_alpha=0.3)
            for solver in hits:
                hits[solver] += set(scm.select(s.probs, gamma, solver).selected) == set(s.experts)
        for solver, h in hits.items():
            rows.append({vary: v, "solver": solver.upper(), "recovery": h / trials})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- pipeline tables


def accuracy_rows(results: dict[str, RunResult], cfgs: list[ScmConfig]) -> dict[str, tuple[float, float]]:
    """{method label: (mean, std) of target accuracy in %} over the runs (seeds) present."""
    present = [results[c.key()].parts["methods"] for c in cfgs if c.key() in results]
    return {label: mean_std(100 * r[label]["accuracy"] for r in present) for label in method_labels(cfgs[0])}


def constant_predictor_demo(trials: int, k: int = 50, n: int = 200, c: int = 10, seed: int = 0,
                            noise_alpha: float = 0.1, label_smoothing: float = 0.2) -> "pd.DataFrame":
    """Issue 22 in simulation: the same expertise levels (3 experts η ∈ [0.9, 1], the rest
    η ∈ [0, 0.1]) with Def. 4's per-input Dirichlet noise and with per-client noise (one Q_k
    for all inputs: constant, confident non-experts, as trained clients under label shift).
    Per noise model: exact recovery of the experts, experts among the selected, and the share
    of selections whose clients all predict one constant class."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    rows = []
    for noise in ("per_sample", "per_client"):
        exact, experts_in, constant = 0, [], 0
        for t in range(trials):
            eta = scm.expertise_levels(k, 3, seed=seed + t)
            s = scm.simulate_expertise(k, n, c, eta, noise_alpha=noise_alpha, label_smoothing=label_smoothing,
                                       seed=seed + t, noise=noise)
            chosen = scm.select(s.probs, 2 / 3, "pgd").selected
            st = scm.prediction_structure(s.probs)
            exact += set(chosen) == set(s.experts)
            experts_in.append(float(np.isin(chosen, s.experts).mean()))
            constant += bool((st["mode_share"][chosen] == 1).all()
                             and len(set(st["modal_class"][chosen].tolist())) == 1)
        rows.append({"non-expert noise": {"per_sample": "Def. 4: fresh Q per input",
                                          "per_client": "one Q per client (constant predictor)"}[noise],
                     "exact recovery": exact / trials, "experts among the selected": float(np.mean(experts_in)),
                     "selection = constant predictors of one class": constant / trials})
    return pd.DataFrame(rows)
