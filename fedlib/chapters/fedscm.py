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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..methods import scm
from ..scm_pipeline import ScmConfig, make_scm_config, method_labels

if TYPE_CHECKING:
    import pandas as pd

PIPELINE_KEYS = ("dataset", "model", "fraction", "n_clients", "sigma", "server_samples", "eval_samples",
                 "local_epochs", "batch_size", "lr", "momentum", "post_rounds", "post_steps", "post_lr", "prox_mu", "gammas",
                 "solver", "random_sizes", "sdea_clients", "fedavg_per_round")
OPTIONAL_KEYS = ("projection", "rounding", "temperatures", "adapt_steps", "vote_gate", "cf_permutations", "ot_reg",
                 "ot_samples", "comda_clients")  # ScmConfig's defaults when a profile omits them


def pipeline_config(params: dict[str, Any], shift: str, alpha: float, seed: int) -> ScmConfig:
    """One federation of the chapter's protocol; Table 1's repeated selections ride on the
    federation with ``alpha == stability_alpha`` (seed 0 of the profile)."""
    data = {k: params[k] for k in PIPELINE_KEYS}
    data.update({k: params[k] for k in OPTIONAL_KEYS if params.get(k) is not None})
    stability = (shift == "label" and alpha == params["stability_alpha"] and seed == params["seeds"][0])
    return make_scm_config(data, source="fedscm params", shift=shift, alpha=alpha, seed=seed,
                           stability_runs=params["stability_runs"] if stability else 0,
                           stability_kappa=params["stability_kappa"])


def experiment_configs(params: dict[str, Any], experiment: str) -> list[ScmConfig]:
    if experiment == "table2":
        return [pipeline_config(params, "label", a, s) for a in params["alphas"] for s in params["seeds"]]
    if experiment == "table4":
        return [pipeline_config(params, "covariate", params["alphas"][0], s) for s in params["seeds"]]
    raise ValueError(f"experiments: unknown experiment {experiment!r}")


def configs(params: dict[str, Any]) -> list[ScmConfig]:
    """Every federation the chapter runs (Tables 1–4; the issue-22 variants: ``diagnosis_configs``)."""
    return [c for e in params["experiments"] for c in experiment_configs(params, e)]


def diagnosis_configs(params: dict[str, Any]) -> list[tuple[str, ScmConfig]]:
    """Issue 22 (c): selection-only federations (no post-training, FedSCM and Best Source
    only) at label shift α = ``stability_alpha``, first seed, each with one protocol change
    from ``diagnosis_variants`` (a list of ScmConfig overrides) — the profile's own protocol
    first, as ``as profiled``."""
    base = pipeline_config(params, "label", params["stability_alpha"], params["seeds"][0]).to_dict()
    base.update(methods=("fedscm", "best_source"), post_rounds=0, stability_runs=0,
                expertise_repeats=max(base["expertise_repeats"], 2))
    out = [("as profiled", make_scm_config(base, source="fedscm params"))]
    for change in params.get("diagnosis_variants") or []:
        name = ", ".join(f"{k} = {v}" for k, v in change.items())
        out.append((name, make_scm_config({**base, **change}, source=f"fedscm params: diagnosis_variants {name}")))
    return out


def selection_quality(result: dict, gamma_key: str | None = None) -> dict[str, float]:
    """Did the selection recover the right clients? The selected clients' mean accuracy on the
    target set against the best client, the mean client and the m most accurate clients
    (m = number selected), and the share of the selection among those m."""
    gk = gamma_key or f"{result['config']['gammas'][0]:g}"
    acc = 100 * np.asarray(result["clients"]["target_accuracy"])
    chosen = np.asarray(result["selections"][gk]["selected"], dtype=int)
    m = max(len(chosen), 1)
    top = np.argsort(-acc, kind="stable")[:m]
    return {"selected": len(chosen), "selected accuracy (%)": float(acc[chosen].mean()) if len(chosen) else np.nan,
            "top-m accuracy (%)": float(acc[top].mean()), "mean client (%)": float(acc.mean()),
            "best client (%)": float(acc.max()),
            "share of selection in top-m": float(np.isin(chosen, top).mean()) if len(chosen) else np.nan}


