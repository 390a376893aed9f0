"""FedSCM's end-to-end pipeline (Algorithm 2) and its baselines, as one cached experiment.

One :class:`ScmConfig` is one federation: K clients are drawn from the training set (label
and quantity shift: per-class Dirichlet(α) proportions over K + 1 clients; covariate shift:
an IID split with a per-client affine map x -> (I + Λ_k) x + δ_k, σ = 0.05), the server's
target is drawn like the (K + 1)-th client, and then

1. all K client models are trained locally at once (``training.train_clients``, vmapped,
   in chunks of ``client_chunk`` clients);
2. their predictions on the server's n unlabeled target samples come from one batched pass
   (``population.predict``) -> ``probs [K, n, C]``                       (Alg. 2, step 1);
3. FedSCM picks the clients (``methods.scm``, PGD or SLSQP)             (Alg. 2, step 2);
4. the global model starts as ``Σ_k λ_k h_k`` over the selected clients (``population.aggregate``)
                                                                         (Alg. 2, step 3);
5. FedProx trains it with the selected clients only, aggregating with λ (Alg. 2, steps 4–5): an
   ordinary engine run (method ``cohort``, ``post_training_config``) started from that model.

Baselines on the same client models: Random (m clients, uniform weights), Best Source (the
single client with the best accuracy on the labelled target set: an oracle, no training),
Source-Free one-shot (FedSCM's initial model, no post-training), FedAvg (all K clients,
size weights, started from their size-weighted average, μ = 0), SDEA-style selection
(the m clients with the lowest mean prediction entropy, then the same FedProx training), and
the domain-adaptation baselines of ``fedlib.methods.fda``: K3DA (consensus-focus weights over
all sources plus a target client trained on knowledge-vote labels, the same rounds), Co-MDA
(our reading: a black-box target model trained on consensus labels of the kept sources) and
FMDA-OT (sources moved to the target by entropic OT, FedAvg with pseudo-label-accuracy
weights, server fine-tuning on a pseudo-labelled fifth of the server set).

Every federation also records issue 22's diagnosis (``diagnose``): bug checks, the trained
clients' departure from the expertise model next to a Def. 4 simulation with the same η̂,
and the selection at the prediction ``temperatures``.

The target is drawn like a (K + 1)-th client: under label shift, its class proportions are
those the Dirichlet split gave the (K + 1)-th client; its n unlabeled samples and a
disjoint labelled evaluation set are drawn with those proportions from the two halves of
the test set (with replacement only when a half has too few samples of a class). Under
covariate shift the (K + 1)-th client's affine map is applied to the test images.

The record (``fedlib.results.RunResult``, as every runner returns): ``config``; ``history`` empty (a
one-shot experiment: the post-trainings' rounds stay inside the methods' rows); ``final``, the headline
method's scores on the labelled target set: the first FedSCM row, i.e. FedSCM at the config's first γ
(``fedlib.results.pipeline_final``, which names it in ``final["method"]``); ``meta`` (environment,
timings and the key's provenance); and its sections in ``parts``: ``methods`` (one row per method label,
:func:`method_labels`), ``selections`` (per γ), ``clients``, ``target_proportions``, ``diagnosis`` and
``stability`` (when ``stability_runs``). As JSON (``to_dict``) the sections sit at the top level, as
FedSCM results were always stored. ``run_pipeline(config)`` (and ``fedlib.run(config)``) returns it
and caches it by the config's hash; :func:`execute` and :func:`execute_many` return its JSON, uncached
and without the key's provenance.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch

from . import partition as partition_module
from .allocation import Partition
from .cache import ResultCache, as_store
from .config import ScmConfig, make_config
from .data import load_dataset
from .engine import TrainRequest
from .engine import execute as engine_run
from .events import report
from .federation import given, resolve_device
from .methods import fda, scm
from .models import build_model
from .packing import (
    _merges,
    execute_packed,
    make_packs,
    rows_per_pack,
    train_signature,
    train_together,
)
from .population import (
    ClientBatches,
    LocalTraining,
    ParamLayout,
    aggregate,
    evaluate,
    make_client_batches,
    predict,
)
from .results import RunResult, _key_provenance, environment, is_pipeline_result, pipeline_final
from .splits import covariate_shift
from .store import run_of, stored_payload
from .training import train_clients

LABELS = {"best_source": "Best Source", "source_free": "Source Free", "fedavg": "FedAvg", "sdea": "SDEA",
          "k3da": "K3DA", "comda": "Co-MDA", "fmda_ot": "FMDA-OT"}


def method_labels(config: ScmConfig) -> list[str]:
    """The result rows a config produces, in table order."""
    out = []
    for m in config.methods:
        if m == "fedscm":
            out += [f"FedSCM (γ = {g:g})" for g in config.gammas]
        elif m == "random":
            out += [f"Random (K = {r})" for r in config.random_sizes]
        else:
            out.append(LABELS[m])
    return out


# ----------------------------------------------------------------------------- federation


def _target_draw(y_test: np.ndarray, proportions: np.ndarray, n_server: int, n_eval: int, rng):
    """Indices into the test set: the server's unlabeled set from one half, the labelled
    evaluation set from the other, both with the target's class proportions."""
    order = rng.permutation(len(y_test))
    halves = order[: len(order) // 2], order[len(order) // 2:]
    out = []
    for half, count in zip(halves, (n_server, n_eval)):
        per_class = rng.multinomial(count, proportions)
        picks = []
        for c in np.flatnonzero(per_class):  # a loop over classes of the target draw, once per run
            pool = half[y_test[half] == c]
            picks.append(rng.choice(pool, per_class[c], replace=per_class[c] > len(pool)))
        out.append(rng.permutation(np.concatenate(picks)))
    return out


def build_federation(config: ScmConfig, dataset) -> dict[str, Any]:
    """Clients' index lists and pool, the server's unlabeled set and the labelled target set."""
    rng = np.random.default_rng(config.seed + 1234567)
    n_train = len(dataset.y_train)
    keep = np.sort(rng.permutation(n_train)[: max(config.n_clients + 1, round(config.fraction * n_train))])
    x, y = dataset.x_train[keep], dataset.y_train[keep]
    labels = y.numpy()
    k, c = config.n_clients, dataset.num_classes
    x_test, y_test = dataset.x_test, dataset.y_test
    if config.shift == "label":
        part = partition_module.dirichlet(labels, k + 1, config.alpha, config.seed, min_size=config.min_size,
                                          n_classes=c)
        target_counts = part.counts[k]
        proportions = target_counts / target_counts.sum()
        indices, counts = part.indices[:k], part.counts[:k]
    else:  # covariate: IID labels, the (K+1)-th client's affine map applied to the test images
        part = partition_module.iid(labels, k, config.seed, n_classes=c)
        proportions = np.bincount(y_test.numpy(), minlength=c) / len(y_test)
        indices, counts = part.indices, part.counts
        pool_x = torch.cat([x, x_test])
        pool_y = torch.cat([y, y_test])
        target_rows = len(y) + np.arange(len(y_test))  # the (K+1)-th client: the test images
        joint = Partition(list(indices) + [target_rows],
                                           np.vstack([counts, np.bincount(y_test.numpy(), minlength=c)]),
                                           ["benign"] * (k + 1))
        shifted = covariate_shift(pool_x, pool_y, joint, sigma=config.sigma, seed=config.seed)
        x, x_test = shifted.x[: len(y)], shifted.x[len(y):]
    server_idx, eval_idx = _target_draw(y_test.numpy(), proportions, config.server_samples, config.eval_samples, rng)
    return {
        "x": x, "y": y, "indices": indices, "counts": np.asarray(counts), "sizes": np.asarray(counts).sum(1),
        "target_proportions": proportions,
        "x_server": x_test[server_idx], "y_server": y_test[server_idx],  # labels: evaluation only
        "x_eval": x_test[eval_idx], "y_eval": y_test[eval_idx],
        "server_eval_overlap": int(len(np.intersect1d(server_idx, eval_idx))),  # drawn from disjoint halves
    }


def _generator(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + salt * 7_919 + 17) % (2**63))


