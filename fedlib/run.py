"""Runs: ``run(config) -> RunResult``, cached by the config's hash.

The engine owns the round loop (plan -> local -> server); methods supply only their
hooks (``fedlib.methods``). Local training of the selected clients is one call into the
vectorized population engine per round.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import math
import threading
import os
import warnings
import json
import platform
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from . import partition as partition_module
from .cache import ResultCache
from .config import ENGINE_VERSION, ConfigError, RunConfig, make_config
from .data import Dataset, load_dataset
from .methods import ClientData, ClientUpdates, Federation, RoundState, build_method
from .models import build_model
from .progress import report as report_progress
from .screening import screen_updates
from .population import (
    LocalTraining,
    ParamLayout,
    aggregate,
    evaluate,
    make_client_batches,
    train_clients,
    warm_up,
)

__all__ = ["RunResult", "run", "run_many", "prepare", "Prepared", "resolve_device", "SPLIT_MODIFIERS", "check_result",
           "result_check", "exit_with_parent"]


DEFAULT_SERVER_VAL = 1000


# ----------------------------------------------------------------------------- results


@dataclass
class RunResult:
    """Everything a run produced, as JSON-ready data."""

    config: dict[str, Any]
    history: list[dict[str, Any]]
    final: dict[str, Any]
    meta: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "history": self.history, "final": self.final, "meta": self.meta}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunResult":
        return cls(data["config"], data["history"], data["final"], data["meta"])

    def series(self, key: str) -> tuple[list[int], list[Any]]:
        """(rounds, values) of a per-round metric, skipping rounds without it."""
        rows = [(h["round"], h[key]) for h in self.history if h.get(key) is not None]
        return [r for r, _ in rows], [v for _, v in rows]

    def summary(self) -> str:
        """A small text table: round, accuracy, balanced accuracy, seconds."""
        lines = [f"{'round':>5}  {'acc':>7}  {'bal.acc':>7}  {'train s':>7}  {'server s':>8}"]
        for h in self.history:
            if h.get("accuracy") is None:
                continue
            lines.append(
                f"{h['round'] + 1:>5}  {100 * h['accuracy']:>6.2f}%  {100 * h['balanced_accuracy']:>6.2f}%"
                f"  {h['time_train']:>7.2f}  {h['time_server']:>8.3f}"
            )
        f = self.final
        scores = ("no evaluated round" if f["accuracy"] is None else
                  f"accuracy {100 * f['accuracy']:.2f}%, balanced accuracy {100 * f['balanced_accuracy']:.2f}%")
        setup = [f"{label} {self.meta[k]:.1f} s" for k, label in (("time_load", "data and model"),
                                                                  ("warmup_s", "torch.func warm-up"))
                 if self.meta.get(k)]
        lines.append(f"final: {scores}, wall {self.meta['wall_time']:.1f} s on {self.meta['device']}"
                     + (f" (set-up before round 1, not in wall: {', '.join(setup)})" if setup else "")
                     + (f"\nstopped early: {f['stopped']}" if f.get("stopped") else ""))
        return "\n".join(lines)


# ----------------------------------------------------------------------------- set-up


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"config: device: {name!r} requested but CUDA is not available")
    return torch.device(name)


SPLIT_MODIFIERS = ("free_riders", "covariate_shift", "label_noise", "feature_noise", "noisy_clients",
                   "nan_updates", "huge_updates")
HOSTILE_ROLES = {"nan_updates": "nan_update", "huge_updates": "huge_update"}  # faults for robustness tests


def _mark_hostile(part, modifier: str, count: int):
    """Give ``count`` benign clients (the last ones) a hostile update role."""
    benign = [i for i, r in enumerate(part.roles) if r == "benign"]
    if count > len(benign):
        raise ValueError(f"{modifier}: must be <= the {len(benign)} benign clients (got {count})")
    for i in benign[len(benign) - count:]:
        part.roles[i] = HOSTILE_ROLES[modifier]
    return part


def _call_with_params(fn: Callable, spec_name: str, params: dict, **fixed):
    """Call a split function, rejecting parameters it does not take (one line)."""
    sig = inspect.signature(fn)
    allowed = [p for p in sig.parameters if p not in fixed and p not in ("labels", "x", "y")]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ConfigError(
            f"config: split {spec_name!r}: unknown parameter {unknown[0]!r}; allowed: "
            f"{', '.join(allowed + list(SPLIT_MODIFIERS))}"
        )
    kwargs = {k: v for k, v in fixed.items() if k in sig.parameters}
    return fn(**kwargs, **params)


SPLITS = ("iid", "dirichlet", "k_classes", "pls", "sls", "maverick", "maverick_iid", "celm_maverick",
          "celm_free_rider", "adversarial")


def make_partition(config: RunConfig, x: torch.Tensor, y: torch.Tensor) -> partition_module.Partition:
    """The configured split plus its modifiers (free-riders, covariate shift, noise)."""
    spec = config.split
    if spec.name not in SPLITS:
        raise ConfigError(f"config: split: unknown split {spec.name!r}; known: {', '.join(SPLITS)}")
    params = spec.params
    mods = {k: params.pop(k) for k in list(params) if k in SPLIT_MODIFIERS}
    labels = y.cpu().numpy()
    fn = getattr(partition_module, spec.name)
    try:
        part = _call_with_params(fn, spec.name, params, labels=labels, n_clients=config.n_clients,
                                 seed=config.seed, x=x, n_classes=int(y.max()) + 1)
        if mods.get("free_riders"):
            part = partition_module.free_rider(part, mods["free_riders"])
        for modifier in HOSTILE_ROLES:
            if mods.get(modifier):
                part = _mark_hostile(part, modifier, mods[modifier])
        clients = mods.get("noisy_clients")
        if mods.get("covariate_shift") is not None:
            part = partition_module.covariate_shift(*part.pool(x, y), part, sigma=mods["covariate_shift"],
                                                    seed=config.seed)
        if mods.get("label_noise"):
            part = partition_module.label_noise(*part.pool(x, y), part, rate=mods["label_noise"],
                                                seed=config.seed, clients=clients)
        if mods.get("feature_noise"):
            part = partition_module.feature_noise(*part.pool(x, y), part, std=mods["feature_noise"],
                                                  seed=config.seed, clients=clients)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"config: split {spec.name!r}: {str(err).splitlines()[0]}") from None
    if part.n_clients != config.n_clients:
        raise ConfigError(f"config: n_clients: split {spec.name!r} makes {part.n_clients} clients "
                          f"(got n_clients = {config.n_clients})")
    return part


@dataclass
class Prepared:
    """A config turned into tensors: data, split, model and method, ready to train."""

    config: RunConfig
    device: torch.device
    dataset: Dataset
    partition: partition_module.Partition
    x_pool: torch.Tensor
    y_pool: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    model: torch.nn.Module
    method: Any
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None


def _subsample(y: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    if fraction >= 1.0:
        return torch.arange(len(y))
    rng = np.random.default_rng(seed + 7919)
    keep = rng.permutation(len(y))[: max(1, int(round(fraction * len(y))))]
    return torch.from_numpy(np.sort(keep))


_MODEL_INIT_LOCK = threading.Lock()
_LOADED: dict[tuple, Dataset] = {}  # the last datasets loaded in this process (sweeps reuse them)


def _load(config: RunConfig) -> Dataset:
    # the files' fingerprint too: files changed on disk are read again, so tensors and key agree
    key = (config.dataset, config.data_root, os.environ.get("FEDLIB_DATA"), config.data_fingerprint().get("sha256"))
    if key not in _LOADED:
        if len(_LOADED) >= 2:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = load_dataset(config.dataset, root=config.data_root, device="cpu")
    return _LOADED[key]


def prepare(config: RunConfig | dict, dataset: Dataset | None = None) -> Prepared:
    config = make_config(config) if not isinstance(config, RunConfig) else config
    device = resolve_device(config.device)
    method = build_method(config.method.name, config.method.params)
    ds = dataset or _load(config)
    keep = _subsample(ds.y_train, config.fraction, config.seed)
    x, y = ds.x_train[keep], ds.y_train[keep]
    n_val = config.server_val or (DEFAULT_SERVER_VAL if method.needs_validation or config.reference_values else 0)
    if n_val >= len(y):
        raise ConfigError(f"config: server_val: must be < the {len(y)} training samples (got {n_val})")
    order = torch.from_numpy(np.random.default_rng(config.seed + 104729).permutation(len(y)))
    x_val, y_val = x[order[:n_val]].to(device), y[order[:n_val]].to(device)
    if n_val:
        x, y = x[order[n_val:]], y[order[n_val:]]
    if config.n_clients > len(y):
        raise ConfigError(f"config: n_clients: must be <= the {len(y)} training samples (got {config.n_clients})")
    part = make_partition(config, x, y)
    x_pool, y_pool = (t.to(device) for t in part.pool(x, y))
    n_test = config.test_samples or len(ds.y_test)
    with _MODEL_INIT_LOCK:  # the global RNG must not be shared with a concurrent run (threads)
        torch.manual_seed(config.seed)
        model = build_model(config.model, ds.input_shape, ds.num_classes).to(device)
    # a fixed random subset of the test set (files may be sorted by class), the same for every run
    test = torch.from_numpy(np.sort(np.random.default_rng(2**31 - 1).permutation(len(ds.y_test))[:n_test]))
    return Prepared(config, device, ds, part, x_pool, y_pool, ds.x_test[test].to(device),
                    ds.y_test[test].to(device), model, method, x_val if n_val else None,
                    y_val if n_val else None)


# ----------------------------------------------------------------------------- the loop


def _round_generator(seed: int, round_index: int, device) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed((seed * 1_000_003 + round_index * 7_919 + 1) % (2**63))
    return g


def _apply_roles(flat: torch.Tensor, clients: np.ndarray, roles: np.ndarray, global_flat: torch.Tensor,
                 generator: torch.Generator) -> torch.Tensor:
    """Behavioural roles: free-riders return the received model; random-update clients
    send the global model plus Gaussian noise with the global parameters' std; the fault
    roles send NaN (``nan_update``) or an update scaled by 1e6 (``huge_update``)."""
    selected_roles = roles[clients]

    def rows(role):
        return torch.from_numpy(selected_roles == role).to(flat.device)

    free, noisy = rows("free_rider"), rows("random_update")
    flat[rows("nan_update")] = float("nan")
    huge = rows("huge_update")
    if huge.any():
        flat[huge] = global_flat + 1e6 * (flat[huge] - global_flat)
    if free.any():
        flat[free] = global_flat
    if noisy.any():
        noise = torch.randn(int(noisy.sum()), flat.shape[1], generator=generator).to(flat.device)
        flat[noisy] = global_flat + noise * global_flat.std()
    return flat


def run(config: RunConfig | dict, *, cache: bool | ResultCache = True, progress: bool = True,
        dataset: Dataset | None = None, on_round: Callable[[dict], None] | None = None) -> RunResult:
    """Run (or fetch from the cache) one federated experiment.

    The cache key is ``config.key(fingerprint)``: the resolved config, the rule versions and the
    content fingerprint of the data (of ``dataset`` when given). A cached entry is returned only
    if its config, versions and data match the request and its numbers are valid
    (:func:`check_result`). ``on_round(record)`` is called after every round of a fresh run."""
    config = _as_config(config)
    store = cache if isinstance(cache, ResultCache) else (ResultCache() if cache else None)
    fingerprint = _fingerprint_of(config, dataset)
    if fingerprint.get("sha256") is None:  # files not there yet (a download may bring them): load first
        dataset = _load(config)
        fingerprint = _fingerprint_of(config, dataset)
    key = config.key(fingerprint)
    check = result_check(config, fingerprint)
    if store is not None and (hit := store.get(key, check)) is not None:
        report_progress("run", cached=True, wall=0.0)
        return RunResult.from_dict(hit)
    t_load = time.perf_counter()
    prepared = prepare(config, dataset)
    t_load = time.perf_counter() - t_load
    fresh = _execute(prepared, progress, on_round)
    fresh.meta["time_load"] = t_load  # data, split and model set-up; not in wall_time
    fresh.meta.update(_key_provenance(config, fingerprint, key))
    result = RunResult.from_dict(json.loads(json.dumps(fresh.to_dict(), allow_nan=False)))
    if store is not None:
        store.put(key, result.to_dict())
    report_progress("run", cached=False, wall=result.meta.get("wall_time", 0.0))
    return result


def _as_config(config) -> RunConfig:
    if isinstance(config, RunConfig):
        return config
    return make_config(config)  # a path, list, number, ... gives a one-line ConfigError


def _fingerprint_of(config: RunConfig, dataset: Dataset | None) -> dict:
    """The data fingerprint: of the given Dataset (its files', else its tensors'), else of the files
    the config reads."""
    if dataset is None:
        return config.data_fingerprint()
    if dataset.fingerprint is None:
        from .data import tensor_fingerprint

        dataset.fingerprint = tensor_fingerprint(dataset)
    return dataset.fingerprint


def _key_provenance(config: RunConfig, fingerprint: dict, key: str) -> dict[str, Any]:
    """What produced a result: the key, the resolved hyper-parameters, the rule versions and the data."""
    return {"config_key": key, "config_key_without_data": config.config_key(), "resolved": config.resolved(),
            "rule_versions": config.rule_versions(),
            "data": {k: fingerprint.get(k) for k in ("source", "files", "sha256")}}


def result_check(config: RunConfig, fingerprint: dict) -> Callable[[dict], str | None]:
    """A check for ``ResultCache.get``: None when a stored run payload answers ``config`` on the data
    ``fingerprint`` describes (same resolved config, rule versions and data; a valid result),
    else what is wrong."""

    def check(payload: dict) -> str | None:
        problem = check_result(payload)
        if problem:
            return problem
        meta = payload["meta"]
        if meta.get("resolved") != config.resolved():
            return "its config is not the requested one"
        if meta.get("rule_versions") != config.rule_versions():
            return f"computed with rule versions {meta.get('rule_versions')}, now {config.rule_versions()}"
        if (meta.get("data") or {}).get("sha256") != fingerprint.get("sha256"):
            return "computed on other data"
        return None

    return check


def _score(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value) and 0.0 <= value <= 1.0)


def check_result(payload: Any) -> str | None:
    """None when ``payload`` has the schema of ``RunResult.to_dict()`` with valid values (scores
    null or finite in [0, 1]), else the first problem found."""
    if not isinstance(payload, dict) or not all(isinstance(payload.get(k), t) for k, t in
                                                (("config", dict), ("history", list), ("final", dict),
                                                 ("meta", dict))):
        return "not a run result (needs config, history, final, meta)"
    final = payload["final"]
    for name in ("accuracy", "balanced_accuracy", "f1"):
        if not _score(final.get(name)):
            return f"final.{name} is not a score in [0, 1] (got {str(final.get(name))[:40]})"
    per_class = final.get("per_class_accuracy", [])
    if not isinstance(per_class, list) or not all(_score(v) for v in per_class):
        return "final.per_class_accuracy is not a list of scores"
    rounds = final.get("rounds_completed")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds != len(payload["history"]):
        return "final.rounds_completed does not match the history"
    for record in payload["history"]:
        if not isinstance(record, dict) or not isinstance(record.get("round"), int):
            return "a history record has no round"
        if not all(_score(record.get(k)) for k in ("accuracy", "balanced_accuracy")):
            return f"round {record['round']}: accuracy is not a score in [0, 1]"
    return None


def _strict(record: dict[str, Any]) -> dict[str, Any]:
    """Non-finite floats become null; their places are listed in ``record["non_finite"]`` (strict JSON)."""
    found: list[str] = []

    def clean(value, where):
        if isinstance(value, float) and not math.isfinite(value):
            found.append(where)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{where}.{k}" if where else k) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    out = clean(record, "")
    if found:
        out["non_finite"] = found[:20] + ([f"... {len(found) - 20} more"] if len(found) > 20 else [])
    return out


def _execute(p: Prepared, progress: bool, on_round: Callable[[dict], None] | None = None) -> RunResult:
    cfg, model, method, part = p.config, p.model, p.method, p.partition
    warmup = warm_up(model, p.x_pool, p.y_pool)  # one-time torch.func costs, kept out of round 1
    t_start = time.perf_counter()
    layout = ParamLayout(model)
    global_flat = layout.flat_of(model)
    global_buffers = layout.buffers_of(model)
    sizes = np.asarray(part.sizes)
    roles = np.asarray(part.roles)
    n_classes = p.dataset.num_classes
    method.setup(Federation(model=model, n_clients=part.n_clients, n_classes=n_classes, rounds=cfg.rounds,
                            clients_per_round=cfg.per_round, client_sizes=sizes, device=p.device,
                            x_val=p.x_val, y_val=p.y_val, input_shape=tuple(p.dataset.input_shape),
                            client_data=lambda c: ClientData(p.x_pool, p.y_pool, [part.indices[i] for i in c],
                                                             torch.Generator().manual_seed(cfg.seed))))
    client_state = method.init_client_state(method.fed, global_flat, global_buffers)
    rng = np.random.default_rng(cfg.seed)
    history: list[dict[str, Any]] = []
    stopped = None
    rounds = range(cfg.rounds)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(rounds, desc=f"{cfg.method.name} on {cfg.dataset}", leave=False)
        rounds = bar
    last_eval = None
    reference = None
    suspect_log: list[tuple[int, list[int]]] = []  # (round, clients): outsized updates screening could not clip
    for t in rounds:
        t_round = time.perf_counter()
        lr = cfg.lr_at(t)
        state = RoundState(round=t, rng=rng, global_flat=global_flat, global_buffers=global_buffers, lr=lr,
                           client_state=client_state)
        # 1. plan
        selected = np.asarray(method.select_clients(state), dtype=np.int64)
        base = LocalTraining(epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=lr, momentum=cfg.momentum,
                             weight_decay=cfg.weight_decay, chunk_size=cfg.client_chunk)
        local = method.local_training(state, base, selected)
        # 2. local training of all selected clients at once
        t0 = time.perf_counter()
        gen = _round_generator(cfg.seed, t, p.device)
        batches = make_client_batches([part.indices[c] for c in selected], cfg.batch_size, cfg.local_epochs, gen)
        batches.index, batches.mask = batches.index.to(p.device), batches.mask.to(p.device)
        start = method.start_models(state, selected)
        start_buffers = {k: v.unsqueeze(0) for k, v in global_buffers.items()}
        if start is None and client_state is not None and client_state.flat is not None:
            rows = torch.as_tensor(selected, dtype=torch.long, device=client_state.flat.device)
            start = client_state.flat[rows]
            start_buffers = {k: v[rows] for k, v in client_state.buffers.items()} or start_buffers
        flat, bufs = train_clients(model, global_flat if start is None else start, start_buffers,
                                   p.x_pool, p.y_pool, batches, local)
        uploads = method.client_uploads(state, selected, flat, bufs,
                                        ClientData(p.x_pool, p.y_pool, [part.indices[c] for c in selected], gen))
        flat = _apply_roles(flat, selected, roles, global_flat, gen)
        t_train = time.perf_counter() - t0
        # 3. server
        t0 = time.perf_counter()
        screened = screen_updates(selected, flat, bufs, global_flat, clip_factor=cfg.update_clip)
        updates = ClientUpdates(clients=selected[screened.keep], flat=screened.flat,
                                sizes=sizes[selected[screened.keep]], buffers=screened.buffers,
                                extras={k: v[torch.as_tensor(screened.keep, device=v.device)]
                                        for k, v in (uploads or {}).items()},
                                start=None if start is None or start.dim() == 1 else
                                start[torch.as_tensor(screened.keep, device=start.device)])
        if screened.suspects:
            suspect_log.append((t, screened.suspects))
        if len(updates.clients) == 0:
            stopped = _stop_message(t, lr, screened, True, suspect_log)
            break
        state.updates = updates
        weights = method.aggregate(state, updates).to(flat.device, flat.dtype)
        keep_global = not bool(weights.any())  # all-zero weights: the round keeps the global model
        new_flat, new_buffers = aggregate(updates.flat, weights, updates.buffers)
        global_flat, global_buffers = method.server_update(state, weights, new_flat, new_buffers)
        if keep_global:
            global_flat, global_buffers = state.global_flat, state.global_buffers
        if client_state is not None:
            client_state = method.update_client_state(state, weights, global_flat, global_buffers)
        t_server = time.perf_counter() - t0
        if cfg.reference_values and t == cfg.rounds - 1:
            reference = reference_values(p, state, updates)
        # cos(w_k, w_g): the contribution rule for methods without scores of their own (FLCE §4.1.3)
        similarity = torch.nn.functional.cosine_similarity(updates.flat, global_flat.unsqueeze(0), dim=1)
        record: dict[str, Any] = {
            "round": t, "lr": lr, "selected": selected.tolist(), "dropped": screened.dropped,
            "clipped": screened.clipped,
            "aggregated": updates.clients.tolist(), "weights": weights.cpu().tolist(),
            "time_train": t_train, "time_server": t_server, "similarity": similarity.cpu().tolist(),
        }
        scores = method.scores()
        if scores is not None:
            record["scores"] = np.asarray(scores, dtype=float).tolist()
        extras = method.diagnostics()
        if extras:
            record["diagnostics"] = extras
        if screened.notes:
            record["screening"] = screened.notes
        if not torch.isfinite(global_flat).all():
            history.append(_strict(record))
            stopped = _stop_message(t, lr, screened, False, suspect_log)
            break
        if (t + 1) % cfg.eval_every == 0 or t == cfg.rounds - 1:
            t0 = time.perf_counter()
            ev = evaluate(model, global_flat.unsqueeze(0), {k: v.unsqueeze(0) for k, v in global_buffers.items()},
                          p.x_test, p.y_test, n_classes)
            last_eval = ev
            record.update(accuracy=float(ev.accuracy[0]), balanced_accuracy=float(ev.balanced_accuracy[0]),
                          f1=float(ev.macro_f1[0]),
                          per_class_accuracy=ev.per_class_accuracy[0].cpu().tolist(), loss=float(ev.loss[0]),
                          time_eval=time.perf_counter() - t0)
            if bar is not None:
                bar.set_postfix(acc=f"{100 * record['accuracy']:.1f}%")
        record["time_round"] = time.perf_counter() - t_round  # all of the round, bookkeeping included
        record = _strict(record)
        history.append(record)
        if on_round is not None:
            on_round(record)
    if bar is not None:
        bar.close()
    if stopped:
        warnings.warn(f"{cfg.method.name} on {cfg.dataset}: {stopped}", RuntimeWarning, stacklevel=3)
    final: dict[str, Any] = {"rounds_completed": len(history), "stopped": stopped}
    if last_eval is not None:
        final.update(accuracy=float(last_eval.accuracy[0]), balanced_accuracy=float(last_eval.balanced_accuracy[0]),
                     f1=float(last_eval.macro_f1[0]),
                     per_class_accuracy=last_eval.per_class_accuracy[0].cpu().tolist())
    else:
        final.update(accuracy=None, balanced_accuracy=None, per_class_accuracy=[])
    if reference is not None:
        final["reference"] = reference
    meta = _provenance(p, time.perf_counter() - t_start)
    meta["warmup_s"] = warmup
    return RunResult(config=cfg.to_dict(), history=history, final=_strict(final), meta=meta)


def _stop_message(t: int, lr: float, screened, everything_dropped: bool,
                  suspect_log: list[tuple[int, list[int]]]) -> str:
    """Why training stopped. Outsized updates the screening could not clip (fewer than 3 updates)
    are named as the likely cause; the lr is suggested only when no update looked poisoned."""
    kept = f"the history of the {t} earlier round(s) is kept"
    dropped = [d["client"] for d in screened.dropped][:10]
    what = (f"every update was dropped as non-finite or malformed (clients {dropped})"
            if everything_dropped else "the global model became non-finite")
    if suspect_log:
        where = ", ".join(f"round {r + 1}: client(s) {c[:10]}" for r, c in suspect_log[:5])
        return (f"round {t + 1}: {what} after unclipped updates far larger than the others' ({where}; clipping "
                f"needs >= 3 updates per round); a faulty or poisoned update, not the learning rate, is the likely "
                f"cause; {kept}. Exclude those clients or take part with more clients per round.")
    if everything_dropped:
        return (f"round {t + 1}: {what}, so the round has nothing to aggregate; {kept}. If these clients are faulty "
                f"or hostile, exclude them; if their local training diverged, try a smaller lr (now {lr:g}).")
    return f"round {t + 1}: {what}, so training diverged; {kept}. Try a smaller lr (now {lr:g})."


def reference_values(p: Prepared, state: RoundState, updates: ClientUpdates) -> dict[str, Any]:
    """Exact Shapley and leave-one-out values of one round's aggregated clients (``RunConfig.reference_values``).

    The utility of a coalition Q is the validation accuracy of the sample-count average of its
    members' uploads (the empty coalition: the round's incoming global model), all 2^n coalitions
    evaluated in batches (``fedlib.methods.shapley``); not part of the round's server time."""
    from .methods.shapley import coalition_utility, exact_shapley, leave_one_out

    t0 = time.perf_counter()
    sizes = np.maximum(updates.sizes, 1)
    utility = coalition_utility(p.model, updates.flat, updates.buffers, torch.as_tensor(sizes, dtype=torch.float32),
                                p.x_val, p.y_val, p.dataset.num_classes, state.global_flat, state.global_buffers,
                                classwise=False)
    n = len(updates.clients)
    shapley, loo = exact_shapley(utility, n), leave_one_out(utility, n)
    ends = utility(torch.stack([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)]))
    return {"clients": updates.clients.tolist(), "shapley": shapley.tolist(), "loo": loo.tolist(),
            "sizes": np.asarray(updates.sizes).tolist(), "utility_empty": float(ends[0]),
            "utility_all": float(ends[1]), "coalitions": utility.evaluations,
            "time": time.perf_counter() - t0}


