"""The federation set-up: a config turned into tensors (``prepare`` -> ``Prepared``): the data
(loaded once per process), the server's validation hold-out, the split
(``fedlib.partition.make_partition``), the test subset, the model and the method."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from .allocation import Partition, client_class_counts
from .config import DEFAULT_SERVER_VAL, ConfigError, RunConfig, make_config
from .data import Dataset, load_dataset
from .methods import build_method
from .models import build_model
from .partition import make_partition

__all__ = ["Prepared", "prepare", "given", "resolve_device", "DEFAULT_SERVER_VAL"]



def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"config: device: {name!r} requested but CUDA is not available")
    return torch.device(name)


@dataclass
class Prepared:
    """A config turned into tensors: data, split, model and method, ready to train."""

    config: RunConfig
    device: torch.device
    dataset: Dataset
    partition: Partition
    x_pool: torch.Tensor
    y_pool: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    model: torch.nn.Module
    method: Any
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    init: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None  # the starting global model (flat, buffers)
    keep_model: bool = False  # hand the final global model back (RunResult.model)


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
    n_val = config.validation_samples(method)
    from_test = config.validation_from == "test" and n_val > 0
    if from_test:  # the validation set comes from the test set (outside the evaluated part), not training
        x_val, y_val = validation_from_test(ds, config.test_samples, n_val, device)
        n_val = 0
    if n_val >= len(y):
        raise ConfigError(f"config: server_val: must be < the {len(y)} training samples (got {n_val})")
    order = torch.from_numpy(np.random.default_rng(config.seed + 104729).permutation(len(y)))
    if not from_test:
        x_val, y_val = x[order[:n_val]].to(device), y[order[:n_val]].to(device)
    if n_val:
        x, y = x[order[n_val:]], y[order[n_val:]]
    if config.n_clients > len(y):
        raise ConfigError(f"config: n_clients: must be <= the {len(y)} training samples (got {config.n_clients})")
    part = make_partition(config.split, config.n_clients, config.seed, x, y)
    if part.x is None and part.y is None:
        # the pool is the dataset's training tensor itself, shared by every run on this device (packed runs
        # train from one copy); client indices point at its rows (same samples, same order: same numbers)
        rows = (keep[order[n_val:]] if n_val else keep).numpy()
        sizes = np.fromiter(map(len, part.indices), dtype=np.int64, count=part.n_clients)
        flat = rows[np.concatenate(part.indices).astype(np.int64)] if part.n_clients else np.zeros(0, np.int64)
        part = replace(part, indices=np.split(flat, np.cumsum(sizes)[:-1]))
        x_pool, y_pool = on_device(ds.x_train, device), on_device(ds.y_train, device)
    else:  # the split made its own pool (label noise, covariate shift)
        x_pool, y_pool = (t.to(device) for t in part.pool(x, y))
    n_test = config.test_samples or len(ds.y_test)
    with _MODEL_INIT_LOCK:  # the global RNG must not be shared with a concurrent run (threads)
        torch.manual_seed(config.seed)
        model = method.adapt_model(build_model(config.model, ds.input_shape, ds.num_classes)).to(device)
    x_test, y_test = test_subset(ds, n_test, device)
    has_val = bool(n_val) or from_test
    return Prepared(config, device, ds, part, x_pool, y_pool, x_test, y_test, model, method,
                    x_val if has_val else None, y_val if has_val else None)


_ON_DEVICE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (id, device, what) -> (source, copy)
_ON_DEVICE_KEEP = 6


def on_device(tensor: torch.Tensor, device: torch.device, what: Any = None) -> torch.Tensor:
    """One copy of a dataset tensor (or of ``tensor[what]``) per device, shared by the runs of this process."""
    key = (id(tensor), str(device), what)
    with _MODEL_INIT_LOCK:
        hit = _ON_DEVICE.get(key)
        if hit is not None and hit[0] is tensor:  # the same source object, not a new one at a reused address
            return hit[1]
        copy = (tensor if what is None else tensor[torch.as_tensor(what)]).to(device)
        _ON_DEVICE[key] = (tensor, copy)
        while len(_ON_DEVICE) > _ON_DEVICE_KEEP:
            _ON_DEVICE.pop(next(iter(_ON_DEVICE)))
        return copy


TEST_ORDER_SEED = 2**31 - 1  # the one fixed order of the test set: its evaluated part first, then validation


def test_subset(ds: Dataset, n_test: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random subset of the test set (files may be sorted by class), the same for every run,
    one copy per device (runs that share it are evaluated together when packed)."""
    test = tuple(np.sort(np.random.default_rng(TEST_ORDER_SEED).permutation(len(ds.y_test))[:n_test]).tolist())
    if n_test >= len(ds.y_test):
        return on_device(ds.x_test, device), on_device(ds.y_test, device)
    return on_device(ds.x_test, device, test), on_device(ds.y_test, device, test)


def validation_from_test(ds: Dataset, n_test: int, n_val: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's validation set taken from the test set (``validation_from: test``): the ``n_val`` test
    samples that follow the evaluated ``n_test`` in the test set's fixed order, so the two never overlap
    and every run (every seed) validates on the same samples."""
    total = len(ds.y_test)
    if n_test + n_val > total:
        raise ConfigError(f"config: validation_from: test_samples + server_val must be <= the {total} test samples "
                          f"(got {n_test} + {n_val})")
    rows = np.sort(np.random.default_rng(TEST_ORDER_SEED).permutation(total)[n_test:n_test + n_val])
    rows = torch.from_numpy(rows)
    return ds.x_test[rows].to(device), ds.y_test[rows].to(device)


def given(config: RunConfig, dataset: Dataset, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
          indices: list, x_test: torch.Tensor, y_test: torch.Tensor,
          init: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None, keep_model: bool = False) -> Prepared:
    """A federation built elsewhere (its clients' ``indices`` into ``x, y``, its own test set, a model
    and its starting weights ``init``) made ready for the engine: ``engine.execute(given(...))`` runs
    ``config``'s rounds, method and local training on it, e.g. FedSCM's training of a selected cohort
    (``fedlib.scm_pipeline``). ``config.n_clients`` must equal ``len(indices)``; its split and dataset
    fields only describe the run."""
    if config.n_clients != len(indices):
        raise ConfigError(f"config: n_clients: must equal the {len(indices)} given clients (got {config.n_clients})")
    device = resolve_device(config.device)
    indices = [np.asarray(i, dtype=np.int64) for i in indices]
    counts = client_class_counts(indices, y.cpu().numpy(), dataset.num_classes)
    part = Partition(indices, counts, ["benign"] * len(indices))
    method = build_method(config.method.name, config.method.params)
    return Prepared(config, device, dataset, part, x.to(device), y.to(device), x_test.to(device), y_test.to(device),
                    model.to(device), method, init=init, keep_model=keep_model)
