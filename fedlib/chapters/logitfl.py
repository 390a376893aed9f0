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

from typing import Any

import numpy as np

from ..config import RunConfig, make_config
from ..methods import METHODS
from ..methods.logit import LogitFL
from . import unique_configs

# protocol choices added after the first protocol (absent from a profile: the first protocol)
PROTOCOL_FIELDS = ("public_logits", "distill_lr")
LABELS = {"simple": "Simple avg.", "uwa": "UWA", "meta": "Meta-model", "fedavg": "FedAvg"}
EXPERIMENTS = ("k_sweep", "cifar10", "public_size", "dropout", "uwa_tau")
# the protocol settings every aggregator takes, and those only one takes (the methods' own fields)
SHARED = tuple(LogitFL.hyperparameters())
METHOD_ONLY = {name.removeprefix("logit_"): tuple(f for f in cls.hyperparameters() if f not in SHARED)
               for name, cls in METHODS.items() if issubclass(cls, LogitFL)}
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
    data = dict(dataset=params["dataset"], model=params["model"], fraction=params["fraction"],
                public_size=params["public_size"], rounds=params["rounds"])
    if cifar10:
        data = dict(dataset="cifar10", model=params["cifar10_model"], fraction=params["cifar10_fraction"],
                    public_size=params["cifar10_public_size"], rounds=params["cifar10_rounds"])
    return protocol_config(aggregator, **{
        **data, "n_clients": params["n_clients"], "k": k, "seed": seed, "test_samples": params["test_samples"],
        "meta_labeled": params["meta_labeled"], "local_epochs": params["local_epochs"],
        "distill_epochs": params["distill_epochs"], "batch_size": params["batch_size"], "lr": params["lr"],
        "temperature": params["temperature"], "meta_steps": params["meta_steps"],
        **{f: params[f] for f in PROTOCOL_FIELDS if f in params}, **overrides})


def fedavg_config(logit: RunConfig) -> RunConfig:
    """FedAvg on the same data, split and local training as ``logit`` (the public set held out:
    ``server_val``), with the engine's default update clipping, as the chapter has always run it."""
    data = logit.to_dict()
    data.pop("update_clip")
    return make_config({**data, "method": {"name": "fedavg"}})


def experiment_configs(params: dict[str, Any], experiment: str) -> list[RunConfig]:
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


def configs(params: dict[str, Any], experiments=None) -> list[RunConfig]:
    """Every run of the chapter (or of ``experiments``), without duplicates."""
    return unique_configs(experiment_configs, params, experiments)


def run_all(configs_: list, progress: bool = False) -> dict[str, Any]:
    """Run (or fetch from the cache) the chapter's configs: {config key: RunResult}."""
    from ..run import run

    return {c.key(): run(c, progress=progress) for c in configs_}


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


def per_round(result, key: str) -> list:
    """One logit-protocol quantity per round (the method's diagnostics in the run's history)."""
    return [h["diagnostics"][key] for h in result.history]


def communication(result, fedavg_result=None) -> dict[str, float]:
    """Floats sent per round (mean over rounds) by the logit protocol and, for comparison,
    by FedAvg with the same clients (2 x clients x parameters: model down and up)."""
    up = float(np.mean(per_round(result, "floats_up")))
    down = float(np.mean(per_round(result, "floats_down")))
    fedavg = float(np.mean(per_round(result, "fedavg_floats")))
    return {"up": up, "down": down, "total": up + down, "fedavg": fedavg, "ratio": fedavg / (up + down)}


def curve(result, key: str = "accuracy") -> tuple[list[int], list[float]]:
    """Rounds and ``key`` (%) per round: a test metric, or a diagnostic such as ``public_accuracy``."""
    values = [(h["round"] + 1, h.get(key, (h.get("diagnostics") or {}).get(key))) for h in result.history]
    return [r for r, v in values if v is not None], [100.0 * v for _, v in values if v is not None]


# ----------------------------------------------------------------------------- stored runs


def stored(params: dict[str, Any]) -> tuple[dict, dict]:
    """The current stored runs (``results/runs/``) of ``params``' configs: ({config key: RunResult},
    {config key: provenance}); stale ones (another variant) are left out (``fedlib.book.stored_results``)."""
    from ..book import stored_results

    found = stored_results("logitfl", configs(params))
    return found.results, found.provenance


# ----------------------------------------------------------------------------- the results queue


