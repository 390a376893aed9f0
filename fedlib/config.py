"""Validated experiment configuration.

A config is plain data (YAML or a dict) checked before anything is loaded or trained:
unknown keys, wrong types and out-of-range values raise :class:`ConfigError` with one
line that names the field and the allowed range. YAML is read with ``yaml.safe_load``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import partition  # the split kinds: their parameters, ranges and defaults
from .cache import read_regular
from .data import DATASETS, _check_known, data_fingerprint, dataset_spec
from .data_files import path_problem
from .errors import SHOWN_CHARS, ConfigError, clipped, shown  # noqa: F401 (part of this module's interface)
from .limits import (MAX_BATCH, MAX_CONFIG_BYTES, MAX_COUNT, MAX_DEPTH, MAX_EPOCHS, MAX_LIST,  # noqa: F401
                     MAX_RATE, MAX_SAMPLES, MAX_SEED, MAX_SPEC_VALUES, MAX_STRING, check_device)
from .methods import METHODS, build_method  # the registry lives with the methods
from .methods.scm import vertex_counts
from .models import MODELS

CACHE_FORMAT = 2  # the layout of the key; 2: resolved config + rule versions + data fingerprint
# The engine's rule version: local training, screening, aggregation and evaluation in
# ``fedlib.run``. Bump it (a string) with any change there that changes numbers; every key changes.
ENGINE_VERSION = "1"
DEFAULT_SERVER_VAL = 1000  # the server's validation samples when a method needs them and the config gives none



def _short_name(name: str) -> str:
    """A field name as an error shows it: cut to :data:`SHOWN_CHARS` characters (``fedlib.errors.clipped``)."""
    return clipped(name)


def _check_path(path: str, what: str, directory: bool = False) -> None:
    """A ValueError (one line) for a path that cannot be data: a NUL byte, under /dev, a loop of
    symbolic links, a FIFO or device (``fedlib.data_files.path_problem``, the one statement of these rules)."""
    problem = path_problem(path, directory=directory)
    if problem is not None:
        raise ValueError(f"{what} {clipped(path, 2 * SHOWN_CHARS)} {problem} (refused)")


def _is_numpy_bool(value: Any) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")


def _unsigned_zero(value: Any, depth: int = 0) -> Any:
    """-0.0 becomes 0.0 (inside lists and mappings too): the same number gives the same key.
    Past :data:`MAX_DEPTH` levels the value is left as it is (the depth check refuses it)."""
    if isinstance(value, float) and value == 0.0:
        return 0.0
    if depth > MAX_DEPTH:
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_unsigned_zero(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return {k: _unsigned_zero(v, depth + 1) for k, v in value.items()}
    return value


def _check_plain(value: Any, field: str, budget: list[int], depth: int = 0) -> None:
    """Spec values are plain data: finite numbers, short strings and lists, bounded in total
    (a shared or self-referencing structure cannot expand past the budget) and in depth."""
    field = _short_name(field)
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError(f"{field}: more than {MAX_SPEC_VALUES} values")
    if depth > MAX_DEPTH:
        raise ValueError(f"{field}: nested more than {MAX_DEPTH} levels deep")
    if _is_numpy_bool(value):
        raise ValueError(f"{field}: must be plain data (got a numpy boolean)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{field}: must be a finite number (got {value})")
    if isinstance(value, str) and len(value) > MAX_STRING:
        raise ValueError(f"{field}: string too long ({len(value)} characters; at most {MAX_STRING})")
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_LIST:
            raise ValueError(f"{field}: list too long ({len(value)} items; at most {MAX_LIST})")
        for item in value:
            _check_plain(item, field, budget, depth + 1)
    elif isinstance(value, dict):
        for k, item in value.items():
            _check_plain(item, f"{field}.{k}", budget, depth + 1)
    elif value is not None and not isinstance(value, (bool, int, float, str)):
        raise ValueError(f"{field}: must be plain data (got {type(value).__name__})")


class Spec(BaseModel):
    """``{name: ..., <param>: value, ...}`` — a split or a method with its parameters."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value):
        value = {"name": value} if isinstance(value, str) else value
        if isinstance(value, dict):
            budget = [MAX_SPEC_VALUES]
            for key, item in value.items():
                _check_plain(item, str(key), budget)
            value = _unsigned_zero(value)
        return value