def diagnosis_rows(results: dict[str, dict]) -> "pd.DataFrame":
    """One row per issue-22 variant: selection quality and how far the clients are from Def. 4."""
    import pandas as pd

    rows = []
    for name, result in results.items():
        cfg, dg = result["config"], result["diagnosis"]
        ex = dg.get("expertise", {})
        rows.append({"variant": name, "data": cfg["dataset"], "model": cfg["model"], "K": cfg["n_clients"],
                     "local epochs": cfg["local_epochs"], "α": cfg["alpha"],
                     "mean client size": float(np.mean(result["clients"]["sizes"])),
                     **selection_quality(result),
                     "max η̂": ex.get("max η̂", np.nan), "clients η̂ ≥ 0.5": ex.get("clients with η̂ ≥ 0.5", np.nan),
                     "mode share (trained)": ex.get("trained: mean mode share", np.nan),
                     "mode share (Def. 4)": ex.get("Def. 4 simulation: mean mode share", np.nan),
                     "agreeing non-expert pairs (trained)":
                         ex.get("trained: non-expert pairs agreeing on ≥ 90 % of inputs", np.nan),
                     "agreeing non-expert pairs (Def. 4)":
                         ex.get("Def. 4 simulation: non-expert pairs agreeing on ≥ 90 %", np.nan)})
    return pd.DataFrame(rows)


def selection_counts(results: dict[str, dict], gammas) -> "pd.DataFrame":
    """Issue 18.4: per γ, the solver's raw support (the selection), the count after vertex
    rounding (Theorem 3's ⌈1/(1−γ)⌉), the paper's stated count, and Σλ of the raw output."""
    import pandas as pd

    paper_count = {0.67: 3, 0.7: 4, 0.8: 5, 0.9: 10}
    rows = []
    for g in gammas:
        gk = f"{g:g}"
        raw = [len(r["selections"][gk]["raw_selected"]) for r in results.values() if gk in r.get("selections", {})]
        vert = [len(r["selections"][gk]["vertex_selected"]) for r in results.values() if gk in r.get("selections", {})]
        total = [float(np.sum(r["selections"][gk]["raw_weights"])) for r in results.values()
                 if gk in r.get("selections", {})]
        full, rest, count = scm.vertex_counts(g)
        rows.append({"γ": g, "cap 1 − γ": round(1 - g, 4), "raw support (selected), runs": ", ".join(map(str, raw)),
                     "Σλ raw (min)": min(total) if total else np.nan,
                     "vertex rounding": ", ".join(map(str, vert)), "⌈1/(1−γ)⌉": count,
                     "clients at the cap": full, "remainder": round(rest, 4), "paper says": paper_count.get(g, "—")})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- theory


def _expert_sample(k, n, c, experts, seed, hard: bool, noise_alpha: float):
    ranges = {"expert_range": (0.5, 0.8), "other_range": (0.0, 0.4)} if hard else {}
    eta = scm.expertise_levels(k, experts, seed=seed, **ranges)
    return scm.simulate_expertise(k, n, c, eta, noise_alpha=noise_alpha, seed=seed)


SOLVER_VARIANTS = {"PGD (Alg. 1 step)": ("pgd", {"projection": "paper"}),
                   "PGD (Euclidean)": ("pgd", {"projection": "euclidean"}), "SLSQP": ("slsqp", {})}


def sparsity_table(gammas, k: int = 50, n: int = 200, c: int = 10, trials: int = 5, seed: int = 0):
    """Theorem 3 per γ: non-zero weights of each solver's raw output (the selection), Σλ, how
    far the output is from the vertex its weights rank highest, and whether it has the structure."""
    import pandas as pd

    rows = []
    for gamma in gammas:
        full, rest, count = scm.vertex_counts(gamma)
        for label, (solver, extra) in SOLVER_VARIANTS.items():
            nonzero, dist, structured, total = [], [], [], []
            for t in range(trials):
                s = _expert_sample(k, n, c, 3, seed + t, hard=False, noise_alpha=1.0)
                out = scm.select(s.probs, gamma, solver, **extra)
                nonzero.append(len(out.selected))
                total.append(float(out.raw.sum()))
                dist.append(float((out.raw - scm.to_vertex(out.raw, gamma)).abs().sum()))
                structured.append(scm.is_sparse_vertex(out.raw, gamma, atol=1e-5))
            rows.append({"γ": gamma, "solver": label, "⌈1/(1−γ)⌉": count, "Σλ (min)": min(total),
                         "weights at 1−γ": full, "remainder weight": round(rest, 4),
                         "non-zero (raw, mean)": float(np.mean(nonzero)),
                         "L1 to vertex (raw, max)": float(np.max(dist)),
                         "raw output is a vertex": f"{sum(structured)}/{trials}"})
    return pd.DataFrame(rows)


def recovery_curve(values, vary: str, fixed: dict, trials: int, seed: int = 0, gamma: float = 2 / 3):
    """P(FedSCM selects exactly the 3 experts) as n or K varies, for PGD and SLSQP, in the
    hard regime (experts η ∈ [0.5, 0.8], others η ∈ [0, 0.4], Dirichlet noise α = 0.3)."""
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


