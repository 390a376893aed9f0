"""The logit-based FL chapter ("Who to trust?", arXiv 2509.15147).

Experiments, each a list of configs sharing one protocol (``params/logitfl/<profile>.yaml``):
  k_sweep      MNIST, k ∈ ks classes per client: simple / UWA / meta-model, plus FedAvg
  cifar10      the same on CIFAR-10 (the data root's copy) for cifar10_ks
  public_size  the public-set ablation (public_size -> each of public_sizes_ablation), k = ks[0]
  dropout      client dropout (each client misses a round with probability p), k = ks[0]
  uwa_tau      UWA with a softer softmax over clients (our variant, τ > 1), k = ks[0]

Every run is a ``RunConfig`` run by ``fedlib.run``: the logit runs use the methods
``logit_simple``, ``logit_uwa`` and ``logit_meta`` (``fedlib.methods.logit``; the public set is the
server's held-out set, ``server_val``); the FedAvg baselines run on the same split with the same
public set held out (``fedavg_config``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ....config import RunConfig, make_config
from ....methods import METHODS
from ....methods.logit import LogitFL as LogitMethod
from ...kit import frames
from ...kit.claim_types import Claim, cells_row
from ...kit.stored import stored_results
from .. import configs_of
from ..base import dataset_label, queue_item
from ..profiles import Ints, Names, Profile, Seeds

# protocol choices added after the first protocol (absent from a profile: the first protocol)
PROTOCOL_FIELDS = ("public_logits", "distill_lr")
LABELS = {"simple": "Simple avg.", "uwa": "UWA", "meta": "Meta-model", "fedavg": "FedAvg"}
EXPERIMENTS = ("k_sweep", "cifar10", "public_size", "dropout", "uwa_tau")
# ablation at k = ks[0] (its protocol setting) -> (the profile's values, aggregators (None: all), queue table, row)
ABLATIONS = {"public_size": ("public_sizes_ablation", None, "Ablation: public set", "n={}"),
             "dropout": ("dropouts", None, "Ablation: dropout", "p={}"),
             "uwa_tau": ("uwa_taus", ("uwa",), "Ablation: UWA τ", "τ={:g}")}
# the protocol settings every aggregator takes, and those only one takes (the methods' own fields)
SHARED = tuple(LogitMethod.hyperparameters())
METHOD_ONLY = {name.removeprefix("logit_"): tuple(f for f in cls.hyperparameters() if f not in SHARED)
               for name, cls in METHODS.items() if issubclass(cls, LogitMethod)}
# the protocol's federation in its own terms, with the defaults of our reading of the paper
PROTOCOL_DEFAULTS = dict(dataset="mnist", data_root=None, fraction=1.0, test_samples=None, model="lenet5",
                         n_clients=10, k=2, public_size=5000, rounds=10, local_epochs=1, batch_size=64, lr=0.05,
                         momentum=0.0, seed=0, device="cpu", client_chunk=None)


def protocol_config(aggregator: str, **fields) -> RunConfig:
    """A logit-protocol run from the protocol's own terms (``k`` classes per client, a
    ``public_size`` public set, the aggregator's settings; ``PROTOCOL_DEFAULTS`` for the rest) as
    the engine config: a ``k_classes`` split, ``server_val`` = the public set, method
    ``logit_<aggregator>``, no update clipping (no shared model). Settings of another aggregator
    (e.g. ``meta_labeled`` for UWA) are ignored; unknown names raise."""
    every = set(PROTOCOL_DEFAULTS) | set(SHARED) | {f for names in METHOD_ONLY.values() for f in names}
    unknown = sorted(set(fields) - every)
    if unknown:
        raise ValueError(f"logit protocol: unknown setting {unknown[0]!r}; known: {', '.join(sorted(every))}")
    f = {**PROTOCOL_DEFAULTS, **{k: v for k, v in fields.items() if k in PROTOCOL_DEFAULTS}}
    method = {k: v for k, v in fields.items() if k in SHARED + METHOD_ONLY.get(aggregator, ())}
    if aggregator == "meta":
        method["meta_labeled"] = min(method.get("meta_labeled", 1000), f["public_size"])
    k, public = f.pop("k"), f.pop("public_size")
    return make_config(**f, split={"name": "k_classes", "k": k}, server_val=public, update_clip=None,
                       method={"name": f"logit_{aggregator}", **method})


def logit_config(params: dict[str, Any], aggregator: str, k: int, seed: int, cifar10: bool = False,
                 **overrides) -> RunConfig:
    """One logit run of the chapter's protocol (``cifar10``: the CIFAR-10 variant); ``overrides``:
    ``public_size`` or any protocol setting (``dropout``, ``uwa_tau``, ...)."""
    data = {f: params[f"cifar10_{f}" if cifar10 else f] for f in ("model", "fraction", "public_size", "rounds")}
    data["dataset"] = "cifar10" if cifar10 else params["dataset"]
    return protocol_config(aggregator, **{
        **data, "n_clients": params["n_clients"], "k": k, "seed": seed, "test_samples": params["test_samples"],
        "meta_labeled": params["meta_labeled"], "local_epochs": params["local_epochs"],
        "distill_epochs": params["distill_epochs"], "batch_size": params["batch_size"], "lr": params["lr"],
        "temperature": params["temperature"], "meta_steps": params["meta_steps"],
        **{f: params[f] for f in PROTOCOL_FIELDS if f in params}, **overrides})


def fedavg_config(logit: RunConfig) -> RunConfig:
    """FedAvg on the same data, split and local training as ``logit`` (the public set held out:
    ``server_val``), with the engine's default update clipping, as the chapter has always run it."""
    return make_config({**{f: v for f, v in logit.to_dict().items() if f != "update_clip"},
                        "method": {"name": "fedavg"}})