def local_training_request(model, fed: dict, config: ScmConfig, device) -> TrainRequest:
    """All K clients' local training from the same initial model, as a request: answered alone
    (``request.answer()``: vmapped, chunked) or with other federations' (:func:`execute_many`)."""
    layout = ParamLayout(model)
    batches = make_client_batches(fed["indices"], config.batch_size, config.local_epochs, _generator(config.seed, 0))
    cfg = LocalTraining(epochs=config.local_epochs, batch_size=config.batch_size, lr=config.lr,
                        momentum=config.momentum, weight_decay=config.weight_decay, chunk_size=config.client_chunk)
    bufs = {k: v.unsqueeze(0).to(device) for k, v in layout.buffers_of(model).items()}
    batches.index, batches.mask = batches.index.to(device), batches.mask.to(device)
    return TrainRequest(model, layout.flat_of(model).to(device), bufs, fed["x"].to(device), fed["y"].to(device),
                        batches, cfg)


def train_local_models(model, fed: dict, config: ScmConfig, device) -> tuple[torch.Tensor, dict]:
    """All K clients' local training at once from the same initial model (vmapped, chunked)."""
    return local_training_request(model, fed, config, device).answer()


def client_probabilities(model, flat, buffers, x, model_chunk=None, batch_size=1024) -> torch.Tensor:
    """h_k(X) for all K models and n samples, ``[K, n, C]``: one batched pass (chunked)."""
    return torch.softmax(predict(model, flat, buffers, x, batch_size=batch_size, model_chunk=model_chunk).float(), -1)