_BOOL_FIELDS = {"reference_values"}


class ExperimentConfig(BaseModel):
    """What every experiment shares: the data, the model, the clients' local training, the seed and
    the placement, with one validation (limits, one-line errors), one key formula and one loader.
    :class:`RunConfig` is a federated run; :class:`ScmConfig` is FedSCM's one-shot experiment."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, str_max_length=MAX_STRING)

    dataset: str = "fmnist"
    data_root: str | None = None
    fraction: float = Field(1.0, gt=0, le=1, description="share of the training set used")
    model: str = "mlp"
    n_clients: int = Field(5, ge=1, le=MAX_COUNT)
    local_epochs: int = Field(1, ge=1, le=MAX_EPOCHS)
    batch_size: int = Field(128, ge=1, le=MAX_BATCH)
    lr: float = Field(0.1, gt=0, le=MAX_RATE)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0, le=MAX_RATE)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    device: str = "cpu"
    client_chunk: int | None = Field(None, ge=1, le=MAX_COUNT, description="clients trained together (memory)")

    @field_validator("*", mode="before")
    @classmethod
    def _plain_values(cls, v, info):
        if _is_numpy_bool(v) or (isinstance(v, (list, tuple)) and any(_is_numpy_bool(x) for x in v[:MAX_LIST + 1])):
            raise ValueError("numpy booleans are not accepted (use true/false or a number)")
        if isinstance(v, bool) and info.field_name not in _BOOL_FIELDS:
            raise ValueError("true/false is not a valid value here")
        if isinstance(v, (list, tuple)) and len(v) > MAX_LIST:
            raise ValueError(f"list too long ({len(v)} items; at most {MAX_LIST})")
        if isinstance(v, str) and len(v) > MAX_STRING:
            raise ValueError(f"string too long ({len(v)} characters; at most {MAX_STRING})")
        return _unsigned_zero(v)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v not in MODELS:
            raise ValueError(f"unknown model; known: {', '.join(MODELS)}")
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        if v != "synthetic":
            try:
                _check_known(v)
            except ValueError:
                raise ValueError(f"unknown dataset; known: {', '.join(DATASETS)}, or imagefolder:<path>") from None
            if v.startswith("imagefolder:"):
                _check_path(v[len("imagefolder:"):], "dataset: image folder")
        return v

    @field_validator("data_root")
    @classmethod
    def _data_root(cls, v: str | None) -> str | None:
        if v is not None:
            _check_path(v, "data_root:", directory=True)
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        return check_device(v)  # 'cpu', 'cuda', 'cuda:N' (a device of this machine when it has CUDA) or 'auto'

    # -- what produced a result: the resolved config, the rule versions, the data -----------
    def resolved(self) -> dict[str, Any]:
        """The config as it runs, without the data root (:meth:`data_fingerprint` names the data)."""
        return _plain(self.model_dump(mode="json", exclude={"data_root"}))

    def rule_versions(self) -> dict[str, str]:
        return {"engine": ENGINE_VERSION}

    def data_fingerprint(self) -> dict[str, Any]:
        """The files this config's dataset reads (``fedlib.data.data_fingerprint``), without loading them."""
        return data_fingerprint(self.dataset, self.data_root)

    def config_key(self) -> str:
        """Hash of the resolved config and the rule versions (not the data)."""
        return _hash({"config": self.resolved(), "rules": self.rule_versions(), "_format": CACHE_FORMAT})

    def key(self, fingerprint: dict[str, Any] | None = None) -> str:
        """The cache key: hash of the resolved config, the rule versions and the data's content
        fingerprint (``fingerprint``, default: that of the files the config would read now).
        Where the data, a default, a rule or an option that changes numbers differs, so does the key;
        the data root does not enter (the same files elsewhere give the same key)."""
        fingerprint = self.data_fingerprint() if fingerprint is None else fingerprint
        data = fingerprint.get("sha256") or {"missing": self.dataset}
        return _hash({"config": self.resolved(), "rules": self.rule_versions(), "data": data,
                      "_format": CACHE_FORMAT})

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def make(cls, data: dict[str, Any] | ExperimentConfig | None = None, source: str = "config", **overrides):
        """Validate a dict (plus keyword overrides) into this config, with one-line errors."""
        if isinstance(data, ExperimentConfig):
            data = data.to_dict()
        if data is not None and not isinstance(data, dict):
            hint = "; to run a YAML file, pass fedlib.load_config(path)" if isinstance(data, (str, Path)) else ""
            raise ConfigError(f"{source}: expected a {cls.__name__} or a mapping of config keys, got "
                              f"{type(data).__name__} {shown(data)}{hint}")
        merged = {**(data or {}), **overrides}
        bad_key = next((k for k in merged if not isinstance(k, str)), None)
        if bad_key is not None:
            raise ConfigError(f"{source}: config keys must be text (got {shown(bad_key)})")
        long_key = next((k for k in merged if len(k) > MAX_STRING), None)
        if long_key is not None:
            raise ConfigError(f"{source}: unknown key {shown(long_key)}")
        try:
            return cls(**merged)
        except ValidationError as err:
            raise _one_line(err, source, cls) from None
        except (ValueError, TypeError, OverflowError, RecursionError) as err:  # nested validators
            text = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(f"{source}: {text[:300]}") from None

    @classmethod
    def load(cls, path: str | Path, **overrides):
        """Read a YAML file (safe loading, no aliases, at most ``MAX_CONFIG_BYTES``) and validate it;
        ``overrides`` replace keys (a dict updates a split or method spec)."""
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"config file: expected a path, got {type(path).__name__} {shown(path)}")
        given = clipped(os.fspath(path), 2 * SHOWN_CHARS)  # as errors show it: short, printable, one line
        problem = path_problem(path)  # a NUL byte, under /dev, a loop of symbolic links, a FIFO or device
        if problem is not None:
            raise ConfigError(f"config file {given} {problem} (refused)")
        path = Path(path)
        try:
            if path.is_symlink():  # a link to a config file is fine (to a FIFO or device, not)
                path = Path(os.path.realpath(path))
            text = read_regular(path, MAX_CONFIG_BYTES).decode("utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{given}: no such config file") from None
        except UnicodeDecodeError as err:
            raise ConfigError(f"{given}: not UTF-8 text (byte {err.start})") from None
        except ValueError as err:  # a FIFO, device or directory; too large
            what = str(err).replace("too large", "config file too large")
            raise ConfigError(f"{given}: {what}") from None
        except OSError as err:
            raise ConfigError(f"{given}: cannot read ({err.strerror or type(err).__name__})") from None
        data = parse_yaml(text, given)
        if data is None:
            raise ConfigError(f"{given}: empty config file (write at least the keys you mean, e.g. 'dataset: fmnist')")
        if not isinstance(data, dict):
            raise ConfigError(f"{given}: expected a mapping of config keys, got {type(data).__name__}")
        for key, value in overrides.items():
            base = data.get(key)
            base = {"name": base} if isinstance(base, str) and key in ("split", "method") else base
            data[key] = {**base, **value} if isinstance(value, dict) and isinstance(base, dict) else value
        return cls.make(data, source=given)


