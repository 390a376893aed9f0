"""Validated experiment configuration.

A config is plain data (YAML or a dict) checked before anything is loaded or trained:
unknown keys, wrong types and out-of-range values raise :class:`ConfigError` with one
line that names the field and the allowed range. YAML is read with ``yaml.safe_load``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

CACHE_FORMAT = 1  # bump when a change makes old cached results invalid


class ConfigError(ValueError):
    """A bad configuration value; the message is one line naming the field."""


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
        return {"name": value} if isinstance(value, str) else value


_SPLIT_RANGES = {  # parameter -> (test, allowed range text)
    "alpha": (lambda v: v > 0, "> 0"),
    "gamma": (lambda v: v > 0, "> 0"),
    "k": (lambda v: v >= 1, ">= 1"),
    "min_size": (lambda v: v >= 0, ">= 0"),
    "n_mavericks": (lambda v: v >= 0, ">= 0"),
    "n_free_riders": (lambda v: v >= 0, ">= 0"),
    "sigma": (lambda v: v >= 0, ">= 0"),
    "rate": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "std": (lambda v: v >= 0, ">= 0"),
}


class RunConfig(BaseModel):
    """One federated run. Defaults: CELM's Fashion-MNIST protocol, FedAvg, 5 IID clients."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = "fmnist"
    data_root: str | None = None
    fraction: float = Field(1.0, gt=0, le=1, description="share of the training set used")
    test_samples: int | None = Field(None, ge=1, description="evaluate on a fixed random subset of n test samples")
    server_val: int | None = Field(None, ge=1, description="training samples held out as the server's "
                                   "validation set (default 1000 for methods that need one)")
    model: str = "mlp"
    split: Spec = Spec(name="iid")
    n_clients: int = Field(5, ge=1)
    clients_per_round: int | None = Field(None, ge=1, description="None = all clients")
    rounds: int = Field(20, ge=1)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(0.1, gt=0)
    lr_milestones: tuple[int, ...] = Field((), description="rounds after which lr *= lr_gamma")
    lr_gamma: float = Field(0.1, gt=0, le=1)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    method: Spec = Spec(name="fedavg")
    seed: int = 0
    device: str = "cpu"
    eval_every: int = Field(1, ge=1)
    update_clip: float | None = Field(10.0, gt=1, description="clip updates farther than this many times the "
                                      "round's median distance from the global model (None: off)")
    client_chunk: int | None = Field(None, ge=1, description="clients trained together (memory)")
    reference_values: bool = Field(False, description="after the last round, exact Shapley and leave-one-out "
                                   "values of its clients on the server's validation set (final['reference'])")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("cpu", "cuda", "auto") and not v.startswith("cuda:"):
            raise ValueError("must be 'cpu', 'cuda', 'cuda:N' or 'auto'")
        return v

    @field_validator("lr_milestones")
    @classmethod
    def _milestones(cls, v):
        if any(m < 1 for m in v):
            raise ValueError("milestones must be rounds >= 1")
        return tuple(sorted(v))

    @model_validator(mode="after")
    def _consistent(self):
        if self.clients_per_round is not None and self.clients_per_round > self.n_clients:
            raise ValueError(
                f"clients_per_round: must be <= n_clients = {self.n_clients} (got {self.clients_per_round})"
            )
        for key, value in self.split.params.items():
            if key in _SPLIT_RANGES and isinstance(value, (int, float)):
                ok, text = _SPLIT_RANGES[key]
                if not ok(value):
                    raise ValueError(f"split.{key}: must be {text} (got {value})")
        if self.reference_values and self.per_round > 16:
            raise ValueError(f"reference_values: exact Shapley needs <= 16 clients per round (got {self.per_round})")
        self._check_against_dataset()
        from .methods import build_method  # registry lives with the methods

        build_method(self.method.name, self.method.params).check_run(self.rounds, self.n_clients)
        return self

    def _check_against_dataset(self) -> None:
        from .data import dataset_spec

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

    def key(self) -> str:
        """Hash of everything that changes results (not the data root or chunking)."""
        data = self.model_dump(mode="json", exclude={"data_root", "client_chunk"})
        data["_format"] = CACHE_FORMAT
        if not self.reference_values:  # the default leaves earlier keys unchanged
            data.pop("reference_values")
        if self.test_samples is not None:
            data["_test_subset"] = "random"  # earlier versions took the first n test samples
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _one_line(err: ValidationError, source: str) -> ConfigError:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "config"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        allowed = ", ".join(RunConfig.model_fields)
        return ConfigError(f"{source}: unknown key {field!r}; allowed keys: {allowed}")
    got = first.get("input")
    shown = "" if isinstance(got, dict) or msg.endswith(")") else f" (got {got!r})"
    prefix = f"{field}: " if first["loc"] else ""
    return ConfigError(f"{source}: {prefix}{msg}{shown}".replace("\n", " "))


def make_config(data: dict[str, Any] | RunConfig | None = None, source: str = "config", **overrides) -> RunConfig:
    """Validate a dict (plus keyword overrides) into a RunConfig, with one-line errors."""
    if isinstance(data, RunConfig):
        data = data.to_dict()
    merged = {**(data or {}), **overrides}
    try:
        return RunConfig(**merged)
    except ValidationError as err:
        raise _one_line(err, source) from None
    except ValueError as err:  # raised by nested validators (method registry, data specs)
        raise ConfigError(f"{source}: {str(err).splitlines()[0]}") from None


def load_config(path: str | Path, **overrides) -> RunConfig:
    """Read a YAML file with safe loading and validate it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}: malformed YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return make_config(data, source=str(path), **overrides)