def post_training_config(config: ScmConfig, weights: np.ndarray | None, prox_mu: float,
                         per_round: int | None = None):
    """Algorithm 2, steps 4-5 as an ordinary run's config: the cohort's clients (one per weight)
    run FedProx (μ) from the global model each round, all of them or ``per_round`` drawn at random
    (FedAvg's partial participation), and the server aggregates with λ (``weights``; None: the
    clients' sample counts). No update clipping: the cohort is trusted, as in the paper."""
    n = len(weights)
    return make_config({
        "dataset": config.dataset, "data_root": config.data_root, "model": config.model, "n_clients": n,
        "clients_per_round": per_round if per_round and per_round < n else None,
        "rounds": config.post_rounds, "local_epochs": config.post_epochs, "batch_size": config.batch_size,
        "lr": config.post_lr, "momentum": 0.0, "weight_decay": config.weight_decay, "seed": config.seed,
        "device": config.device, "eval_every": config.post_rounds, "update_clip": None,
        "client_chunk": config.client_chunk,
        "method": {"name": "cohort", "weights": [float(w) for w in weights], "mu": prox_mu,
                   "max_steps": config.post_steps},
    }, source="fedscm post-training")


def post_train(model, dataset, flat, buffers, clients: np.ndarray, weights: np.ndarray, fed: dict,
               config: ScmConfig, prox_mu: float, per_round: int | None = None,
               init: tuple[torch.Tensor, dict] | None = None) -> tuple[torch.Tensor, dict]:
    """Algorithm 2, steps 3-5: the global model starts as Σ_k λ_k h_k of ``clients`` (or ``init``),
    then the engine trains it with that cohort (:func:`post_training_config`); returns the final
    global model (flat, buffers)."""
    prepared = post_training(model, dataset, flat, buffers, clients, weights, fed, config, prox_mu, per_round, init)
    return engine_run(prepared, progress=False).model  # steps 4-5: the rounds


def post_training(model, dataset, flat, buffers, clients: np.ndarray, weights: np.ndarray, fed: dict,
                  config: ScmConfig, prox_mu: float, per_round: int | None = None,
                  init: tuple[torch.Tensor, dict] | None = None):
    """:func:`post_train`'s federation, ready for the engine (alone, or packed with the other plans')."""
    if init is None:
        sel = torch.as_tensor(clients, device=flat.device)
        w = torch.as_tensor(weights / weights.sum(), dtype=flat.dtype, device=flat.device)
        init = aggregate(flat[sel], w, {k: v[sel] for k, v in buffers.items()})  # step 3
    run_config = post_training_config(config, weights, prox_mu, per_round)
    return given(run_config, dataset, model, fed["x"], fed["y"], [fed["indices"][c] for c in clients],
                 fed["x_eval"], fed["y_eval"], init=init, keep_model=True)


def with_server_client(fed: dict, x_extra: torch.Tensor, y_extra: torch.Tensor) -> dict:
    """The federation plus one more "client" (index K) holding the server's pseudo-labelled samples."""
    start = len(fed["y"])
    return {**fed, "x": torch.cat([fed["x"], x_extra.to(fed["x"].dtype)]),
            "y": torch.cat([fed["y"], y_extra.to(fed["y"].dtype)]),
            "indices": list(fed["indices"]) + [start + np.arange(len(y_extra))]}