def _provenance(p: Prepared, wall: float) -> dict[str, Any]:
    import torchvision

    from . import __version__

    device = str(p.device)
    if p.device.type == "cuda":
        device += f" ({torch.cuda.get_device_name(p.device)})"
    else:
        device += f" ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {
        "config_key": p.config.key(), "fedlib_version": __version__, "torch": torch.__version__,
        "torchvision": torchvision.__version__, "numpy": np.__version__, "python": platform.python_version(),
        "device": device, "dataset_source": p.dataset.source, "engine_version": ENGINE_VERSION, "wall_time": wall,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "client_sizes": np.asarray(p.partition.sizes).tolist(), "client_roles": list(p.partition.roles),
        "client_class_counts": np.asarray(p.partition.counts).tolist(),
    }


def run_many(configs, *, executor=None, cache: bool | ResultCache = True, progress: bool = True) -> list[RunResult]:
    """Run several configs, sequentially or through any ``concurrent.futures``-style
    executor (a process pool, a Dask ``Client``, ...).

    Finished results are read from this process's cache and never resubmitted, and every
    result a worker sends back is written to this process's cache as soon as it arrives,
    so an interrupted sweep resumes where it stopped, even when the workers run on other
    machines with their own disks. For a local process pool use the "spawn" start method
    (``mp_context=multiprocessing.get_context("spawn")``): forked children of a process whose
    OpenMP threads have run can hang. Across machines, pass a Dask ``distributed.Client``:
    its workers need fedlib installed and the data root, and send results back here."""
    if isinstance(configs, (str, bytes, dict, RunConfig)) or not hasattr(configs, "__iter__"):
        raise ConfigError(f"run_many: expected a list of configs, got {type(configs).__name__}")
    configs = [_as_config(c) for c in configs]
    store = cache if isinstance(cache, ResultCache) else (ResultCache() if cache else None)
    report_progress("batch", total=len(configs))  # to the book build's terminal, if it listens
    if executor is None:
        return [run(c, cache=store if store is not None else False, progress=progress) for c in configs]
    results: dict[int, RunResult] = {}
    pending = {}
    keys: dict[int, str] = {}
    for i, c in enumerate(configs):
        fingerprint = c.data_fingerprint()
        keys[i] = c.key(fingerprint)
        hit = store.get(keys[i], result_check(c, fingerprint)) if store is not None else None
        if hit is not None:
            results[i] = RunResult.from_dict(hit)
            report_progress("run", cached=True, wall=0.0)
        else:
            pending[i] = executor.submit(_run_in_worker, c.to_dict())
    bar = _progress_bar(len(pending), progress)
    while pending:  # take results as they finish, in any order: each is cached at once
        done = [i for i, future in pending.items() if future.done()]
        if not done:
            time.sleep(0.05)
            continue
        for i in done:
            payload = pending.pop(i).result()  # a worker's exception is raised here
            if store is not None:  # under the key of the data the worker read (its own files)
                store.put(payload["meta"].get("config_key", keys[i]), payload)
            results[i] = RunResult.from_dict(payload)
            bar.update(1)
    bar.close()
    return [results[i] for i in range(len(configs))]


def _progress_bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="sweep", unit="run", disable=not enabled or total == 0)


def _run_in_worker(config: dict) -> dict:
    """Executed by a worker: one uncached run, returned as JSON-ready data. The worker exits
    when the process that started it dies (:func:`exit_with_parent`)."""
    exit_with_parent()
    return run(make_config(config), cache=False, progress=False).to_dict()


_WATCHDOG: list[int] = []  # the parent pid watched in this process


def exit_with_parent(poll_s: float = 1.0) -> None:
    """Make this (worker) process exit when its parent dies, even by ``kill -9``: a daemon thread
    polls the parent pid and calls ``os._exit`` once it changes (the orphan is re-parented).
    ``run_many`` calls it in every worker; pass it as ``initializer=exit_with_parent`` (from ``fedlib.run``)
    to a pool you create so that idle workers exit too. Idempotent; a no-op in the main process."""
    import multiprocessing

    if _WATCHDOG or multiprocessing.parent_process() is None:
        return
    parent = os.getppid()
    _WATCHDOG.append(parent)

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="fedlib-exit-with-parent", daemon=True).start()