def queue_items(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.queue): the paper's
    headline is MNIST k = 2 (the only numbers it quotes); FedAvg baselines run on the round engine."""
    from ..queue import QueueItem, run_round

    seeds, first, k0 = params["seeds"], params["seeds"][0], params["ks"][0]
    data = {"mnist": "MNIST", "fmnist": "F.MNIST"}.get(params["dataset"], params["dataset"])
    experiments = params["experiments"]
    items = []

    def logit(table, row, agg, k, seed, rank=0, cifar10=False, headline=False, **overrides):
        c = logit_config(params, agg, k, seed, cifar10, **overrides)
        backs = ((table, row, LABELS[agg]),) + ((("Headline", row, LABELS[agg]),) if headline else ())
        return QueueItem("logitfl", table, row, LABELS[agg], seed, c, run_round, headline=headline, table_rank=rank,
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


# ----------------------------------------------------------------------------- calibration

# The protocol choices the paper's summary leaves open, calibrated on SIMPLE AVERAGING ONLY
# (the baseline the summary asks a replicator to verify first: ~0.82 on MNIST, k = 2).
# The search space is fixed here, before any run:
SEARCH_SPACE: dict[str, list] = {
    "public_logits": ["after_local", "after_refine"],  # upload after private training / after refinement
    "local_epochs": [1, 2],  # epochs of private training per round
    "lr": [0.01, 0.05, 0.1],  # SGD step size (private training and refinement)
    "distill_epochs": [1, 3],  # epochs of refinement on the public set per round
    "temperature": [1.0, 2.0, 4.0],  # distillation temperature T
}
# Screening protocol (stages 1-2): the paper profile with the 4-layer MLP instead of LeNet-5 (which
# does not train in 5 rounds at this size: see the pilot points), 30 % of the MNIST training set, a
# 1,500-sample public set (private : public steps per epoch stay about 1 : 1, as at full size),
# 2,000 test images and 5 rounds; seed 0.
SCREEN = {"model": "mlp", "fraction": 0.3, "public_size": 1500, "test_samples": 2000, "rounds": 5}
SCREEN_SEED = 0
# the first protocol (stored runs before calibration: simple averaging 59.6 % at the paper protocol)
FIRST = {"public_logits": "after_local", "local_epochs": 2, "lr": 0.05, "distill_epochs": 1, "temperature": 2.0}
PAPER_SIMPLE = 81.88  # the paper's simple averaging, MNIST k = 2 (%)
STAGES = ("structure", "tuning", "confirm")
# Beyond the declared space, run after it (not part of STAGES, never used for the choice): the best
# screened point lies on the space's edge (most epochs, largest lr), so the screen is extended one
# step past that edge to see whether simple averaging keeps rising towards the paper's value.
EDGE = {"local_epochs": 5, "lr": 0.2}


def _point(choice: dict[str, Any]) -> dict[str, Any]:
    return {f: choice[f] for f in SEARCH_SPACE}


def calibration_config(params: dict[str, Any], choice: dict[str, Any], screen: bool = True,
                       seed: int = SCREEN_SEED) -> RunConfig:
    """Simple averaging, MNIST, k = ks[0], at ``choice`` (the SEARCH_SPACE fields); ``screen``:
    the reduced screening protocol, else the profile's own (paper) protocol."""
    p = {**params, **_point(choice), **({"test_samples": SCREEN["test_samples"]} if screen else {})}
    reduced = {k: v for k, v in SCREEN.items() if k != "test_samples"} if screen else {}
    return logit_config(p, "simple", params["ks"][0], seed, **reduced)


