"""The logit-based FL chapter ("Who to trust?", arXiv 2509.15147).

Experiments, each a list of configs sharing one protocol (``params/logitfl/<profile>.yaml``):
  k_sweep      MNIST, k ∈ ks classes per client: simple / UWA / meta-model, plus FedAvg
  cifar10      the same on CIFAR-10 (the data root's copy) for cifar10_ks
  public_size  the public-set ablation (public_size -> each of public_sizes_ablation), k = ks[0]
  dropout      client dropout (each client misses a round with probability p), k = ks[0]
  uwa_tau      UWA with a softer softmax over clients (our variant, τ > 1), k = ks[0]

Logit runs are ``LogitConfig`` (``fedlib.logit_run``); the FedAvg baselines are ordinary
``RunConfig`` runs on the same split with the public set held out (``fedavg_config``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import RunConfig
from ..logit_run import LogitConfig, fedavg_config, make_logit_config
from . import unique_configs

LABELS = {"simple": "Simple avg.", "uwa": "UWA", "meta": "Meta-model", "fedavg": "FedAvg"}
EXPERIMENTS = ("k_sweep", "cifar10", "public_size", "dropout", "uwa_tau")


def logit_config(params: dict[str, Any], aggregator: str, k: int, seed: int, cifar10: bool = False,
                 **overrides) -> LogitConfig:
    """One logit run of the chapter's protocol (``cifar10``: the CIFAR-10 variant)."""
    data = dict(dataset=params["dataset"], model=params["model"], fraction=params["fraction"],
                public_size=params["public_size"], rounds=params["rounds"])
    if cifar10:
        data = dict(dataset="cifar10", model=params["cifar10_model"], fraction=params["cifar10_fraction"],
                    public_size=params["cifar10_public_size"], rounds=params["cifar10_rounds"])
    data.update(overrides)
    return make_logit_config(
        **data, n_clients=params["n_clients"], k=k, aggregator=aggregator, seed=seed,
        test_samples=params["test_samples"], meta_labeled=min(params["meta_labeled"], data["public_size"]),
        local_epochs=params["local_epochs"], distill_epochs=params["distill_epochs"],
        batch_size=params["batch_size"], lr=params["lr"], temperature=params["temperature"],
        meta_steps=params["meta_steps"],
    )


def experiment_configs(params: dict[str, Any], experiment: str) -> list[LogitConfig | RunConfig]:
    """The runs of one experiment: logit configs, then the FedAvg baselines where it has them."""
    seeds, aggregators = params["seeds"], params["aggregators"]
    k0 = params["ks"][0]
    if experiment == "k_sweep":
        runs = [logit_config(params, a, k, s) for k in params["ks"] for a in aggregators for s in seeds]
        return runs + [fedavg_config(logit_config(params, "simple", k, s)) for k in params["ks"] for s in seeds]
    if experiment == "cifar10":
        runs = [logit_config(params, a, k, s, cifar10=True) for k in params["cifar10_ks"] for a in aggregators
                for s in seeds]
        return runs + [fedavg_config(logit_config(params, "simple", k, s, cifar10=True))
                       for k in params["cifar10_ks"] for s in seeds]
    if experiment == "public_size":
        return [logit_config(params, a, k0, s, public_size=n) for n in params["public_sizes_ablation"]
                for a in aggregators for s in seeds]
    if experiment == "dropout":
        return [logit_config(params, a, k0, s, dropout=p) for p in params["dropouts"] for a in aggregators
                for s in seeds]
    if experiment == "uwa_tau":
        return [logit_config(params, "uwa", k0, s, uwa_tau=tau) for tau in params["uwa_taus"] for s in seeds]
    raise ValueError(f"experiments: unknown experiment {experiment!r}; known: {', '.join(EXPERIMENTS)}")


def configs(params: dict[str, Any], experiments=None) -> list[LogitConfig | RunConfig]:
    """Every run of the chapter (or of ``experiments``), without duplicates."""
    return unique_configs(experiment_configs, params, experiments)


def run_all(configs_: list, progress: bool = False) -> dict[str, Any]:
    """Run (or fetch from the cache) logit and FedAvg configs: {config key: RunResult}."""
    from ..logit_run import run_logit
    from ..run import run

    return {c.key(): (run_logit(c, progress=progress) if isinstance(c, LogitConfig) else run(c, progress=progress))
            for c in configs_}


# ----------------------------------------------------------------------------- reading runs


def accuracies(results: dict, configs_: list, metric: str = "accuracy") -> list[float]:
    """Final ``metric`` (in %) of the runs present, over seeds."""
    return [100.0 * results[c.key()].final[metric] for c in configs_
            if c.key() in results and results[c.key()].final.get(metric) is not None]


def row(params: dict[str, Any], results: dict, k: int, cifar10: bool = False, with_fedavg: bool = True,
        **overrides) -> dict[str, tuple[float, float]]:
    """{aggregator (and fedavg): (mean, std) of the final accuracy %} for one setting."""
    from ..book import mean_std

    out = {a: mean_std(accuracies(results, [logit_config(params, a, k, s, cifar10, **overrides)
                                            for s in params["seeds"]])) for a in params["aggregators"]}
    if with_fedavg:
        out["fedavg"] = mean_std(accuracies(results, [fedavg_config(logit_config(params, "simple", k, s, cifar10))
                                                      for s in params["seeds"]]))
    return out