def optimum_table(gammas, k: int = 10, n: int = 60, c: int = 6, trials: int = 20, seed: int = 0):
    """How often PGD (Algorithm 1's step) and SLSQP select the clients of the global optimum
    found by exhaustive search over all vertices (small K), and the worst objective gap at
    the vertex of their output (Algorithm 1's step can leave Σλ < 1, so its raw objective is
    not comparable)."""
    import pandas as pd

    rows = []
    for gamma in gammas:
        gaps = {"pgd": [], "slsqp": []}
        same = {"pgd": 0, "slsqp": 0}
        for t in range(trials):
            s = _expert_sample(k, n, c, 3, seed + t, hard=False, noise_alpha=0.5)
            best = scm.exhaustive(s.probs, gamma)
            for solver, found in gaps.items():
                out = scm.select(s.probs, gamma, solver)
                found.append(float(scm.objective(scm.to_vertex(out.raw, gamma), s.probs)) - best.objective)
                same[solver] += set(out.selected) == set(best.selected)
        for solver, g in gaps.items():
            g = np.asarray(g)
            rows.append({"γ": gamma, "solver": solver.upper(), "vertices searched": len(scm.all_vertices(k, gamma)),
                         "global optimum reached": f"{int((g < 1e-9).sum())}/{trials}",
                         "same clients as the optimum": f"{same[solver]}/{trials}",
                         "max objective gap": float(g.max())})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- pipeline tables


def accuracy_rows(results: dict, cfgs: list[ScmConfig]) -> dict[str, tuple[float, float]]:
    """{method label: (mean, std) of target accuracy in %} over the runs (seeds) present."""
    from ..book import mean_std

    out = {}
    for label in method_labels(cfgs[0]):
        values = [100 * results[c.key()]["methods"][label]["accuracy"] for c in cfgs if c.key() in results]
        out[label] = mean_std(values)
    return out


def paper_rows(reference, table: str, column: str, labels) -> dict[str, tuple[float, float]]:
    from ..book import reference_value

    out = {}
    for label in labels:
        try:
            out[label] = reference_value(reference, table, label, column)
        except KeyError:
            out[label] = (float("nan"), float("nan"))
    return out


def table1_frame(result: dict, reference):
    import pandas as pd

    from ..book import reference_value

    st = result["stability"]
    rows = []
    for label in ("FedSCM", "FedSCM+SR"):
        rows.append({"method": label, "source": "paper",
                     **{m: reference_value(reference, "Table 1", label, m)[0] for m in scm.STABILITY_METRICS}})
        rows.append({"method": label, "source": "ours", **st[label]})
    return pd.DataFrame(rows).set_index(["method", "source"])


def selected_vs_unselected(result: dict, gamma_key: str) -> dict[str, dict[str, float]]:
    """Fig. 6's comparison as numbers: mean accuracy on the target set and 1 − JSD to the
    target's label distribution of selected and unselected clients."""
    cl = result["clients"]
    sel = np.zeros(len(cl["sizes"]), dtype=bool)
    sel[result["selections"][gamma_key]["selected"]] = True
    out = {}
    for name, mask in (("selected", sel), ("unselected", ~sel)):
        out[name] = {"target accuracy (%)": 100 * float(np.mean(np.asarray(cl["target_accuracy"])[mask])),
                     "1 − JSD to target labels": float(np.mean(np.asarray(cl["similarity"])[mask])),
                     "mean prediction entropy": float(np.mean(np.asarray(cl["mean_entropy"])[mask])),
                     "local samples": float(np.mean(np.asarray(cl["sizes"])[mask]))}
    return out


def accuracy_rank_of_selected(result: dict, gamma_key: str) -> float:
    """Mean percentile (0–100) of the selected clients' target accuracy among all K clients."""
    acc = np.asarray(result["clients"]["target_accuracy"])
    chosen = result["selections"][gamma_key]["selected"]
    return float(np.mean([100.0 * (acc < acc[i]).mean() for i in chosen]))


def issue_recovery(trials: int, seed: int = 0) -> dict[str, float]:
    """The test's setting: K = 50, C = 10, 3 experts with η ∈ [0.9, 1], the rest η ∈ [0, 0.1],
    n = 200, γ = 2/3, Dirichlet(1) noise: the share of trials recovering exactly the experts."""
    hits = {"pgd": 0, "slsqp": 0}
    for t in range(trials):
        s = _expert_sample(50, 200, 10, 3, seed + t, hard=False, noise_alpha=1.0)
        for solver in hits:
            hits[solver] += set(scm.select(s.probs, 2 / 3, solver).selected) == set(s.experts)
    return {k: v / trials for k, v in hits.items()}


