"""Runs: ``run(config) -> RunResult``, cached by the config's hash; ``run_many`` for sweeps.

The front door over three layers: the federation set-up (``fedlib.federation.prepare``), the
engine's round loop (``fedlib.engine.execute``) and the results layer (``fedlib.results``:
``RunResult``, its checks and provenance). Their names stay importable from here.

``run`` takes both config kinds: a ``RunConfig`` (a federated run of the engine) and an ``ScmConfig``
(FedSCM's one-shot experiment, ``fedlib.scm_pipeline.run_pipeline``); a mapping is read as an
``ScmConfig`` when it names FedSCM's ``gammas`` or ``post_rounds`` (every ``ScmConfig.to_dict()`` does). Both return
the same record, a ``RunResult``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from typing import Callable

from .cache import ResultCache, as_store
from .config import ConfigError, RunConfig, ScmConfig, make_config
from .data import Dataset
from .engine import _execute, _round_generator, _stop_message, execute  # noqa: F401
from .events import report as report_progress
from .federation import (  # noqa: F401
    DEFAULT_SERVER_VAL,
    Prepared,
    _load,
    _subsample,
    prepare,
    resolve_device,
)
from .packing import execute_packed, make_packs, rows_per_pack
from .partition import SPLIT_MODIFIERS, SPLITS, make_partition  # noqa: F401
from .results import (  # noqa: F401
    RunResult,
    _fingerprint_of,
    _key_provenance,
    check_result,
    result_check,
)
from .scm_pipeline import run_pipeline, run_pipelines
from .store import entry_check, run_of, stored_payload  # noqa: F401

__all__ = ["RunResult", "run", "run_many", "run_pack", "prepare", "Prepared", "resolve_device", "SPLIT_MODIFIERS", "check_result",
           "result_check", "exit_with_parent"]


def run(config: RunConfig | ScmConfig | dict, *, cache: bool | ResultCache = True, progress: bool = True,
        dataset: Dataset | None = None, on_round: Callable[[dict], None] | None = None) -> RunResult:
    """Run (or fetch from the cache) one federated experiment.

    The cache key is ``config.key(fingerprint)``: the resolved config, the rule versions and the
    content fingerprint of the data (of ``dataset`` when given). A cached entry is returned only
    if its config, versions and data match the request and its numbers are valid
    (:func:`check_result`). ``on_round(record)`` is called after every round of a fresh run.
    A finished run is returned even when the cache cannot be written (one ``CacheWriteWarning``).
    An ``ScmConfig`` is FedSCM's experiment: ``fedlib.scm_pipeline.run_pipeline``'s record, cached
    as that caches it (it has no rounds: ``on_round`` is refused)."""
    config = _as_config(config)
    store = as_store(cache)  # True, False or a ResultCache; anything else is a one-line ConfigError
    if isinstance(config, ScmConfig):
        if on_round is not None:
            raise ConfigError("run: on_round is for federated rounds; a FedSCM experiment (ScmConfig) has none")
        return run_pipeline(config, cache=store if store is not None else False, dataset=dataset, progress=progress)
    fingerprint = _fingerprint_of(config, dataset)
    if fingerprint.get("sha256") is None:  # files not there yet (a download may bring them): load first
        dataset = _load(config)
        fingerprint = _fingerprint_of(config, dataset)
    key = config.key(fingerprint)
    if store is not None and (hit := store.get(key, entry_check(config, fingerprint))) is not None:
        report_progress("run", cached=True, wall=0.0)
        return RunResult.from_dict(run_of(hit))
    t_load = time.perf_counter()
    prepared = prepare(config, dataset)
    t_load = time.perf_counter() - t_load
    fresh = _execute(prepared, progress, on_round)
    fresh.meta["time_load"] = t_load  # data, split and model set-up; not in wall_time
    fresh.meta.update(_key_provenance(config, fingerprint, key))
    result = RunResult.from_dict(json.loads(json.dumps(fresh.to_dict(), allow_nan=False)))
    if store is not None:  # the same JSON as a stored copy under results/runs/
        store.keep(key, stored_payload(config.to_dict(), result.to_dict()))  # never loses the run
    report_progress("run", cached=False, wall=result.meta.get("wall_time", 0.0))
    return result


# a mapping that names FedSCM's selection or its post-training is an ScmConfig's (as fedlib.app.kit.items.work
# reads one); other keys only FedSCM has (alpha, methods, ...) are too near a run's to decide
SCM_KEYS = ("gammas", "post_rounds")


def _as_config(config) -> RunConfig | ScmConfig:
    if isinstance(config, (RunConfig, ScmConfig)):
        return config
    if config is None:  # not the 20-round default protocol by accident: the defaults are asked for explicitly
        raise ConfigError("run: config is None; pass a RunConfig or a mapping of config keys (e.g. "
                          "fedlib.make_config(dataset='synthetic', rounds=1); make_config() gives the defaults)")
    if isinstance(config, dict) and any(k in config for k in SCM_KEYS):
        return ScmConfig.make(config)
    return make_config(config)  # a path, list, number, ... gives a one-line ConfigError


def run_many(configs, *, executor=None, cache: bool | ResultCache = True, progress: bool = True,
             pack: bool = False, max_rows: int | None = None) -> list[RunResult]:
    """Run several configs, sequentially or through any ``concurrent.futures``-style
    executor (a process pool, a Dask ``Client``, ...).

    ``pack=True`` trains runs that share data, model, batch size, local epochs and rounds as one
    population (``fedlib.packing``: each run keeps its own split, seed streams, method and history;
    at most ``max_rows`` client rows per round in a pack, default: what the device's memory holds).
    With an executor, a pack is the unit of work a worker receives.

    Finished results are read from this process's cache and never resubmitted, and every
    result a worker sends back is written to this process's cache as soon as it arrives,
    so an interrupted sweep resumes where it stopped, even when the workers run on other
    machines with their own disks. For a local process pool use the "spawn" start method
    (``mp_context=multiprocessing.get_context("spawn")``): forked children of a process whose
    OpenMP threads have run can hang. Across machines, pass a Dask ``distributed.Client``:
    its workers need fedlib installed and the data root, and send results back here.

    FedSCM configs (``ScmConfig``) run one after another (no executor), or, all of them FedSCM's and
    ``pack=True``, together by ``fedlib.scm_pipeline.run_pipelines``."""
    if isinstance(configs, (str, bytes, dict, RunConfig, ScmConfig)) or not hasattr(configs, "__iter__"):
        raise ConfigError(f"run_many: expected a list of configs, got {type(configs).__name__}")
    configs = [_as_config(c) for c in configs]
    store = as_store(cache)  # True, False or a ResultCache; anything else is a one-line ConfigError
    fedscm = sum(isinstance(c, ScmConfig) for c in configs)
    if fedscm and (executor is not None or (pack and fedscm < len(configs))):
        raise ConfigError("run_many: FedSCM configs (ScmConfig) take no executor and pack only among themselves "
                          "(pack=True runs them by fedlib.scm_pipeline.run_pipelines)")
    report_progress("batch", total=len(configs))  # to the book build's terminal, if it listens
    if fedscm and pack:
        return run_pipelines(configs, cache=store if store is not None else False, progress=progress)
    if pack:
        return _run_packed(configs, store, executor, progress, max_rows)
    if executor is None:
        return [run(c, cache=store if store is not None else False, progress=progress) for c in configs]
    results, keys, missing = _from_cache(configs, store)
    pending = {i: executor.submit(_run_in_worker, configs[i].to_dict()) for i in missing}
    # lazy: tqdm.auto loads ipywidgets in a notebook; only progress bars need it
    from tqdm.auto import tqdm

    bar = tqdm(total=len(pending), desc="sweep", unit="run", disable=not progress or not pending)
    while pending:  # take results as they finish, in any order: each is cached at once
        done = [i for i, future in pending.items() if future.done()]
        if not done:
            time.sleep(0.05)
            continue
        for i in done:
            payload = pending.pop(i).result()  # a worker's exception is raised here
            if store is not None:  # under the key of the data the worker read (its own files)
                store.keep(payload["meta"].get("config_key", keys[i]), stored_payload(payload["config"], payload))
            results[i] = RunResult.from_dict(payload)
            bar.update(1)
    bar.close()
    return [results[i] for i in range(len(configs))]


def _from_cache(configs: list[RunConfig], store) -> tuple[dict[int, RunResult], dict[int, str], list[int]]:
    """The cached results of ``configs`` by index, every config's key, and the indices not cached."""
    results: dict[int, RunResult] = {}
    keys: dict[int, str] = {}
    missing: list[int] = []
    for i, c in enumerate(configs):
        fingerprint = c.data_fingerprint()
        keys[i] = c.key(fingerprint)
        hit = store.get(keys[i], entry_check(c, fingerprint)) if store is not None else None
        if hit is not None:
            results[i] = RunResult.from_dict(run_of(hit))
            report_progress("run", cached=True, wall=0.0)
        else:
            missing.append(i)
    return results, keys, missing


def _run_packed(configs: list[RunConfig], store, executor, progress: bool, max_rows: int | None) -> list[RunResult]:
    """``run_many(pack=True)``: cache hits first, the rest in packs (``fedlib.packing.make_packs``)."""
    results, _, missing = _from_cache(configs, store)
    packs = [[missing[j] for j in pack] for pack in make_packs([configs[i] for i in missing], max_rows)]

    def keep(i: int, payload: dict) -> None:
        if store is not None:  # never loses the run: a failed write is one warning
            store.keep(payload["meta"]["config_key"], stored_payload(payload["config"], payload))
        results[i] = RunResult.from_dict(payload)
        report_progress("run", cached=False, wall=payload["meta"].get("wall_time", 0.0))

    if executor is None:
        for pack in packs:
            run_pack([configs[i] for i in pack], progress=progress, max_rows=max_rows,
                     on_done=lambda j, payload, pack=pack: keep(pack[j], payload))
    else:
        futures = {executor.submit(_run_pack_in_worker, [configs[i].to_dict() for i in pack], max_rows): pack
                   for pack in packs}
        while futures:  # packs as they finish, in any order: each run is cached at once
            done = [f for f in futures if f.done()]
            if not done:
                time.sleep(0.05)
                continue
            for future in done:
                pack = futures.pop(future)
                for i, payload in zip(pack, future.result()):  # a worker's exception is raised here
                    keep(i, payload)
    return [results[i] for i in range(len(configs))]


def run_pack(configs: list[RunConfig], *, progress: bool = False, max_rows: int | None = None,
             on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Run ``configs`` (uncached) as packs of at most ``max_rows`` client rows per round (default: what
    the device's memory holds, ``fedlib.packing.rows_per_pack``); returns each run's JSON-ready result,
    keyed and with provenance as :func:`run` makes it. ``on_done(i, result)`` as each run finishes."""
    configs = [_as_config(c) for c in configs]
    if any(isinstance(c, ScmConfig) for c in configs):
        raise ConfigError("run_pack: FedSCM configs (ScmConfig) pack by fedlib.scm_pipeline.run_pipelines")
    out: list[dict | None] = [None] * len(configs)
    t_load = time.perf_counter()
    prepared, keys = [], []
    for c in configs:
        dataset = None
        fingerprint = _fingerprint_of(c, None)
        if fingerprint.get("sha256") is None:
            dataset = _load(c)
            fingerprint = _fingerprint_of(c, dataset)
        prepared.append(prepare(c, dataset))
        keys.append((fingerprint, c.key(fingerprint)))
    t_load = (time.perf_counter() - t_load) / max(1, len(configs))
    if max_rows is None and prepared:
        first = prepared[0]
        max_rows = rows_per_pack(first.model, first.dataset.input_shape, first.config.batch_size, first.device)
    for pack in make_packs(configs, max_rows):
        def finished(j: int, fresh: RunResult, pack=pack) -> None:
            i = pack[j]
            fingerprint, key = keys[i]
            fresh.meta["time_load"] = t_load  # data, split and model set-up (shared by the pack), not in wall_time
            fresh.meta.update(_key_provenance(configs[i], fingerprint, key))
            out[i] = json.loads(json.dumps(fresh.to_dict(), allow_nan=False))
            if on_done is not None:
                on_done(i, out[i])

        if len(pack) == 1:  # a pack of one is a run alone: the engine's own path, without the pack's machinery
            finished(0, _execute(prepared[pack[0]], progress, None))
        else:
            execute_packed([prepared[i] for i in pack], progress=progress, on_done=finished)
    return out  # type: ignore[return-value]


def _run_pack_in_worker(configs: list[dict], max_rows: int | None) -> list[dict]:
    """Executed by a worker: one pack, uncached, as JSON-ready data."""
    exit_with_parent()
    return run_pack([make_config(c) for c in configs], max_rows=max_rows)


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
    if _WATCHDOG or multiprocessing.parent_process() is None:
        return
    parent = os.getppid()
    _WATCHDOG.append(parent)

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="fedlib-exit-with-parent", daemon=True).start()