def server_train(model, flat, bufs, x, y, config: ScmConfig, device, steps: int, salt: int,
                 ) -> tuple[torch.Tensor, dict]:
    """``steps`` SGD steps of one model on the server's pseudo-labelled samples (x, y)."""
    if steps == 0 or len(y) == 0:
        return flat, bufs
    epochs = max(1, -(-steps * config.batch_size // len(y)))
    batches = make_client_batches([np.arange(len(y))], config.batch_size, epochs, _generator(config.seed, 50_000 + salt))
    batches = ClientBatches(batches.index[:steps].to(device), batches.mask[:steps].to(device))
    cfg = LocalTraining(epochs=epochs, batch_size=config.batch_size, lr=config.post_lr, momentum=0.0,
                        weight_decay=config.weight_decay)
    out, out_bufs = train_clients(model, flat, {k: v.unsqueeze(0) for k, v in bufs.items()}, x.to(device),
                                  y.to(device), batches, cfg)
    return out[0], {k: v[0] for k, v in out_bufs.items()}


def _fmda_transport(fed: dict, config: ScmConfig, c: int, chunk: int = 32) -> dict[str, Any]:
    """FMDA-OT phase 1 on at most ``ot_samples`` samples per client: entropic OT plans to the
    server's unlabeled samples (fda.sinkhorn_batch: all clients of a chunk in one batched solve), the
    transported samples (barycentric map) and the class mass each server sample receives."""
    rng = np.random.default_rng(config.seed + 777)
    m = config.ot_samples
    k = len(fed["indices"])
    idx = np.zeros((k, m), dtype=np.int64)
    mass = np.zeros((k, m))
    for i, own in enumerate(fed["indices"]):  # index bookkeeping per client (no model work)
        take = rng.choice(own, min(m, len(own)), replace=False) if len(own) else np.zeros(0, dtype=np.int64)
        idx[i, :len(take)] = take
        mass[i, :len(take)] = 1.0 / max(len(take), 1)
    x_t = fed["x_server"].reshape(len(fed["x_server"]), -1).double()
    x_s = fed["x"].reshape(len(fed["x"]), -1)
    moved, received = [], torch.zeros(len(x_t), c, dtype=torch.float64)
    for s in range(0, k, chunk):  # chunks of clients (memory); each chunk is one batched solve
        ii, mm = torch.as_tensor(idx[s:s + chunk]), torch.as_tensor(mass[s:s + chunk])
        plans = fda.transport_plans(x_s[ii], mm, x_t, config.ot_reg)
        moved.append(fda.barycentric_map(plans, mm, x_t))
        onehot = torch.nn.functional.one_hot(fed["y"][ii].long(), c).double() * (mm > 0).unsqueeze(-1)
        received += torch.einsum("kmn,kmc->nc", plans, onehot)
    return {"index": idx, "mass": mass, "moved": torch.cat(moved).to(fed["x"].dtype), "received": received}


def _accuracy(model, flat, bufs, x, y, c) -> tuple[float, float]:
    ev = evaluate(model, flat.unsqueeze(0), {k: v.unsqueeze(0) for k, v in bufs.items()}, x, y, c)
    return float(ev.accuracy[0]), float(ev.balanced_accuracy[0])


def select(probs: torch.Tensor, gamma: float, config: ScmConfig, **kwargs) -> scm.Selection:
    """FedSCM's selection with the config's solver, PGD step and rounding (Alg. 2, step 2)."""
    extra = {"projection": config.projection} if config.solver == "pgd" else {}
    return scm.select(probs, gamma, config.solver, rounding=config.rounding, **extra, **kwargs)


def diagnose(probs: torch.Tensor, y_server: torch.Tensor, fed: dict, selections: dict, eta_hat, config: ScmConfig,
             c: int) -> dict[str, Any]:
    """Issue 22's evidence on one federation: (a) bug checks, (b) how the trained clients depart
    from Def. 4 next to a Def. 4 simulation with the same η̂, (c) selection at other
    temperatures. Uses the server set's hidden labels (evaluation only)."""
    acc = (probs.argmax(-1) == y_server.view(1, -1)).double().mean(1)
    st = scm.prediction_structure(probs)
    majority = torch.as_tensor(fed["counts"].argmax(1))
    has_data = torch.as_tensor(fed["counts"].sum(1) > 0)
    server_freq = np.bincount(y_server.numpy(), minlength=c) / len(y_server)
    eval_freq = np.bincount(fed["y_eval"].numpy(), minlength=c) / len(fed["y_eval"])
    target = np.asarray(fed["target_proportions"])
    gamma = config.gammas[0]
    sel = selections[gamma].selected
    m = max(len(sel), 1)
    top = torch.argsort(acc, descending=True)[:m]
    top_vertex = torch.zeros(probs.shape[0], dtype=torch.float64)
    top_vertex[top] = 1.0 / m
    chosen_w = selections[gamma].weights / selections[gamma].weights.sum()
    checks = {  # (a)
        "max |Σ_c h_k(X) − 1|": float((probs.sum(-1) - 1).abs().max()),
        "min h_k(X)": float(probs.min()),
        "clients whose modal prediction is their majority training class": float(
            (st["modal_class"] == majority)[has_data].double().mean()),
        "TV(server labels, target proportions)": float(0.5 * np.abs(server_freq - target).sum()),
        "TV(eval labels, target proportions)": float(0.5 * np.abs(eval_freq - target).sum()),
        "server/eval overlap (samples)": fed["server_eval_overlap"],
        "objective at the selection": float(scm.objective(chosen_w, probs)),
        "objective at the most accurate clients": float(scm.objective(top_vertex, probs)),
    }
    eta = torch.as_tensor(eta_hat, dtype=torch.float64) if eta_hat is not None else None
    out: dict[str, Any] = {"checks": checks, "gamma": gamma, "selected": sel.tolist(),
                           "modal_class": st["modal_class"].tolist(), "mode_share": st["mode_share"].tolist(),
                           "target_majority_class": int(np.argmax(target))}
    if eta is not None:  # (b)
        non_experts = np.flatnonzero(eta.numpy() < 0.5)
        sim = scm.simulate_expertise(probs.shape[0], probs.shape[1], c, eta.clamp(0, 1), noise_alpha=1.0,
                                     seed=config.seed)
        sim_st = scm.prediction_structure(sim.probs)
        out["expertise"] = {
            "max η̂": float(eta.max()), "clients with η̂ ≥ 0.5": int((eta >= 0.5).sum()),
            "mean η̂ of the selected": float(eta[sel].mean()) if len(sel) else float("nan"),
            "trained: mean mode share": float(st["mode_share"].mean()),
            "Def. 4 simulation: mean mode share": float(sim_st["mode_share"].mean()),
            "trained: non-expert pairs agreeing on ≥ 90 % of inputs": scm.agreeing_pairs(st["agreement"], non_experts),
            "Def. 4 simulation: non-expert pairs agreeing on ≥ 90 %": scm.agreeing_pairs(sim_st["agreement"],
                                                                                           non_experts),
            "trained: mean entropy of non-experts (nats)": float(scm.mean_entropy(probs)[non_experts].mean())
            if len(non_experts) else float("nan"),
            "Def. 4 simulation: mean entropy of non-experts (nats)": float(
                scm.mean_entropy(sim.probs)[non_experts].mean()) if len(non_experts) else float("nan"),
        }
    rows = []  # (c) selection only, at other prediction temperatures
    for t in config.temperatures:  # a handful of temperatures: the experiment's own grid
        chosen = select(scm.tempered(probs, t), gamma, config).selected
        rows.append({"temperature": t, "selected": chosen.tolist(),
                     "selected accuracy (%)": 100 * float(acc[chosen].mean()) if len(chosen) else float("nan")})
    out["temperatures"] = rows
    return out


def _stability(probs: torch.Tensor, sizes: np.ndarray, config: ScmConfig) -> dict[str, Any]:
    """Table 1: repeated selections (random start on the feasible set, a random share of D)
    with and without the size regulariser; the stability metrics of their selection vectors."""
    gamma = config.gammas[0]
    out = {"gamma": gamma, "runs": config.stability_runs}
    n = probs.shape[1]
    take = max(1, round(config.stability_subsample * n))
    for label, kappa in (("FedSCM", 0.0), ("FedSCM+SR", config.stability_kappa)):
        rng = np.random.default_rng(config.seed + 99)
        rows = []
        for _ in range(config.stability_runs):  # repeated runs: the experiment's own repetitions
            init = scm.project_capped_simplex(torch.from_numpy(rng.dirichlet(np.ones(len(sizes)))), 1 - gamma)
            sub = probs[:, rng.choice(n, take, replace=False)]
            sel = select(sub, gamma, config, kappa=kappa, sizes=torch.as_tensor(sizes, dtype=torch.float64), init=init)
            rows.append(np.isin(np.arange(len(sizes)), sel.selected))
        out[label] = scm.stability(np.array(rows))
        out[label + " selections"] = [np.flatnonzero(r).tolist() for r in rows]
    return out


def _jsd_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """JSD in bits between every row of ``p [K, C]`` and ``q [C]`` (as fedlib.metrics.jsd)."""
    m = 0.5 * (p + q[None])

    def kl(a, b):
        return np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0) / np.where(b > 0, b, 1.0)), 0.0).sum(-1)

    return np.clip(0.5 * (kl(p, m) + kl(q[None], m)) / np.log(2), 0.0, 1.0)


