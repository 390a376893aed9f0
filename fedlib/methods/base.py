"""The method interface: a small object with the paper's hyper-parameters and three hooks.

The engine (``fedlib.run``) owns the round loop; a method only says, in protocol order,
1. ``select_clients``  which clients take part in this round,
2. ``local_training``  what the local objective adds (FedProx term, extra losses),
3. ``aggregate``       how the server weighs the trained clients (weights on the simplex),
and optionally keeps per-client contribution ``scores`` for the history.
Hyper-parameters are dataclass fields, validated in ``validate``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from torch import nn

from ..population import LocalTraining


@dataclass
class Federation:
    """What a method may know about the federation (no private data)."""

    model: nn.Module
    n_clients: int
    n_classes: int
    rounds: int
    clients_per_round: int
    client_sizes: np.ndarray  # self-reported sample counts (FedAvg uses them)
    device: torch.device
    # A labelled validation set held by the server, for methods that declare
    # ``needs_validation`` (CFFL, Shapley utilities): held out of the training set before
    # the split, ``RunConfig.server_val`` samples (default 1000). None otherwise.
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    input_shape: tuple[int, ...] | None = None  # one sample's shape, e.g. (1, 28, 28)
    # Client-side computations before selection (PoC's local losses, FedEMD's label
    # distributions): ``client_data(clients)`` gives those clients' own data; set by the engine.
    client_data: Callable[[np.ndarray], "ClientData"] | None = None


@dataclass
class RoundState:
    round: int  # 0-based
    rng: np.random.Generator
    global_flat: torch.Tensor  # [P]
    global_buffers: dict[str, torch.Tensor]
    lr: float


@dataclass
class ClientUpdates:
    """The trained population of one round."""

    clients: np.ndarray  # [n] client ids
    flat: torch.Tensor  # [n, P]
    buffers: dict[str, torch.Tensor]  # [n, ...]
    sizes: np.ndarray  # [n] sample counts
    # what clients upload besides the model (``Method.client_uploads``), e.g. FLCE's class
    # prototypes: {name: tensor with dim 0 = the clients above}
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class ClientData:
    """The selected clients' own data, for computations that run on the client side
    (``Method.client_uploads``): sample ``indices[i]`` of ``x``/``y`` belong to client i."""

    x: torch.Tensor
    y: torch.Tensor
    indices: list[np.ndarray]
    generator: torch.Generator  # the round's seeded generator (shuffles, noise)


class Method:
    name: ClassVar[str] = ""
    needs_validation: ClassVar[bool] = False  # the server holds a labelled validation set
    # The method's rule version, part of every cache key and stored result: change it (a short
    # string) whenever the method's update rule changes in a way its hyper-parameters do not show,
    # then regenerate its golden value (``python tests/golden_methods.py --regenerate <name>``).
    rule_version: ClassVar[str] = "1"

    def validate(self) -> None:
        """Raise ValueError (one line, naming the field and its range) for bad values."""

    def check_run(self, rounds: int, n_clients: int) -> None:
        """Raise ValueError (one line) when the hyper-parameters do not fit the run (checked with the config)."""

    def setup(self, fed: Federation) -> None:
        self.fed = fed

    # -- 1. plan ---------------------------------------------------------------------
    def select_clients(self, state: RoundState) -> np.ndarray:
        """Uniform sampling without replacement (all clients when every one takes part)."""
        n, k = self.fed.n_clients, self.fed.clients_per_round
        if k >= n:
            return np.arange(n)
        return np.sort(state.rng.choice(n, size=k, replace=False))

    # -- 2. local ----------------------------------------------------------------------
    def start_models(self, state: RoundState, clients: np.ndarray) -> torch.Tensor | None:
        """Per-client starting parameters [n, P]; None = everyone starts from the global model."""
        return None

    def local_training(self, state: RoundState, base: LocalTraining, clients: np.ndarray) -> LocalTraining:
        return base

    def client_uploads(self, state: RoundState, clients: np.ndarray, flat: torch.Tensor,
                       buffers: dict[str, torch.Tensor], data: ClientData) -> dict[str, torch.Tensor] | None:
        """Client side, after local training: what the clients send besides their models
        (``{name: [n, ...]}``, arrives as ``ClientUpdates.extras``); None = nothing."""
        return None

    # -- 3. server ---------------------------------------------------------------------
    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        raise NotImplementedError

    def server_update(self, state: RoundState, weights: torch.Tensor, flat: torch.Tensor,
                      buffers: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The new global model from ``weights @ uploads`` (``flat``, ``buffers``); methods whose
        server step is not a weighted average of the uploads (q-FedAvg, FedFa, FedFV) change it."""
        return flat, buffers

    def scores(self) -> np.ndarray | None:
        """Current contribution score of every client, or None if the method has none."""
        return None

    def diagnostics(self) -> dict[str, Any] | None:
        """JSON-ready extras of this round for the history (e.g. CELM's evidence matrix)."""
        return None

    def resolved_hyperparameters(self) -> dict[str, Any]:
        """Every hyper-parameter of this instance, defaults filled in (part of the cache key)."""
        if not dataclasses.is_dataclass(self):
            return {}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    @classmethod
    def hyperparameters(cls) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls


def build_method(name: str, params: dict[str, Any] | None = None) -> Method:
    """Instantiate a registered method, with one-line errors for bad names and values."""
    if name not in METHODS:
        raise ValueError(f"method: unknown method {name!r}; known: {', '.join(sorted(METHODS))}")
    cls = METHODS[name]
    params = dict(params or {})
    allowed = cls.hyperparameters()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        hint = ", ".join(sorted(allowed)) or "none"
        raise ValueError(f"method {name!r}: unknown hyper-parameter {unknown[0]!r}; allowed: {hint}")
    for key, value in params.items():
        default = allowed[key]
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"method {name!r}: {key} must be true or false (got {value!r})")
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"method {name!r}: {key} must be a number (got {value!r})")
    method = cls(**params)
    method.validate()
    return method
