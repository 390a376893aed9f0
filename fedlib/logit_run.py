"""The logit-based FL protocol ("Who to trust?", arXiv 2509.15147): its own round loop.

Not parameter aggregation, so not ``fedlib.run``'s loop. One round, all clients at once:

1. local training of every present client on its private data (``train_clients``, vmapped);
2. every client model predicts the public set, the test set and the local validation splits
   in one batched pass (``predict``);
3. the server aggregates the public-set logits (``fedlib.methods.logit``: simple averaging,
   UWA or the meta-model); the same aggregator applied to the test-set logits is the global
   prediction whose accuracy we report;
4. the aggregated logits return as soft targets: every present client refines on the public
   set (``train_clients`` with probability targets plus a temperature distillation term via
   ``LocalTraining.extra_loss``). The last round ends after step 3.

``public_logits`` (a config field; its default is the first protocol) moves step 4: ``after_local`` is the order above;
``after_refine`` refines right after step 1 on the previous round's aggregate (none in round 1),
so the uploaded logits come from refined models. ``distill_lr`` is the refinement's step size
(None: ``lr``). These and the epochs, lr and temperature were calibrated on simple averaging
(``fedlib.chapters.logitfl.calibrate``).

Data: ``fedlib.run.prepare`` with ``server_val = public_size`` holds the public set out of
the training set before the ``k_classes`` split, so no client holds a public sample. Each
client keeps ``val_fraction`` of its private samples out of local training as the local
validation split of its GMM (UWA); the split is made for every aggregator, so that runs
differ only in the aggregation rule.

``run_logit(config)`` returns a ``RunResult`` (JSON), cached by the config's hash in
``fedlib.cache.ResultCache`` like ``fedlib.run``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import time
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .cache import ResultCache
from .config import CACHE_FORMAT, ENGINE_VERSION, ConfigError, RunConfig, _hash, make_config
from .data import Dataset
from .methods import logit as agg
from .population import LocalTraining, ParamLayout, make_client_batches, padded_indices, predict, train_clients

__all__ = ["LogitConfig", "make_logit_config", "run_logit", "run_logit_many", "fedavg_config"]

AGGREGATORS = ("simple", "uwa", "meta")
RULE_VERSION = "1"  # the logit protocol's rule version (distillation, GMM, UWA, meta-model): bump with any change
# Protocol fields added after the first protocol, at the values that reproduce it:
# a config at these values has the key it had before the fields existed.
LEGACY: dict[str, Any] = {"distill_lr": None, "public_logits": "after_local"}


class LogitConfig(BaseModel):
    """One logit-based federation. Defaults: our reading of the paper's MNIST protocol."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = "mnist"
    data_root: str | None = None
    fraction: float = Field(1.0, gt=0, le=1, description="share of the training set used")
    test_samples: int | None = Field(None, ge=1)
    model: str = "lenet5"
    n_clients: int = Field(10, ge=2)
    k: int = Field(2, ge=1, description="classes per client (k_classes split)")
    public_size: int = Field(5000, ge=10, description="public samples held out of every client")
    meta_labeled: int = Field(1000, ge=10, description="labelled public samples for the meta-model")
    aggregator: Literal["simple", "uwa", "meta"] = "uwa"
    rounds: int = Field(10, ge=1)
    local_epochs: int = Field(1, ge=1)
    distill_epochs: int = Field(1, ge=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(0.05, gt=0, description="SGD step size of local training on private data")
    momentum: float = Field(0.0, ge=0, lt=1)
    temperature: float = Field(2.0, gt=0)
    # protocol choices the paper's summary leaves open (calibrated on simple averaging; see
    # fedlib.chapters.logitfl.calibrate); their first-protocol values are LEGACY below
    distill_lr: float | None = Field(None, gt=0, description="SGD step size of the refinement; None: lr")
    public_logits: Literal["after_local", "after_refine"] = Field(
        "after_local", description="after_local: clients upload logits right after private training and refine "
        "on the current round's aggregate; after_refine: from round 2 they first refine on the previous round's "
        "aggregate, then upload")
    val_fraction: float = Field(0.1, gt=0, lt=1, description="share of each client's data for its GMM")
    gmm_components: int | None = Field(None, ge=1, description="None: one per class the client holds")
    gmm_iters: int = Field(10, ge=0)
    uwa_tau: float = Field(1.0, gt=0, description="softmax temperature of the UWA weights (paper: 1)")
    uwa_score: Literal["loglik", "standardized"] = Field(
        "loglik", description="loglik: the paper's rule; standardized: z-scored by the client's own validation log-likelihoods")
    reg_covar: float = Field(0.01, gt=0)
    meta_hidden: int = Field(64, ge=1)
    meta_steps: int = Field(300, ge=1)
    meta_lr: float = Field(0.01, gt=0)
    meta_drop: float = Field(0.2, ge=0, lt=1, description="client-dropout augmentation of the meta-model")
    dropout: float = Field(0.0, ge=0, lt=1, description="probability that a client misses a round")
    seed: int = 0
    device: str = "cpu"
    client_chunk: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _consistent(self):
        if self.meta_labeled > self.public_size:
            raise ValueError(f"meta_labeled: must be <= public_size = {self.public_size} (got {self.meta_labeled})")
        run_config(self)  # the dataset, model, split and device checks of RunConfig
        return self

    # the key interface of RunConfig (fedlib.config): resolved config, rule versions, data fingerprint
    def resolved(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", exclude={"data_root"})
        for name, value in LEGACY.items():  # runs of the first protocol keep their keys
            if data[name] == value:
                del data[name]
        return {**data, "_protocol": "logit"}

    def rule_versions(self) -> dict[str, str]:
        return {"engine": ENGINE_VERSION, "logit": RULE_VERSION}

    def data_fingerprint(self) -> dict[str, Any]:
        return run_config(self).data_fingerprint()

    def config_key(self) -> str:
        return _hash({"config": self.resolved(), "rules": self.rule_versions(), "_format": CACHE_FORMAT})

    def key(self, fingerprint: dict[str, Any] | None = None) -> str:
        """Hash of the resolved config, the rule versions and the data's content fingerprint."""
        fingerprint = self.data_fingerprint() if fingerprint is None else fingerprint
        data = fingerprint.get("sha256") or {"missing": self.dataset}
        return _hash({"config": self.resolved(), "rules": self.rule_versions(), "data": data, "_format": CACHE_FORMAT})

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def run_config(cfg: LogitConfig, method: str = "fedavg") -> RunConfig:
    """The RunConfig with the same data, split and local training (``server_val`` = the public set).

    Used to prepare the logit federation and, with ``method='fedavg'``, as its FedAvg baseline."""
    return make_config(
        dataset=cfg.dataset, data_root=cfg.data_root, fraction=cfg.fraction, test_samples=cfg.test_samples,
        server_val=cfg.public_size, model=cfg.model, split={"name": "k_classes", "k": cfg.k},
        n_clients=cfg.n_clients, rounds=cfg.rounds, local_epochs=cfg.local_epochs, batch_size=cfg.batch_size,
        lr=cfg.lr, momentum=cfg.momentum, method=method, seed=cfg.seed, device=cfg.device,
        client_chunk=cfg.client_chunk,
    )


fedavg_config = run_config


def make_logit_config(data: dict[str, Any] | LogitConfig | None = None, source: str = "logit config",
                      **overrides) -> LogitConfig:
    """Validate a dict (plus overrides) into a LogitConfig; errors are one ConfigError line."""
    if isinstance(data, LogitConfig):
        data = data.to_dict()
    merged = {**(data or {}), **overrides}
    try:
        return LogitConfig(**merged)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "config"
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"{source}: unknown key {field!r}; allowed keys: "
                              f"{', '.join(LogitConfig.model_fields)}") from None
        msg = first["msg"].removeprefix("Value error, ").replace("\n", " ")
        if msg.startswith("config: "):  # from the inner RunConfig
            msg = msg.removeprefix("config: ")
            raise ConfigError(f"{source}: {msg}") from None
        got = first.get("input")
        shown = "" if isinstance(got, dict) or msg.endswith(")") else f" (got {got!r})"
        prefix = f"{field}: " if first["loc"] else ""
        raise ConfigError(f"{source}: {prefix}{msg}{shown}") from None


# ----------------------------------------------------------------------------- the loop


def _split_validation(indices: list[np.ndarray], fraction: float, seed: int):
    """Each client's samples -> (training lists, validation table [N, V], validity [N, V]).

    One shuffle of all clients (random keys, argsort); client i keeps the first
    ceil(fraction * n_i) of its shuffled samples for validation (at least 1, at most n_i - 1)."""
    table, sizes = padded_indices(indices)
    col = torch.arange(table.shape[1]).unsqueeze(0)
    real = col < sizes.unsqueeze(1)
    keys = torch.rand(table.shape, generator=torch.Generator().manual_seed(seed + 7))
    shuffled = torch.gather(table, 1, torch.argsort(keys.masked_fill(~real, 2.0), dim=1))
    n_val = torch.ceil(fraction * sizes).long().clamp(min=1).minimum((sizes - 1).clamp(min=0))
    width = max(int(n_val.max()), 1)
    val_valid = col[:, :width] < n_val.unsqueeze(1)
    train_keep = (col >= n_val.unsqueeze(1)) & real
    train = [row[keep].numpy() for row, keep in zip(shuffled, train_keep)]  # ragged lists for the batcher
    return train, shuffled[:, :width], val_valid


def _present_clients(rng: np.random.Generator, n: int, dropout: float) -> np.ndarray:
    present = rng.random(n) >= dropout
    if not present.any():
        present[rng.integers(n)] = True
    return present


def _weight_diagnostics(w: torch.Tensor, present: torch.Tensor, y: torch.Tensor, n_classes: int,
                        bins: int = 20) -> dict[str, Any]:
    """UWA weights on the public set: per client and true class mean weight, histograms of the
    largest weight and of the normalised entropy (1 = uniform over the clients present)."""
    onehot = F.one_hot(y, n_classes).to(w.dtype)  # [n, C]
    by_class = (w @ onehot) / onehot.sum(0).clamp(min=1)  # [N, C]
    n_present = int(present.sum())
    entropy = -(w * torch.log(w.clamp(min=1e-30))).sum(0) / max(math.log(n_present), 1e-12)
    top = w.max(0).values
    edges = torch.linspace(0, 1, bins + 1)
    return {
        "class_weight": by_class.tolist(),
        "max_weight_hist": torch.histc(top.float().cpu(), bins, 0, 1).tolist(),
        "entropy_hist": torch.histc(entropy.clamp(0, 1).float().cpu(), bins, 0, 1).tolist(),
        "hist_edges": edges.tolist(),
        "mean_max_weight": float(top.mean()),
        "mean_entropy": float(entropy.mean()) if n_present > 1 else 0.0,
        "uniform_weight": 1.0 / n_present,
    }


def run_logit(config: LogitConfig | dict, *, cache: bool | ResultCache = True, progress: bool = False,
              dataset: Dataset | None = None):
    """Run (or fetch from the cache) one logit-based federation; returns a ``RunResult``."""
    from .run import RunResult

    from .run import _fingerprint_of, _key_provenance, result_check

    cfg = make_logit_config(config) if not isinstance(config, LogitConfig) else config
    store = cache if isinstance(cache, ResultCache) else (ResultCache() if cache else None)
    fingerprint = _fingerprint_of(run_config(cfg), dataset)
    if fingerprint.get("sha256") is None:  # files not there yet (a download may bring them): load first
        from .run import _load

        dataset = _load(run_config(cfg))
        fingerprint = _fingerprint_of(run_config(cfg), dataset)
    key = cfg.key(fingerprint)
    if store is not None and (hit := store.get(key, result_check(cfg, fingerprint))) is not None:
        return RunResult.from_dict(hit)
    fresh = _execute(cfg, dataset, progress)
    fresh.meta.update(_key_provenance(cfg, fingerprint, key))
    result = RunResult.from_dict(json.loads(json.dumps(fresh.to_dict())))
    if store is not None:
        store.put(key, result.to_dict())
    return result


def run_logit_many(configs, *, cache: bool | ResultCache = True, progress: bool = False) -> list:
    configs = [make_logit_config(c) if not isinstance(c, LogitConfig) else c for c in configs]
    store = cache if isinstance(cache, ResultCache) else (ResultCache() if cache else None)
    return [run_logit(c, cache=store if store is not None else False, progress=progress) for c in configs]


def _execute(cfg: LogitConfig, dataset: Dataset | None, progress: bool):
    from .run import RunResult, prepare

    t_start = time.perf_counter()
    p = prepare(run_config(cfg), dataset)
    model, part, device = p.model, p.partition, p.device
    n, c = cfg.n_clients, p.dataset.num_classes
    if cfg.meta_labeled > len(p.y_val):
        raise ConfigError(f"logit config: meta_labeled: must be <= the {len(p.y_val)} public samples")
    x_pub, y_pub = p.x_val, p.y_val
    layout = ParamLayout(model)
    train_idx, val_table, val_valid = _split_validation(part.indices, cfg.val_fraction, cfg.seed)
    val_table, val_valid = val_table.to(device), val_valid.to(device)
    y_val = p.y_pool[val_table]  # [N, V] the clients' own validation labels (for the GMM init)
    x_all = torch.cat([x_pub, p.x_test, p.x_pool[val_table.flatten()]])
    n_pub, n_test, width = len(y_pub), len(p.y_test), val_table.shape[1]
    if cfg.gmm_components is None:  # class-conditional start: one component per class held
        init_resp = F.one_hot(y_val, c).float()
    else:
        draw = torch.randint(cfg.gmm_components, val_table.shape, generator=torch.Generator().manual_seed(cfg.seed))
        init_resp = F.one_hot(draw, cfg.gmm_components).float().to(device)

    flat = layout.flat_of(model)  # common initialisation, shared by every client
    bufs = {k: v.unsqueeze(0) for k, v in layout.buffers_of(model).items()}
    rng = np.random.default_rng(cfg.seed)
    pub_all = np.arange(n_pub)
    empty = np.zeros(0, dtype=np.int64)
    history: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    rounds = range(cfg.rounds)
    if progress:
        from tqdm.auto import tqdm

        rounds = tqdm(rounds, desc=f"logit {cfg.aggregator} on {cfg.dataset}", leave=False)
    distill = LocalTraining(
        epochs=cfg.distill_epochs, batch_size=cfg.batch_size, lr=cfg.distill_lr or cfg.lr, momentum=cfg.momentum,
        chunk_size=cfg.client_chunk,
        extra_loss=lambda params, out, feats, yb, mb, ctx: agg.distillation_loss(out, yb, mb, cfg.temperature),
    )

    def refine(flat, bufs, targets, present_np, gen):
        """Every present client distils the aggregated soft targets on the whole public set."""
        batches = make_client_batches([pub_all if on else empty for on in present_np], cfg.batch_size,
                                      cfg.distill_epochs, gen)
        batches.index, batches.mask = batches.index.to(device), batches.mask.to(device)
        return train_clients(model, flat, bufs, x_pub, targets, batches, distill)

    targets = None  # the last aggregate's soft targets on the public set
    for t in rounds:
        gen = torch.Generator().manual_seed((cfg.seed * 1_000_003 + t * 7_919 + 1) % (2**63))
        present_np = _present_clients(rng, n, cfg.dropout)
        present = torch.from_numpy(present_np).to(device)
        # 1. local training on private data (absent clients have no batches: unchanged)
        t0 = time.perf_counter()
        local = LocalTraining(epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                              momentum=cfg.momentum, chunk_size=cfg.client_chunk)
        batches = make_client_batches([ix if on else empty for ix, on in zip(train_idx, present_np)],
                                      cfg.batch_size, cfg.local_epochs, gen)
        batches.index, batches.mask = batches.index.to(device), batches.mask.to(device)
        flat, bufs = train_clients(model, flat, bufs, p.x_pool, p.y_pool, batches, local)
        if cfg.public_logits == "after_refine" and targets is not None and cfg.distill_epochs:
            flat, bufs = refine(flat, bufs, targets, present_np, gen)  # on the previous round's aggregate
        # 2. logits of every client on public, test and validation samples: one batched pass
        logits = predict(model, flat, bufs, x_all, batch_size=512)
        pub, test = logits[:, :n_pub], logits[:, n_pub:n_pub + n_test]
        val = logits[:, n_pub + n_test:].reshape(n, n, width, c).diagonal(dim1=0, dim2=1).permute(2, 0, 1)
        t_train = time.perf_counter() - t0
        # 3. server aggregation (the same rule on the test logits is the global prediction)
        t0 = time.perf_counter()
        extra = {}
        if cfg.aggregator == "simple":
            agg_pub, agg_test = agg.simple_average(pub, present), agg.simple_average(test, present)
        elif cfg.aggregator == "uwa":
            gmm = agg.fit_gmm(val, val_valid, init_resp, cfg.gmm_iters, cfg.reg_covar)  # on the clients
            ll_pub, ll_test = agg.gmm_log_likelihood(gmm, pub), agg.gmm_log_likelihood(gmm, test)
            if cfg.uwa_score == "standardized":
                ll_pub, ll_test = agg.standardize_scores(agg.gmm_log_likelihood(gmm, val), val_valid, ll_pub, ll_test)
            agg_pub, w = agg.uwa_aggregate(pub, ll_pub, present, cfg.uwa_tau)
            agg_test, _ = agg.uwa_aggregate(test, ll_test, present, cfg.uwa_tau)
            details = _weight_diagnostics(w, present, y_pub, c)
            extra = {"mean_max_weight": details["mean_max_weight"], "mean_entropy": details["mean_entropy"]}
        else:
            lab = slice(0, cfg.meta_labeled)
            meta = agg.train_meta_model(pub[:, lab], y_pub[lab], c, hidden=cfg.meta_hidden, steps=cfg.meta_steps,
                                        lr=cfg.meta_lr, drop=cfg.meta_drop, present=present,
                                        seed=cfg.seed * 1000 + t)
            agg_pub, agg_test = agg.meta_aggregate(meta, pub, present), agg.meta_aggregate(meta, test, present)
        t_server = time.perf_counter() - t0
        pred = agg_test.argmax(-1)
        confusion = torch.zeros(c * c, device=device).scatter_add_(0, p.y_test * c + pred,
                                                                    torch.ones_like(pred, dtype=torch.float))
        confusion = confusion.view(c, c)
        per_class = confusion.diagonal() / confusion.sum(1).clamp(min=1)
        client_acc = (test.argmax(-1) == p.y_test).float().mean(1)
        floats_logits = int(present.sum()) * n_pub * c
        record = {
            "round": t, "accuracy": float((pred == p.y_test).float().mean()),
            "balanced_accuracy": float(per_class[confusion.sum(1) > 0].mean()),
            "per_class_accuracy": per_class.tolist(),
            "public_accuracy": float((agg_pub.argmax(-1) == y_pub).float().mean()),
            "client_accuracy": client_acc.tolist(), "present": present_np.tolist(),
            "floats_up": floats_logits + (int(present.sum()) * n_pub if cfg.aggregator == "uwa" else 0),
            "floats_down": floats_logits, "fedavg_floats": 2 * int(present.sum()) * layout.size,
            "time_train": t_train, "time_server": t_server, **extra,
        }
        # 4. local refinement on the soft targets (after_local: now, but not after the last round)
        targets = torch.softmax(agg_pub, dim=-1).detach()
        if cfg.public_logits == "after_local" and t + 1 < cfg.rounds and cfg.distill_epochs:
            t0 = time.perf_counter()
            flat, bufs = refine(flat, bufs, targets, present_np, gen)
            record["time_train"] += time.perf_counter() - t0
        history.append(record)
    last = history[-1]
    final = {"accuracy": last["accuracy"], "balanced_accuracy": last["balanced_accuracy"],
             "per_class_accuracy": last["per_class_accuracy"], "public_accuracy": last["public_accuracy"],
             "mean_client_accuracy": float(np.mean(last["client_accuracy"])), "rounds_completed": len(history),
             "stopped": None, "uwa_weights": details or None}
    import torchvision

    from . import __version__

    meta = {
        "config_key": cfg.key(), "fedlib_version": __version__, "torch": torch.__version__,
        "torchvision": torchvision.__version__, "python": platform.python_version(),
        "device": str(device) + ("" if device.type == "cuda" else
                                 f" ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"),
        "dataset_source": p.dataset.source, "wall_time": time.perf_counter() - t_start,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "client_sizes": np.asarray(part.sizes).tolist(), "client_class_counts": np.asarray(part.counts).tolist(),
        "model_parameters": layout.size, "public_size": n_pub, "validation_sizes": val_valid.sum(1).tolist(),
    }
    return RunResult(config=cfg.to_dict(), history=history, final=final, meta=meta)