def _stage_points(stage: str, done: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    """The points of one stage given the records of the stages before it."""
    space = SEARCH_SPACE
    if stage == "structure":  # where the public logits come from x private epochs, at the first protocol's rest
        return [{**FIRST, "public_logits": a, "local_epochs": e}
                for a in space["public_logits"] for e in space["local_epochs"]]
    screened = sorted((r for r in done if r["stage"] in ("structure", "tuning")), key=lambda r: -r["accuracy"])
    if stage == "tuning":  # one factor at a time around the `top` best structures
        best = [r["choice"] for r in screened if r["stage"] == "structure"][:top]
        return [{**b, field: v} for b in best for field in ("lr", "temperature", "distill_epochs")
                for v in space[field] if v != b[field]]
    if stage == "confirm":  # the best `top` screened points at the paper protocol
        return [r["choice"] for r in screened[:top]]
    if stage == "edge":  # one step past the edge around the best screened point: each move, then both
        best = screened[0]["choice"]
        return [{**best, **{f: v}} for f, v in EDGE.items()] + [{**best, **EDGE}]
    raise ValueError(f"stage: must be one of {', '.join((*STAGES, 'edge'))} (got {stage!r})")


def calibration_path():
    from ..book import results_dir

    return results_dir().parent / "logitfl-calibration.json"  # not a run: beside the store of runs


def load_calibration(path=None) -> dict[str, Any]:
    """The stored calibration record ({"points": [], ...} when there is none)."""
    import json

    path = path or calibration_path()
    if not path.is_file():
        return {"points": []}
    return json.loads(path.read_text())


def calibrate(profile: str = "paper", stages=STAGES, top: int = 1, confirm_top: int = 3, shard: int = 0,
              shards: int = 1, path=None, progress: bool = True) -> dict[str, Any]:
    """Run the calibration search on simple averaging and record every point.

    Stage ``structure``: every public_logits x local_epochs with the rest as in the first protocol
    (lr 0.05, one distillation epoch, T = 2), on the screening protocol; ``tuning``: one factor at a
    time around the ``top`` best structures (each other lr, temperature and distillation epoch
    count), screening protocol; ``confirm``: the ``confirm_top`` best screened points at the
    profile's own protocol.
    Each point (config, accuracy, accuracy per round, wall and CPU time) is written to
    ``results/logitfl-calibration.json`` (atomically, after every run; points already recorded are
    not rerun). ``shard``/``shards`` split a stage's points between processes (run the next stage
    after all shards of the one before finished). Returns the record.
    """
    import datetime as dt
    import fcntl
    import hashlib
    import json
    import tempfile
    from pathlib import Path
    import platform
    import time

    import torch

    from ..book import git_commit, load_profile
    from ..cache import atomic_write_text
    from ..run import run

    params = load_profile("logitfl", profile)
    path = path or calibration_path()
    record = load_calibration(path)
    points = record["points"]
    for stage in stages:
        todo = _stage_points(stage, points, confirm_top if stage == "confirm" else top)
        for i, choice in enumerate(todo):
            config = calibration_config(params, choice, screen=stage != "confirm")
            if i % shards != shard or any(r["key"] == config.key() for r in points):
                continue
            if progress:
                print(f"[calibrate {stage} {i + 1}/{len(todo)}] {choice}", flush=True)
            wall, cpu = time.perf_counter(), time.process_time()
            result = run(config)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            lock = Path(tempfile.gettempdir()) / f"fedlib-calibration-{hashlib.sha256(str(path).encode()).hexdigest()[:12]}.lock"
            with open(lock, "w") as held:  # shards append one at a time
                fcntl.flock(held, fcntl.LOCK_EX)
                points = load_calibration(path)["points"]  # another shard may have written meanwhile
                points.append({
                    "stage": stage, "choice": _point(choice), "key": config.key(), "config": config.to_dict(),
                    "protocol": "screen" if stage != "confirm" else profile,
                    "accuracy": result.final["accuracy"], "round_accuracy": [h["accuracy"] for h in result.history],
                    "mean_client_accuracy": result.final["mean_client_accuracy"],
                    "wall_time": result.meta["wall_time"] if cpu > 1.0 else None, "cpu_time": cpu if cpu > 1.0 else None,
                    "commit": git_commit(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "device": result.meta["device"], "threads": torch.get_num_threads(), "python": platform.python_version(),
                })
                record = {**load_calibration(path), "profile": profile, "search_space": SEARCH_SPACE,
                          "screen": SCREEN, "seed": SCREEN_SEED, "first_protocol": FIRST, "top": top, "confirm_top": confirm_top, "aggregator": "simple", "points": points}
                atomic_write_text(path, json.dumps(record, indent=1))
            if progress:
                print(f"    accuracy {100 * result.final['accuracy']:.2f} %, {wall:.0f} s wall, {cpu:.0f} s CPU",
                      flush=True)
    return load_calibration(path)


def calibration_table(record: dict[str, Any]):
    """Every recorded point as a DataFrame, in the order it was run."""
    import pandas as pd

    rows = [{"#": i + 1, "stage": r["stage"], "protocol": r["protocol"], "model": r["config"]["model"], **r["choice"],
             "accuracy (%)": round(100 * r["accuracy"], 2),
             "clients (%)": round(100 * r["mean_client_accuracy"], 2),
             "wall (s)": None if r["wall_time"] is None else round(r["wall_time"]),
             "CPU (s)": None if r["cpu_time"] is None else round(r["cpu_time"])}
            for i, r in enumerate(record["points"])]
    return pd.DataFrame(rows).set_index("#").fillna("—")  # no time recorded (a stored run reused)


def calibrated_choice(record: dict[str, Any]) -> dict[str, Any] | None:
    """The best point at the paper protocol, else the best screened point (None: no points)."""
    confirmed = [r for r in record["points"] if r["stage"] == "confirm"]
    pool = confirmed or record["points"]
    return max(pool, key=lambda r: r["accuracy"])["choice"] if pool else None


if __name__ == "__main__":  # python -m fedlib.chapters.logitfl [stage ...] [--shard i/n]
    import sys

    args = sys.argv[1:]
    shard, shards = 0, 1
    if "--shard" in args:
        at = args.index("--shard")
        shard, shards = (int(v) for v in args[at + 1].split("/"))
        del args[at:at + 2]
    calibrate(stages=tuple(args) or STAGES, shard=shard, shards=shards)