def communication(result, fedavg_result=None) -> dict[str, float]:
    """Floats sent per round (mean over rounds) by the logit protocol and, for comparison,
    by FedAvg with the same clients (2 x clients x parameters: model down and up)."""
    up = float(np.mean([h["floats_up"] for h in result.history]))
    down = float(np.mean([h["floats_down"] for h in result.history]))
    fedavg = float(np.mean([h["fedavg_floats"] for h in result.history]))
    return {"up": up, "down": down, "total": up + down, "fedavg": fedavg, "ratio": fedavg / (up + down)}


def curve(result, key: str = "accuracy") -> tuple[list[int], list[float]]:
    rounds = [h["round"] + 1 for h in result.history if h.get(key) is not None]
    return rounds, [100.0 * h[key] for h in result.history if h.get(key) is not None]


# ----------------------------------------------------------------------------- stored runs


def store_results(configs_: list, progress: bool = True) -> list:
    """Run ``configs_`` (logit or FedAvg) and keep each result as ``results/logitfl/<key>.json``
    (the payload format of ``fedlib.book.store_results``; files that exist are not recomputed)."""
    from ..book import git_commit, results_dir
    from ..cache import ResultCache

    store = ResultCache(results_dir("logitfl"), protect=True)
    written = []
    for i, config in enumerate(configs_):
        if store.get(config.key()) is not None:
            continue
        if progress:
            name = getattr(config, "aggregator", None) or config.method.name
            print(f"[{i + 1}/{len(configs_)}] logitfl: {config.dataset} {name} seed {config.seed}", flush=True)
        result = run_all([config])[config.key()]
        written.append(store.put(config.key(), {
            "config": config.to_dict(), "result": result.to_dict(), "commit": git_commit(),
            "device": result.meta["device"], "date": result.meta["date"], "wall_time": result.meta["wall_time"]}))
    return written


def stored(params: dict[str, Any]) -> tuple[dict, dict]:
    """The current stored runs (``results/logitfl/``) of ``params``' configs: ({config key: RunResult},
    {config key: provenance}); stale ones (another variant) are left out (``fedlib.book.stored_results``)."""
    from ..book import stored_results

    found = stored_results("logitfl", configs(params))
    return found.results, found.provenance


# ----------------------------------------------------------------------------- the results queue


def queue_items(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.queue): the paper's
    headline is MNIST k = 2 (the only numbers it quotes); FedAvg baselines run on the round engine."""
    from ..logit_run import fedavg_config
    from ..queue import QueueItem, run_logit, run_round

    seeds, first, k0 = params["seeds"], params["seeds"][0], params["ks"][0]
    data = {"mnist": "MNIST", "fmnist": "F.MNIST"}.get(params["dataset"], params["dataset"])
    experiments = params["experiments"]
    items = []

    def logit(table, row, agg, k, seed, rank=0, cifar10=False, headline=False, **overrides):
        c = logit_config(params, agg, k, seed, cifar10, **overrides)
        backs = ((table, row, LABELS[agg]),) + ((("Headline", row, LABELS[agg]),) if headline else ())
        return QueueItem("logitfl", table, row, LABELS[agg], seed, c, run_logit, headline=headline, table_rank=rank,
                         first_seed=seed == first, backs=backs)

    def fedavg(table, row, k, seed, cifar10=False, headline=False):
        c = fedavg_config(logit_config(params, "simple", k, seed, cifar10))
        return QueueItem("logitfl", table, row, LABELS["fedavg"], seed, c, run_round, headline=headline,
                         first_seed=seed == first)

    if "k_sweep" in experiments:
        for k in params["ks"]:
            row = f"{data} k={k}"
            items += [logit("k sweep", row, a, k, s, headline=k == 2) for a in params["aggregators"] for s in seeds]
            items += [fedavg("k sweep", row, k, s, headline=k == 2) for s in seeds]
    if "cifar10" in experiments:
        for k in params["cifar10_ks"]:
            row = f"CIFAR-10 k={k}"
            items += [logit("CIFAR-10", row, a, k, s, cifar10=True, headline=k == 2) for a in params["aggregators"]
                      for s in seeds]
            items += [fedavg("CIFAR-10", row, k, s, cifar10=True, headline=k == 2) for s in seeds]
    if "public_size" in experiments:
        items += [logit("Ablation: public set", f"{data} k={k0} n={n}", a, k0, s, 1, public_size=n)
                  for n in params["public_sizes_ablation"] for a in params["aggregators"] for s in seeds]
    if "dropout" in experiments:
        items += [logit("Ablation: dropout", f"{data} k={k0} p={p}", a, k0, s, 1, dropout=p)
                  for p in params["dropouts"] for a in params["aggregators"] for s in seeds]
    if "uwa_tau" in experiments:
        items += [logit("Ablation: UWA τ", f"{data} k={k0} τ={t:g}", "uwa", k0, s, 1, uwa_tau=t)
                  for t in params["uwa_taus"] for s in seeds]
    return items