class RunConfig(ExperimentConfig):
    """One federated run. Defaults: CELM's Fashion-MNIST protocol, FedAvg, 5 IID clients."""

    test_samples: int | None = Field(None, ge=1, le=MAX_SAMPLES,
                                     description="evaluate on a fixed random subset of n test samples")
    server_val: int | None = Field(None, ge=1, le=MAX_SAMPLES, description="training samples held out as the server's "
                                   "validation set (default 1000 for methods that need one)")
    validation_from: Literal["test"] | None = Field(None, description="'test': the server's validation set is "
                                                    "``server_val`` test samples outside the evaluated ``test_samples`` "
                                                    "(FedMS §5.1: 20 % of the test set); None: held out of training")
    split: Spec = Spec(name="iid")
    clients_per_round: int | None = Field(None, ge=1, le=MAX_COUNT, description="None = all clients")
    rounds: int = Field(20, ge=1, le=MAX_COUNT)
    lr_milestones: tuple[int, ...] = Field((), max_length=MAX_LIST, description="rounds after which lr *= lr_gamma")
    lr_gamma: float = Field(0.1, gt=0, le=1)
    method: Spec = Spec(name="fedavg")
    eval_every: int = Field(1, ge=1, le=MAX_COUNT)
    update_clip: float | None = Field(10.0, gt=1, description="clip updates farther than this many times the "
                                      "round's median distance from the global model (None: off)")
    augment: Literal["crop_flip"] | None = Field(None, description="local training's data augmentation: "
                                                 "'crop_flip' (random crop, zero padding 4, and horizontal flip)")
    reference_values: bool = Field(False, description="after the last round, exact Shapley and leave-one-out "
                                   "values of its clients on the server's validation set (final['reference'])")
    precision: Literal["float32", "bfloat16"] = Field("float32", description="local training's arithmetic: "
                                                      "'bfloat16' runs the clients' forward and backward under "
                                                      "bfloat16 autocast (parameters, optimiser step, BatchNorm "
                                                      "statistics, aggregation, valuation and evaluation stay "
                                                      "float32); in the key unless float32")

    @field_validator("lr_milestones", mode="before")
    @classmethod
    def _milestone_items(cls, v):
        if isinstance(v, (list, tuple)) and any(isinstance(m, bool) for m in v):
            raise ValueError("milestones must be rounds (numbers), not true/false")
        return v

    @field_validator("lr_milestones")
    @classmethod
    def _milestones(cls, v):
        if any(m < 1 or m > MAX_COUNT for m in v):
            raise ValueError(f"milestones must be rounds in [1, {MAX_COUNT}]")
        return tuple(sorted(v))

    @model_validator(mode="after")
    def _consistent(self):
        if self.clients_per_round is not None and self.clients_per_round > self.n_clients:
            raise ValueError(
                f"clients_per_round: must be <= n_clients = {self.n_clients} (got {self.clients_per_round})"
            )
        partition.check_split(self.split.name, self.split.params, self.n_clients)
        if self.validation_from == "test" and self.test_samples is None:
            raise ValueError("validation_from: 'test' needs test_samples (the evaluated part of the test set)")
        if self.reference_values and self.per_round > 16:
            raise ValueError(f"reference_values: exact Shapley needs <= 16 clients per round (got {self.per_round})")
        self._check_against_dataset()
        build_method(self.method.name, self.method.params).check_run(self.rounds, self.n_clients)
        return self

    def _check_against_dataset(self) -> None:
        spec = dataset_spec(self.dataset) if not self.dataset.startswith("imagefolder:") else None
        if spec is None:
            return
        _, n_classes = spec
        k = self.split.params.get("k")
        if isinstance(k, int) and k > n_classes:
            raise ValueError(f"split.k: must be <= the {n_classes} classes of {self.dataset} (got {k})")

    # -- derived -------------------------------------------------------------------------
    @property
    def per_round(self) -> int:
        return self.clients_per_round or self.n_clients

    def lr_at(self, round_index: int) -> float:
        """Step schedule: lr * gamma^(number of milestones passed) (round_index 0-based)."""
        passed = sum(round_index >= m for m in self.lr_milestones)
        return self.lr * self.lr_gamma**passed

    def resolved(self) -> dict[str, Any]:
        """The config as it runs: every method hyper-parameter and split parameter with its default
        filled in, and engine defaults that change numbers (``server_val``); no ``data_root``
        (the data is identified by :meth:`data_fingerprint`)."""
        data = self.model_dump(mode="json", exclude={"data_root"})
        method = build_method(self.method.name, self.method.params)
        data["method"] = {"name": self.method.name, **method.resolved_hyperparameters()}
        data["split"] = partition.resolved_split(self.split.name, self.split.params)
        for later in ("augment", "validation_from"):  # added later: unset leaves every earlier key as it was
            if data.get(later) is None:
                data.pop(later, None)
        if data.get("precision") == "float32":  # added later: the default leaves every earlier key as it was
            data.pop("precision")
        data["server_val"] = self.validation_samples(method)
        return _plain(data)

    def validation_samples(self, method=None) -> int:
        """The server's validation samples, held out of the training set: ``server_val``, else
        :data:`DEFAULT_SERVER_VAL` when the method needs a validation set (or ``reference_values``
        does), else none. The one statement of this rule (the run's preparation reads it here)."""
        if self.server_val is not None:
            return self.server_val
        if method is None:
            method = build_method(self.method.name, self.method.params)
        return DEFAULT_SERVER_VAL if method.needs_validation or self.reference_values else 0

    def rule_versions(self) -> dict[str, str]:
        """``{"engine": ENGINE_VERSION, <method>: its rule_version}``."""
        return {"engine": ENGINE_VERSION, self.method.name: str(METHODS[self.method.name].rule_version)}

    def work(self) -> float:
        """Training-sample passes of the run (the queue's cost model): every round's sampled clients' local
        epochs over their share of the data; a logit run adds its distillation epochs over the server's set."""
        n = train_samples(self.dataset) * self.fraction
        if self.method.name.startswith("logit_"):
            distill = self.method.params.get("distill_epochs", 1) * (self.server_val or 0) * self.n_clients
            return self.rounds * (self.local_epochs * n + distill)
        per_round = self.clients_per_round or self.n_clients
        return self.rounds * self.local_epochs * n * per_round / self.n_clients