def execute(config: ScmConfig, dataset=None, progress: bool = False) -> dict[str, Any]:
    """Run Algorithm 2 and every baseline on one federation (uncached): the record's JSON (the module's
    docstring), without the key's provenance."""
    stages = _pipeline(config, dataset, progress)
    answer = None
    while True:
        try:
            request = stages.send(answer)
        except StopIteration as done:
            return done.value
        answer = request.answer() if isinstance(request, TrainRequest) else execute_packed(request)


def _pipeline(config: ScmConfig, dataset, progress: bool):
    """:func:`execute` as stages: yields the one-shot stage's local training (a ``TrainRequest``, resumed
    with the trained clients) and the plain post-trainings (a list of prepared runs, resumed with their
    results), so :func:`execute_many` can answer several federations' stages together; returns the result."""
    t_start = time.perf_counter()
    device = resolve_device(config.device)
    ds = dataset or load_dataset(config.dataset, root=config.data_root, device="cpu")
    c = ds.num_classes
    log = (lambda *a: print(*a, flush=True)) if progress else (lambda *a: None)
    fed = build_federation(config, ds)
    torch.manual_seed(config.seed)
    model = build_model(config.model, tuple(ds.input_shape), c).to(device)
    timings = {}

    layout0 = ParamLayout(model)
    layout_flat0, bufs0 = layout0.flat_of(model).clone(), {k: v.unsqueeze(0).clone() for k, v in
                                                             layout0.buffers_of(model).items()}
    t0 = time.perf_counter()
    report("stage", name=f"local training of {config.n_clients} clients")
    flat, bufs = yield local_training_request(model, fed, config, device)
    timings["local_training"] = time.perf_counter() - t0
    log(f"trained {config.n_clients} clients in {timings['local_training']:.1f} s")

    t0 = time.perf_counter()
    report("stage", name=f"{config.n_clients} clients predict the server set")
    x_server = fed["x_server"].to(device)
    probs = client_probabilities(model, flat, bufs, x_server, config.predict_chunk).double().cpu()  # Alg. 2, step 1
    timings["predictions"] = time.perf_counter() - t0

    x_eval, y_eval = fed["x_eval"].to(device), fed["y_eval"].to(device)
    y_server = fed["y_server"]
    client_eval = evaluate(model, flat, bufs, x_eval, y_eval, c, model_chunk=config.predict_chunk)
    server_acc = (probs.argmax(-1) == y_server.view(1, -1)).double().mean(1)  # accuracy on the target set D
    sizes = fed["sizes"]
    target_p = fed["target_proportions"]
    client_p = fed["counts"] / np.maximum(fed["counts"].sum(1, keepdims=True), 1)
    similarity = 1.0 - _jsd_rows(client_p, target_p)  # Fig. 6's 1 − JSD, per client

    methods: dict[str, dict[str, Any]] = {}
    rng = np.random.default_rng(config.seed + 4242)
    plans: list[tuple[str, np.ndarray, np.ndarray, float, bool]] = []  # label, clients, weights, mu, post-train
    t0 = time.perf_counter()
    report("stage", name=f"selection for {len(config.gammas)} γ")
    selections = {}
    for gamma in config.gammas:
        sel = select(probs, gamma, config, kappa=config.kappa,
                     sizes=torch.as_tensor(sizes, dtype=torch.float64) if config.kappa else None)  # step 2
        selections[gamma] = sel
    timings["selection"] = time.perf_counter() - t0
    for m in config.methods:
        if m == "fedscm":
            for gamma, sel in selections.items():
                clients = sel.selected
                plans.append((f"FedSCM (γ = {gamma:g})", clients, sel.weights.numpy()[clients], config.prox_mu, True))
        elif m == "random":
            for r in config.random_sizes:
                clients = np.sort(rng.choice(config.n_clients, r, replace=False))
                plans.append((f"Random (K = {r})", clients, np.ones(r), config.prox_mu, True))
        elif m == "sdea":
            clients = scm.sdea_select(probs, config.sdea_clients)
            plans.append(("SDEA", clients, np.ones(len(clients)), config.prox_mu, True))
        elif m == "fedavg":
            plans.append(("FedAvg", np.arange(config.n_clients), sizes.astype(float), 0.0, True))
        elif m == "source_free":
            sel = selections[config.gammas[0]]
            plans.append(("Source Free", sel.selected, sel.weights.numpy()[sel.selected], 0.0, False))
        elif m == "best_source":
            best = int(server_acc.argmax())  # oracle: labels of the target set
            plans.append(("Best Source", np.array([best]), np.ones(1), 0.0, False))
        elif m in ("k3da", "comda", "fmda_ot"):
            plans.append((LABELS[m], np.arange(config.n_clients), np.ones(config.n_clients), 0.0, m))
    x_server = fed["x_server"]
    # the plain post-trainings (FedSCM per γ, Random, SDEA, FedAvg) train as one pack (fedlib.packing)
    plain = [salt for salt, plan in enumerate(plans) if plan[4] is True and config.post_rounds]
    if plain:
        report("stage", name=f"post-training of {len(plain)} cohort(s), packed", done=0, total=len(plans))
        packed = yield [post_training(model, ds, flat, bufs, plans[i][1], plans[i][2], fed, config, plans[i][3],
                                      config.fedavg_per_round if plans[i][0] == "FedAvg" else None) for i in plain]
        trained = {i: r.model for i, r in zip(plain, packed)}
        pack_seconds = sum(r.meta["wall_time"] for r in packed) / len(packed)
    for salt, (label, clients, weights, mu, train) in enumerate(plans):
        t0 = time.perf_counter()
        report("stage", name=f"{label} on {len(clients)} client(s)", done=salt, total=len(plans))
        info: dict[str, Any] = {}
        if train == "k3da":  # KD3A: CF-weighted sources + the target trained on knowledge-vote labels
            kd = fda.kd3a_weights(probs, config.vote_gate, config.cf_permutations, config.seed)
            weights = kd["sources"].numpy()
            init = aggregate(flat, torch.as_tensor(weights / weights.sum(), dtype=flat.dtype, device=flat.device),
                             bufs)
            info = {"target_weight": kd["target"], "voted_samples": int(kd["mask"].sum()),
                    "vote_accuracy (%)": 100 * float((kd["labels"] == y_server)[kd["mask"]].double().mean())
                    if kd["mask"].any() else None}
            g_flat, g_bufs = init
            if config.post_rounds:
                mask = kd["mask"]
                aug = with_server_client(fed, x_server[mask], kd["labels"][mask]) if mask.any() else fed
                who = np.arange(config.n_clients + (1 if mask.any() else 0))
                w = np.append(weights, kd["target"]) if mask.any() else weights
                g_flat, g_bufs = post_train(model, ds, flat, bufs, who, w, aug, config, 0.0, None, init)
            clients = np.flatnonzero(weights > 0)
        elif train == "comda":  # Co-MDA (our reading): black-box consensus labels, a target model from scratch
            co = fda.comda_weights(probs, config.comda_clients)
            weights, clients = co["weights"].numpy()[co["selected"]], co["selected"]
            start = (layout_flat0.to(flat.device), {k: v[0] for k, v in bufs0.items()})
            g_flat, g_bufs = server_train(model, *start, x_server, co["labels"], config, device, config.adapt_steps,
                                          salt)
            own = torch.softmax(predict(model, g_flat.unsqueeze(0), {k: v.unsqueeze(0) for k, v in g_bufs.items()},
                                        x_server.to(device))[0].double().cpu(), -1)
            refined = (0.5 * co["mixture"] + 0.5 * own).argmax(-1)  # co-learning: consensus and target model
            g_flat, g_bufs = server_train(model, g_flat, g_bufs, x_server, refined, config, device,
                                          config.adapt_steps, salt + 1)
            info = {"pseudo-label accuracy (%)": 100 * float((refined == y_server).double().mean())}
        elif train == "fmda_ot":  # FMDA-OT: OT-transported sources, weights from a pseudo-labelled subset
            tr = _fmda_transport(fed, config, c)
            pseudo = tr["received"].argmax(-1)
            n_val = max(1, len(pseudo) // 5)
            weights = fda.fmda_ot_weights(probs[:, :n_val], pseudo[:n_val]).numpy()
            moved_fed = {**fed, "x": tr["moved"].reshape(-1, *fed["x"].shape[1:]),
                         "y": fed["y"][torch.as_tensor(tr["index"].reshape(-1))],
                         "indices": [i * config.ot_samples + np.flatnonzero(tr["mass"][i] > 0)
                                     for i in range(config.n_clients)]}
            init = aggregate(flat, torch.as_tensor(weights, dtype=flat.dtype, device=flat.device), bufs)
            g_flat, g_bufs = init
            if config.post_rounds:
                g_flat, g_bufs = post_train(model, ds, flat, bufs, np.arange(config.n_clients), weights, moved_fed,
                                            config, 0.0, config.fedavg_per_round, init)
            g_flat, g_bufs = server_train(model, g_flat, g_bufs, x_server[:n_val], pseudo[:n_val], config, device,
                                          config.adapt_steps, salt)
            info = {"pseudo-label accuracy (%)": 100 * float((pseudo == y_server).double().mean())}
            clients = np.flatnonzero(weights > 0)
            weights = weights[clients]
        elif train and config.post_rounds:
            g_flat, g_bufs = trained[salt]
            info = {"packed_with": len(plain), "pack_seconds": pack_seconds}  # its rounds ran in the pack
        else:
            sel = torch.as_tensor(clients, device=flat.device)
            w = torch.as_tensor(weights / weights.sum(), dtype=flat.dtype, device=flat.device)
            g_flat, g_bufs = aggregate(flat[sel], w, {k: v[sel] for k, v in bufs.items()})
        acc, bal = _accuracy(model, g_flat, g_bufs, x_eval, y_eval, c)
        methods[label] = {"clients": np.asarray(clients).tolist() if len(clients) <= 50 else f"all {len(clients)}",
                          "weights": (np.asarray(weights) / np.sum(weights)).tolist() if len(clients) <= 50 else None,
                          "accuracy": acc, "balanced_accuracy": bal, "post_trained": bool(train and config.post_rounds),
                          "seconds": time.perf_counter() - t0, **info}
        log(f"{label}: {100 * acc:.2f}% ({time.perf_counter() - t0:.1f} s)")

    result: dict[str, Any] = {  # the record's JSON (the module's docstring)
        "config": config.to_dict(),
        "history": [],  # one-shot: the post-trainings' rounds are inside the methods' rows
        "final": pipeline_final(methods),
        "methods": methods,
        "selections": {f"{g:g}": s.to_dict() for g, s in selections.items()},
        "clients": {
            "sizes": sizes.tolist(), "class_counts": fed["counts"].tolist(),
            "target_accuracy": server_acc.tolist(),  # on the server's set D, with its hidden labels
            "eval_accuracy": client_eval.accuracy.cpu().tolist(),
            "mean_entropy": scm.mean_entropy(probs).tolist(),
            "similarity": similarity.tolist(),
        },
        "target_proportions": np.asarray(target_p).tolist(),
    }
    eta_hat = None
    if config.expertise_repeats:
        t0 = time.perf_counter()
        eta_hat = scm.estimate_expertise(probs, y_server, repeats=config.expertise_repeats, grid=51, seed=config.seed)
        result["clients"]["eta_hat"] = eta_hat.tolist()
        timings["expertise"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    result["diagnosis"] = diagnose(probs, y_server, fed, selections, eta_hat, config, c)
    timings["diagnosis"] = time.perf_counter() - t0
    if config.stability_runs:
        t0 = time.perf_counter()
        result["stability"] = _stability(probs, sizes, config)
        timings["stability"] = time.perf_counter() - t0
    result["meta"] = {**environment(device, time.perf_counter() - t_start), "dataset_source": ds.source,
                      "timings": timings}
    return result


def execute_many(configs: list[ScmConfig], dataset=None, progress: bool = False) -> list[dict[str, Any]]:
    """:func:`execute` for several federations (α, seeds) at once, each result equal to its federation
    run alone (float rounding aside, as ``fedlib.packing`` states): their one-shot stages train all
    their clients as one population (``fedlib.packing.train_together``: one call per equal training
    signature, at most the largest federation's clients per chunk, so memory stays what one run needs),
    and their plain post-trainings run as packs (``fedlib.packing``, rows bounded by device memory).
    Each federation keeps its own generator streams; the global torch generator each sees is its own."""
    datasets: dict[tuple, Any] = {}
    stages, states, answers, results = [], [], [None] * len(configs), [None] * len(configs)
    for config in configs:
        ds = dataset or datasets.setdefault((config.dataset, config.data_root), load_dataset(
            config.dataset, root=config.data_root, device="cpu"))
        stages.append(_pipeline(config, ds, progress))
        states.append(None)
    pending = list(range(len(configs)))
    while pending:
        requests = {}
        for i in pending:  # each advances to its next stage under its own global generator state
            saved = _rng_state()
            if states[i] is not None:
                _set_rng_state(states[i])
            try:
                requests[i] = stages[i].send(answers[i])
            except StopIteration as done:
                results[i] = done.value
                results[i]["meta"]["pack"] = {"size": len(configs), "index": i, "methods": ["pipeline"] * len(configs)}
            states[i] = _rng_state()
            _set_rng_state(saved)
        pending = list(requests)
        training = {i: r for i, r in requests.items() if isinstance(r, TrainRequest)}
        groups: dict[tuple, list[int]] = {}
        for i, r in training.items():
            groups.setdefault(train_signature(r), []).append(i)
        for members in groups.values():
            largest = max(training[i].rows for i in members)
            for i in members:  # a pack's chunk: at most the clients one federation trains at once
                t = training[i].training
                training[i] = replace(training[i], training=replace(t, chunk_size=t.chunk_size or largest))
            merged = train_together([training[i] for i in members]) if _merges(training[members[0]]) else [
                training[i].answer() for i in members]  # convolutions on a CPU: one by one (fedlib.packing)
            for i, answer in zip(members, merged):
                answers[i] = answer
        post = [(i, j, p) for i, r in requests.items() if not isinstance(r, TrainRequest) for j, p in enumerate(r)]
        if post:
            first = post[0][2]
            max_rows = rows_per_pack(first.model, first.dataset.input_shape, first.config.batch_size, first.device)
            done: dict[tuple[int, int], Any] = {}
            for pack in make_packs([p.config for *_, p in post], max_rows):
                for k, result in zip(pack, execute_packed([post[k][2] for k in pack])):
                    done[post[k][:2]] = result
            for i, r in requests.items():
                if not isinstance(r, TrainRequest):
                    answers[i] = [done[(i, j)] for j in range(len(r))]
    return results  # type: ignore[return-value]


def _rng_state() -> tuple:
    return torch.random.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)


def _set_rng_state(state: tuple) -> None:
    torch.random.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def run_pipelines(configs: list[ScmConfig | dict], *, cache: bool | ResultCache = True, dataset=None,
                  progress: bool = False, on_done: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
    """:func:`run_pipeline` for several federations: cached ones from the cache, the others together
    (:func:`execute_many`); ``on_done(i, record)`` for each as it is ready."""
    configs = [c if isinstance(c, ScmConfig) else ScmConfig.make(c) for c in configs]
    store = as_store(cache)
    out: list[RunResult | None] = [None] * len(configs)
    todo = []
    for i, config in enumerate(configs):
        hit = store.get(config.key(), _entry_check) if store is not None else None
        if hit is None:
            todo.append(i)
            continue
        out[i] = RunResult.from_dict(run_of(hit))
        if on_done is not None:
            on_done(i, out[i])
    for i, result in zip(todo, execute_many([configs[i] for i in todo], dataset, progress) if todo else []):
        out[i] = _finish(configs[i], result, store)
        if on_done is not None:
            on_done(i, out[i])
    return out  # type: ignore[return-value]


def _finish(config: ScmConfig, result: dict[str, Any], store) -> RunResult:
    """The record of a fresh result, with its key's provenance, kept in the cache (when there is one)."""
    fingerprint = config.data_fingerprint()  # what produced it, as every engine run records (fedlib.results)
    result["meta"].update(_key_provenance(config, fingerprint, config.key(fingerprint)))
    result = json.loads(json.dumps(result))
    if store is not None:  # a cache that cannot be written: one warning line, the result is returned
        store.keep(config.key(), stored_payload(config.to_dict(), result))
    report("run", cached=False, wall=result["meta"].get("wall_time", 0.0))
    return RunResult.from_dict(result)


def run_pipeline(config: ScmConfig | dict, *, cache: bool | ResultCache = True, dataset=None,
                 progress: bool = False) -> RunResult:
    """One federation's record (the module's docstring), from the cache when the config was run before.
    The cache is fedlib.run's (``$FEDLIB_CACHE/runs``) and its entries are stored runs' JSON
    (``fedlib.store.stored_payload``): copying one into ``results/runs/`` keeps it. ``fedlib.run(config)``
    calls it for an ``ScmConfig``."""
    config = config if isinstance(config, ScmConfig) else ScmConfig.make(config)
    store = as_store(cache)  # True, False or a ResultCache
    if store is not None and (hit := store.get(config.key(), _entry_check)) is not None:
        report("run", cached=True, wall=0.0)
        return RunResult.from_dict(run_of(hit))
    return _finish(config, execute(config, dataset, progress), store)


def _entry_check(entry: dict) -> str | None:
    """None when a cache entry holds a FedSCM record's JSON (its sections, config and meta), else why not."""
    result = run_of(entry)
    if not is_pipeline_result(result):
        return "not a FedSCM pipeline result"
    return None if isinstance(result.get("config"), dict) and isinstance(result.get("meta"), dict) else \
        "a FedSCM pipeline result without its config or meta"