def experiment_configs(params: dict[str, Any], experiment: str) -> list[RunConfig]:
    """The runs of one experiment: logit configs, then the FedAvg baselines where it has them."""
    seeds, aggregators, k0 = params["seeds"], params["aggregators"], params["ks"][0]
    if experiment in ("k_sweep", "cifar10"):
        cifar10 = experiment == "cifar10"
        ks = params["cifar10_ks" if cifar10 else "ks"]
        runs = [logit_config(params, a, k, s, cifar10) for k in ks for a in aggregators for s in seeds]
        runs += [logit_config(params, "simple", k0, s) for s in ([] if cifar10 else extra_seeds(params))]
        return runs + [fedavg_config(logit_config(params, "simple", k, s, cifar10)) for k in ks for s in seeds]
    if experiment in ABLATIONS:
        values, only, _, _ = ABLATIONS[experiment]
        return [logit_config(params, a, k0, s, **{experiment: v}) for v in params[values] for a in only or aggregators
                for s in seeds]
    raise ValueError(f"experiments: unknown experiment {experiment!r}; known: {', '.join(EXPERIMENTS)}")




# ----------------------------------------------------------------------------- reading runs


def extra_seeds(params: dict[str, Any]) -> list[int]:
    """Seeds beyond the profile's for simple averaging at the first k (``simple_extra_seeds``; issue 30:
    its accuracy spreads widely over seeds, so its cell gets more of them)."""
    return [s for s in params.get("simple_extra_seeds", []) if s not in params["seeds"]]


def row_configs(params: dict[str, Any], k: int, cifar10: bool = False, with_fedavg: bool = True,
                **overrides) -> dict[str, list[RunConfig]]:
    """{aggregator (and fedavg): its configs over the seeds} for one setting (simple averaging at the first
    k of the sweep also over :func:`extra_seeds`)."""
    seeds = params["seeds"]
    out = {a: [logit_config(params, a, k, s, cifar10, **overrides) for s in seeds] for a in params["aggregators"]}
    if "simple" in out and k == params["ks"][0] and not cifar10 and not overrides:
        out["simple"] += [logit_config(params, "simple", k, s) for s in extra_seeds(params)]
    if with_fedavg:
        out["fedavg"] = [fedavg_config(logit_config(params, "simple", k, s, cifar10)) for s in seeds]
    return out


def row(params: dict[str, Any], results: dict, k: int, cifar10: bool = False, with_fedavg: bool = True,
        **overrides) -> dict[str, tuple[float, float]]:
    """{aggregator (and fedavg): (mean, std) of the final accuracy %} for one setting."""
    return frames.seed_mean_std(results, row_configs(params, k, cifar10, with_fedavg, **overrides))


def communication(result) -> dict[str, float]:
    """Floats sent per round (mean over rounds) by the logit protocol and, for comparison,
    by FedAvg with the same clients (2 x clients x parameters: model down and up)."""
    up, down, fedavg = (float(np.mean([h["diagnostics"][key] for h in result.history]))
                        for key in ("floats_up", "floats_down", "fedavg_floats"))
    return {"up": up, "down": down, "total": up + down, "fedavg": fedavg, "ratio": fedavg / (up + down)}