# FedSCM's one-shot experiment (``fedlib.scm_pipeline``): its methods and its rule versions.
SCM_METHODS = ("fedscm", "random", "best_source", "source_free", "fedavg", "sdea", "k3da", "comda", "fmda_ot")
SCM_RULE_VERSION = "2"  # FedSCM selection: non-zero weights, Algorithm 1's projection (was: vertex rounding)
PIPELINE_FORMAT = 3  # bump when cached pipeline results become invalid (3: post-training on the engine)


class ScmConfig(ExperimentConfig):
    """One FedSCM federation and everything run on it (``fedlib.scm_pipeline.run_pipeline``): the
    clients' local training (the shared fields), the target draw, the selection, the post-training
    FedProx run and the baselines. Defaults: the paper's CIFAR-10 protocol (K = 500, VGG-11,
    α = 0.1, 1,000 post-selection rounds)."""

    dataset: str = "cifar10"
    model: str = "vgg11"
    n_clients: int = Field(500, ge=2, le=MAX_COUNT, description="K")
    local_epochs: int = Field(5, ge=1, le=MAX_EPOCHS, description="clients' local training before selection")
    batch_size: int = Field(64, ge=1, le=MAX_BATCH)
    lr: float = Field(0.05, gt=0, le=MAX_RATE)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(5e-4, ge=0, le=MAX_RATE)
    shift: Literal["label", "covariate"] = "label"
    alpha: float = Field(0.1, gt=0, description="Dirichlet concentration (label and quantity shift)")
    sigma: float = Field(0.05, ge=0, description="std of the affine covariate shift")
    min_size: int = Field(2, ge=1, le=MAX_SAMPLES, description="samples per client at least (Dirichlet repair)")
    server_samples: int = Field(1000, ge=1, le=MAX_SAMPLES, description="n: the server's unlabeled target samples")
    eval_samples: int = Field(2000, ge=1, le=MAX_SAMPLES, description="labelled target samples for evaluation")
    post_rounds: int = Field(1000, ge=0, le=MAX_COUNT, description="FedProx rounds after selection")
    post_epochs: int = Field(1, ge=1, le=MAX_EPOCHS)
    post_steps: int | None = Field(None, ge=1, le=MAX_COUNT, description="local SGD steps per round at most "
                                   "(None = whole epochs)")
    post_lr: float = Field(0.01, gt=0, le=MAX_RATE)
    prox_mu: float = Field(0.01, ge=0, le=MAX_RATE)
    gammas: tuple[float, ...] = (0.67, 0.8, 0.9)
    solver: Literal["pgd", "slsqp"] = "slsqp"
    projection: Literal["paper", "euclidean"] = Field("paper", description="PGD step (Algorithm 1's, or Euclidean)")
    rounding: Literal["none", "vertex"] = Field("none", description="'vertex': round the solver output first")
    temperatures: tuple[float, ...] = Field((), description="selection-only reruns at these prediction temperatures")
    adapt_steps: int = Field(20, ge=0, le=MAX_COUNT, description="server-side steps on pseudo-labels (K3DA, Co-MDA, "
                             "FMDA-OT)")
    vote_gate: float = Field(0.9, gt=0, lt=1, description="K3DA's knowledge-vote confidence gate")
    cf_permutations: int = Field(32, ge=1, le=MAX_COUNT, description="K3DA: permutations of the Monte-Carlo "
                                 "consensus focus")
    ot_reg: float = Field(0.05, gt=0, description="FMDA-OT: entropic regularisation (relative to the cost's max)")
    ot_samples: int = Field(100, ge=1, le=MAX_SAMPLES, description="FMDA-OT: source samples per client in the "
                            "transport")
    comda_clients: int = Field(3, ge=1, le=MAX_COUNT, description="Co-MDA: sources kept")
    kappa: float = Field(0.0, ge=0, description="size regulariser of the pipeline's selection (Def. 10)")
    methods: tuple[str, ...] = SCM_METHODS
    random_sizes: tuple[int, ...] = (3, 5, 10)
    sdea_clients: int = Field(3, ge=1, le=MAX_COUNT)
    fedavg_per_round: int | None = Field(None, ge=1, le=MAX_COUNT, description="FedAvg clients sampled per round "
                                         "(None = all K)")
    stability_runs: int = Field(0, ge=0, le=MAX_COUNT, description="repeated selections for Table 1 (0 = none)")
    stability_kappa: float = Field(1.0, ge=0, description="κ of FedSCM+SR in Table 1")
    stability_subsample: float = Field(0.8, gt=0, le=1, description="share of D each repeat sees")
    expertise_repeats: int = Field(3, ge=0, le=MAX_COUNT, description="Q draws for η̂ (0 = skip)")
    predict_chunk: int | None = Field(None, ge=1, le=MAX_COUNT, description="models evaluated together (memory)")

    @model_validator(mode="after")
    def _consistent(self):
        for g in self.gammas:
            if not 0 <= g < 1:
                raise ValueError(f"gammas: each must be in [0, 1) (got {g})")
            if vertex_counts(g)[2] > self.n_clients:
                raise ValueError(f"gammas: γ = {g} selects {vertex_counts(g)[2]} clients, more than "
                                 f"n_clients = {self.n_clients}")
        unknown = [m for m in self.methods if m not in SCM_METHODS]
        if unknown:
            raise ValueError(f"methods: unknown method {unknown[0]!r}; known: {', '.join(SCM_METHODS)}")
        too_many = [m for m in (*self.random_sizes, self.sdea_clients, self.comda_clients)
                    if not 1 <= m <= self.n_clients]
        if too_many:
            raise ValueError(f"random_sizes/sdea_clients/comda_clients: must be in [1, n_clients = {self.n_clients}] "
                             f"(got {too_many[0]})")
        if any(t <= 0 for t in self.temperatures):
            raise ValueError(f"temperatures: each must be > 0 (got {self.temperatures})")
        return self

    def resolved(self) -> dict[str, Any]:
        """As run, without the data root and ``predict_chunk`` (evaluation batching). ``client_chunk``
        enters when set: training clients in chunks changes the numbers in the last bits (batched
        kernels sum in another order; see book/how_fedlib_runs.md); unset, it is left out, as in the keys stored
        before it entered."""
        exclude = {"data_root", "predict_chunk"} | ({"client_chunk"} if self.client_chunk is None else set())
        return _plain(self.model_dump(mode="json", exclude=exclude))

    def rule_versions(self) -> dict[str, str]:
        return {"engine": ENGINE_VERSION, "fedscm": SCM_RULE_VERSION, "pipeline": str(PIPELINE_FORMAT)}

    def work(self) -> float:
        """Training-sample passes of the federation (the queue's cost model): the one-shot local training,
        then every post-training round's cohorts (:meth:`round_passes`)."""
        n = train_samples(self.dataset) * self.fraction
        return self.local_epochs * n + self.post_rounds * self.round_passes(n)

    def round_passes(self, n: float) -> float:
        """Sample passes of one post-training round: every cohort that trains after the selection, each
        client a K-th of the n samples (at most ``post_steps`` batches): FedSCM per γ (about
        ``SCM_SELECTED_GUESS`` clients each), Random, SDEA, FedAvg (``fedavg_per_round`` or all K), K3DA (all K
        and the target), FMDA-OT (``ot_samples`` per client)."""
        k = self.n_clients
        per_client = n / k * self.post_epochs
        if self.post_steps:
            per_client = min(per_client, self.post_steps * self.batch_size)
        methods, every = set(self.methods), self.fedavg_per_round or k
        clients = (("fedscm" in methods) * len(self.gammas) * SCM_SELECTED_GUESS
                   + ("random" in methods) * sum(self.random_sizes) + ("sdea" in methods) * self.sdea_clients
                   + ("fedavg" in methods) * every + ("k3da" in methods) * (k + 1))
        ot = ("fmda_ot" in methods) * every * min(self.ot_samples, per_client)
        return clients * per_client + ot