def data_label(result: dict, model: str) -> str:
    """How the page names the data a pipeline ran on."""
    source = result["meta"]["dataset_source"]
    name = result["config"]["dataset"]
    if name == "cifar10":
        return f"CIFAR-10{' (JPEG copy)' if 'JPEG' in source or 'jpeg' in source else ''}, {model}"
    return {"fmnist": "Fashion-MNIST stand-in"}.get(name, name) + f", {model}"


# ----------------------------------------------------------------------------- stored runs


def store_results(profile: str = "paper", progress: bool = True, diagnosis: bool = False) -> list:
    """Run a profile's federations and keep each under ``results/runs/<key>.json`` with its
    provenance (``fedlib.results.store_run``; files that exist are not recomputed). ``diagnosis=True``
    runs the issue-22 selection-only variants (``diagnosis_configs``) first — cheap next to the tables."""
    from ..book import load_profile, results_dir
    from ..cache import ResultCache
    from ..results import store_run
    from ..scm_pipeline import run_pipeline

    store = ResultCache(results_dir(), protect=True)
    written = []
    params = load_profile("fedscm", profile)
    cfgs = ([c for _, c in diagnosis_configs(params)] if diagnosis else []) + configs(params)
    for i, config in enumerate(cfgs):
        if store.get(config.key()) is not None:
            continue
        if progress:
            print(f"[{i + 1}/{len(cfgs)}] fedscm: {config.shift} α={config.alpha} seed {config.seed}", flush=True)
        result = run_pipeline(config, progress=progress)
        written.append(store_run(config.key(), config.to_dict(), result))
    return written


def stored_results(params: dict[str, Any], diagnosis: bool = False) -> dict[str, dict]:
    """Stored pipeline results (``results/runs/``) whose config is one of ``configs(params)``
    (with ``diagnosis=True``: of ``diagnosis_configs(params)``)."""
    from ..book import results_dir
    from ..cache import ResultCache

    store = ResultCache(results_dir(), protect=True)
    out = {}
    for config in ([c for _, c in diagnosis_configs(params)] if diagnosis else configs(params)):
        payload = store.get(config.key())
        if payload is not None:
            out[config.key()] = payload["result"]
    return out


def constant_predictor_demo(trials: int, k: int = 50, n: int = 200, c: int = 10, seed: int = 0,
                            noise_alpha: float = 0.1, label_smoothing: float = 0.2) -> "pd.DataFrame":
    """Issue 22 in simulation: the same expertise levels (3 experts η ∈ [0.9, 1], the rest
    η ∈ [0, 0.1]) with Def. 4's per-input Dirichlet noise and with per-client noise (one Q_k
    for all inputs: constant, confident non-experts, as trained clients under label shift).
    Per noise model: exact recovery of the experts, experts among the selected, and the share
    of selections whose clients all predict one constant class."""
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
            constant += bool((st["mode_share"][chosen] == 1).all() and len(set(st["modal_class"][chosen].tolist())) == 1)
        rows.append({"non-expert noise": {"per_sample": "Def. 4: fresh Q per input",
                                          "per_client": "one Q per client (constant predictor)"}[noise],
                     "exact recovery": exact / trials, "experts among the selected": float(np.mean(experts_in)),
                     "selection = constant predictors of one class": constant / trials})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- the results queue

DATASET_LABELS = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "svhn": "SVHN", "fmnist": "F.MNIST"}


def queue_items(params: dict[str, Any]) -> list:
    """Every federation of the profile for ``python -m fedlib results`` (fedlib.queue): one
    pipeline run backs a whole column of Table 2 (all methods); the seed-0 federation at
    ``stability_alpha`` also carries Table 1; headline: α = 0.1."""
    from ..queue import QueueItem, run_scm

    first = params["seeds"][0]
    label = DATASET_LABELS.get(params["dataset"], params["dataset"])
    items = []
    for experiment in params["experiments"]:
        for c in experiment_configs(params, experiment):
            if experiment == "table2":
                column = f"{label} α={c.alpha:g}" if c.alpha != 1 else f"{label} α=1.0"
                backs = [("Table 2", "*", column)] + ([("Table 1", "*", "*")] if c.stability_runs else [])
                items.append(QueueItem("fedscm", "Table 2", "all methods", column, c.seed, c, run_scm,
                                       headline=c.alpha == 0.1, first_seed=c.seed == first, backs=tuple(backs)))
            else:
                items.append(QueueItem("fedscm", "Table 4", "all methods", label, c.seed, c, run_scm, table_rank=1,
                                       headline=True, first_seed=c.seed == first, backs=(("Table 4", "*", label),)))
    return items