# ----------------------------------------------------------------------------- stored runs


def stored(params: dict[str, Any]) -> tuple[dict, dict]:
    """The current stored runs of ``params``' configs, stale ones left out: ({key: RunResult}, {key: provenance})."""
    found = stored_results("logitfl", configs(params))
    return found.results, found.provenance


# ----------------------------------------------------------------------------- the results queue


def runs(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.app.queue): the paper's
    headline is MNIST k = 2 (the only numbers it quotes); FedAvg baselines run on the round engine."""
    item = partial(queue_item, "logitfl", params)
    seeds, k0, data = params["seeds"], params["ks"][0], dataset_label(params["dataset"])
    experiments, items = params["experiments"], []

    def logit(table, row, agg, k, seed, rank=0, cifar10=False, headline=False, **overrides):
        backs = ((table, row, LABELS[agg]),) + ((("Headline", row, LABELS[agg]),) if headline else ())
        return item(table, row, LABELS[agg], logit_config(params, agg, k, seed, cifar10, **overrides),
                    headline=headline, table_rank=rank, backs=backs)

    sweeps = (("k_sweep", "k sweep", data, params["ks"]), ("cifar10", "CIFAR-10", "CIFAR-10", params["cifar10_ks"]))
    for experiment, table, name, ks in (sweep for sweep in sweeps if sweep[0] in experiments):
        cifar10 = experiment == "cifar10"
        for k in ks:
            items += [logit(table, f"{name} k={k}", a, k, s, cifar10=cifar10, headline=k == 2)
                      for a in params["aggregators"] for s in seeds]
            if not cifar10 and k == k0:
                items += [logit(table, f"{name} k={k}", "simple", k, s, headline=True) for s in extra_seeds(params)]
            fedavg = (fedavg_config(logit_config(params, "simple", k, s, cifar10)) for s in seeds)
            items += [item(table, f"{name} k={k}", LABELS["fedavg"], c, headline=k == 2) for c in fedavg]
    for experiment, (values, only, table, row) in ABLATIONS.items():
        items += [logit(table, f"{data} k={k0} {row.format(v)}", a, k0, s, 1, **{experiment: v})
                  for v in (params[values] if experiment in experiments else []) for a in only or params["aggregators"]
                  for s in seeds]
    return items


# ----------------------------------------------------------------------------- the declaration


class LogitFLProfile(Profile):
    dataset: str
    model: str
    n_clients: int
    ks: Ints  # classes per client; the first is the headline k
    fraction: float
    test_samples: int | None  # null: the whole test set
    public_size: int
    public_sizes_ablation: list[int]
    meta_labeled: int
    rounds: int
    local_epochs: int
    distill_epochs: int
    batch_size: int
    lr: float
    temperature: float
    public_logits: str
    distill_lr: float | None  # null: the local lr
    meta_steps: int
    simple_extra_seeds: list[int]  # more seeds for simple averaging at the first k
    seeds: Seeds
    aggregators: Names
    experiments: Names
    dropouts: list[float]
    uwa_taus: list[float]
    cifar10_model: str
    cifar10_fraction: float
    cifar10_public_size: int
    cifar10_rounds: int
    cifar10_ks: list[int]
    threads: int | None  # torch CPU threads; null: torch's default


CLAIMS = (
    Claim("UWA beats simple averaging at k = 2 (MNIST)", "Headline", "the-headline-mnist-two-classes-per-client",
          cells_row(["MNIST k=2"], "UWA", "Simple avg.", "k sweep", ref="Headline")),
    Claim("The meta-model beats UWA at k = 2 (MNIST)", "Headline", "the-headline-mnist-two-classes-per-client",
          cells_row(["MNIST k=2"], "Meta-model", "UWA", "k sweep", ref="Headline")),
    Claim("UWA beats simple averaging at every k (2, 5, 8)", "k sweep",
          "accuracy-versus-heterogeneity-k-classes-per-client",
          cells_row([f"MNIST k={k}" for k in (2, 5, 8)], "UWA", "Simple avg.", "k sweep", ref="Headline")),
)


configs = partial(configs_of, runs)  # every run once, in the order of the first cell naming it