# training samples per dataset, for costing only (the queue's estimates; an unknown one counts as CIFAR-10's)
TRAIN_SAMPLES = {"fmnist": 60000, "mnist": 60000, "cifar10": 50000, "cifar100": 50000, "svhn": 73257,
                 "emnist": 112800, "eurosat": 21600, "synthetic": 10000}
SCM_SELECTED_GUESS = 20  # clients FedSCM's solver keeps per γ, for costing only (the paper's Fig. 5: tens of K = 500)


def train_samples(dataset: str) -> int:
    return TRAIN_SAMPLES.get(dataset, 50000)


def _hash(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _plain(data: Any) -> Any:
    """JSON-ready copy (tuples become lists; other objects their repr)."""
    return json.loads(json.dumps(data, default=repr))


def _one_line(err: ValidationError, source: str, model: type[BaseModel] | None = None) -> ConfigError:
    """A pydantic error as one line: ``source: field: message (got value)``; an unknown key lists
    the allowed keys of ``model`` (default: RunConfig)."""
    first = err.errors()[0]
    field = _short_name(".".join(str(p) for p in first["loc"]) or "config")
    msg = first["msg"].removeprefix("Value error, ")
    if len(msg) > 600:  # messages echo input short (fedlib.errors.shown); a list of allowed names may be long
        msg = msg[:600] + "..."
    if first["type"] == "extra_forbidden":
        allowed = ", ".join((model or RunConfig).model_fields)
        return ConfigError(f"{source}: unknown key {field!r}; allowed keys: {allowed}")
    got = first.get("input")
    echo = "" if isinstance(got, dict) or msg.endswith(")") else f" (got {shown(got)})"
    prefix = f"{field}: " if first["loc"] and not msg.startswith(f"{field}:") else ""
    if prefix and field in ("split", "method") and re.match(r"[^\s:'.]+: ", msg):  # a spec's parameter: split.alpha
        prefix = f"{field}."
    return ConfigError(f"{source}: {prefix}{msg}{echo}".replace("\n", " "))


def make_config(data: dict[str, Any] | RunConfig | None = None, source: str = "config", **overrides) -> RunConfig:
    """Validate a dict (plus keyword overrides) into a RunConfig, with one-line errors."""
    return RunConfig.make(data, source, **overrides)


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without aliases: ``*name`` references (the "billion laughs" expansion) are refused."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.constructor.ConstructorError(None, None, "YAML aliases (*name) are not allowed in configs",
                                                    mark)
        return super().compose_node(parent, index)


def parse_yaml(text: str, source: str) -> Any:
    """Safe YAML without aliases, within the size limit; errors are one ConfigError line."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: too large ({len(text)} characters; at most {MAX_CONFIG_BYTES})")
    loader = None
    try:
        loader = _NoAliasLoader(text)  # (already reads: a control character is refused here)
        return loader.get_single_data()
    except yaml.reader.ReaderError as err:
        raise ConfigError(f"{source}: malformed YAML at character {err.position + 1}: character "
                          f"#x{err.character:04x} is not allowed") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise ConfigError(f"{source}: malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: YAML nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_config(path: str | Path, **overrides) -> RunConfig:
    """Read a YAML file into a RunConfig (``ExperimentConfig.load``)."""
    return RunConfig.load(path, **overrides)
