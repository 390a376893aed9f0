"""The method interface: a small object with the paper's hyper-parameters and the hooks below.

The engine (``fedlib.engine.rounds``, the one round loop) owns the loop, the clients' training and
every piece of state it passes around; a method answers its hooks, which the class lists once, in
the order the engine calls them, by side of the protocol:

- before the run: ``validate`` (the hyper-parameters, at construction), ``check_run`` (against the
  config), ``adapt_model`` (e.g. MOON's projection head), ``setup``, ``init_client_state``;
- each round, (1) the server plans: ``select_clients`` (who), ``local_training`` (the local
  objective: FedProx's term, extra losses), ``start_models`` (from which models);
- (2) the clients train, all at once (the engine; no method calls the trainer);
- (3) more local passes: ``local_phases``, each followed by ``phase_done``;
- (4) the clients upload: ``client_uploads`` (what they send besides their models);
- (5) the server weighs and updates: ``weigh`` (the weights on the uploads, which the engine
  averages with ``fedlib.population.aggregate``; it may also move the method's server state, e.g.
  CGSV's reputations), ``server_update`` (the new global model), ``update_client_state``;
- (6) the record: ``scores`` (contribution per client), ``diagnostics`` (the round's extras, which
  its hooks put in ``state.round_data["diagnostics"]``; read after the evaluation);
- (7) the evaluation: ``evaluate`` (default: the new global model on the test set);
- the logit protocol's own hooks, named apart (:class:`DistillationProtocol`): ``training_indices``
  (before the run), ``round_end_phases`` (passes at the round's end, each followed by ``phase_done``)
  and ``final_extras`` (after the run).

Hyper-parameters are dataclass fields, validated in ``validate``. A method registers itself
where it is defined: the ``@register`` decorator adds it to ``METHODS`` by its ``name`` (a name
another class holds is an error).

Round data (``RoundState``). The engine makes one ``RoundState`` per round and passes that same
object to every hook of the round: the round's index, rng, incoming global model and lr, the
per-client state, and from ``weigh`` on the screened uploads (``updates``). What a hook
computes for a later hook of the same round goes in ``RoundState.round_data`` (a dict the
method alone writes and reads), not on ``self``: FedFV's server step reads the uploads from
``state.updates``, the logit protocol's ``evaluate`` the present clients and the aggregator that
``weigh`` fitted from ``state.round_data``. The round's diagnostics too: a hook puts them in
``state.round_data["diagnostics"]`` (a JSON-ready dict), which ``diagnostics(state)`` returns for
the history. State that outlives the round is either the server's (kept on the method, e.g.
CGSV's reputations) or per-client (below).

Per-client state (engine-owned). A method whose clients keep their own models or tensors
between rounds (ShapFed's personalised broadcast, the per-client downloads of CGSV and CFFL,
CELM's retained classifier heads) returns a :class:`ClientState` from ``init_client_state``; the
engine then holds it, passes it in
``RoundState.client_state``, starts the selected clients from its rows (``flat``,
``buffers``) and replaces it by what ``update_client_state`` returns after the server step.
Methods without it (the default ``None``) run exactly as before.

Local phases. After the main local pass (the uploads), a method may ask for more passes of the
round's selected clients (``local_phases``: from which models, with which objective), e.g.
Ditto's personal models; the engine runs each vectorized on the round's batches and hands the
trained models to ``phase_done``, which returns the new per-client state. A phase may instead train
on its own data (the logit protocol's public set with soft targets), replace the uploads, or (the
logit protocol's) run at the end of the round (``DistillationProtocol.round_end_phases``).

Evaluation. ``evaluate`` scores the round (default: the global model on the test set); Ditto
scores the clients' personal models as its authors do, the logit protocol its aggregated
ensemble.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import shown as shown_value
from ..population import LocalTraining, evaluate, flat_indices, predict


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
    seed: int = 0  # the run's seed (for a method's own seeded draws)


@dataclass
class ClientState:
    """Persistent per-client state held by the engine (see the module docstring).

    ``flat`` [N, P] and ``buffers`` {name: [N, ...]}: each client's own model, where a round
    starts it (None: every client starts from the global model); ``tensors``: named
    per-client tensors (dim 0 = N), e.g. a download share. Replace rows with
    :meth:`with_rows` (returns a new state; the engine never mutates one in place)."""

    flat: torch.Tensor | None = None
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def replicate(cls, n_clients: int, global_flat: torch.Tensor, global_buffers: dict[str, torch.Tensor],
                  **tensors: torch.Tensor) -> "ClientState":
        """Every client holding the global model (plus the given named tensors)."""
        return cls(global_flat.unsqueeze(0).repeat(n_clients, 1),
                   {k: v.unsqueeze(0).repeat(n_clients, *([1] * v.dim())) for k, v in global_buffers.items()},
                   dict(tensors))

    def with_rows(self, clients, flat: torch.Tensor | None = None, buffers: dict[str, torch.Tensor] | None = None,
                  **tensors: torch.Tensor) -> "ClientState":
        """A copy whose rows ``clients`` hold the given models / tensor values."""
        index = torch.as_tensor(np.asarray(clients), dtype=torch.long)
        new_flat = self.flat
        if flat is not None:
            new_flat = self.flat.clone()
            new_flat[index.to(new_flat.device)] = flat.to(new_flat)
        new_buffers = dict(self.buffers)
        for k, v in (buffers or {}).items():
            new_buffers[k] = self.buffers[k].clone()
            new_buffers[k][index.to(v.device)] = v.to(new_buffers[k])
        new_tensors = dict(self.tensors)
        for k, v in tensors.items():
            new_tensors[k] = self.tensors[k].clone()
            new_tensors[k][index.to(new_tensors[k].device)] = v.to(new_tensors[k])
        return ClientState(new_flat, new_buffers, new_tensors)


@dataclass
class LocalPhase:
    """One more local pass of the round's selected clients (see the module docstring): each
    client starts from its row of ``start`` [n, P] / ``start_buffers`` {name: [n, ...]} (None: from
    the model the main pass just trained) and trains with ``training``, on the main pass's batches,
    or on its own data (``x``, ``y`` with ``indices[i]`` the samples of client i, e.g. the public
    set with soft targets). ``replaces_upload``: the clients upload the phase's models."""

    name: str
    start: torch.Tensor | None
    start_buffers: dict[str, torch.Tensor] | None
    training: LocalTraining
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    indices: list[np.ndarray] | None = None
    replaces_upload: bool = False


@dataclass
class TestSet:
    """The test set as a method's ``evaluate`` sees it: ``score`` M models (an ``Evaluation``),
    ``predict`` their logits [M, n, C]; labels ``y``."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    n_classes: int

    def score(self, flat: torch.Tensor, buffers: dict[str, torch.Tensor]):
        return evaluate(self.model, flat, buffers, self.x, self.y, self.n_classes)

    def predict(self, flat: torch.Tensor, buffers: dict[str, torch.Tensor], batch_size: int = 512) -> torch.Tensor:
        return predict(self.model, flat, buffers, self.x, batch_size=batch_size)


@dataclass
class RoundState:
    """One round, as the engine hands it to every hook of that round: a new one each round, each
    run its own (packed runs too). The engine writes the fields down to ``updates``; a method only
    reads them. ``round_data`` is the method's: what its hooks hand on to its later hooks of the
    same round (e.g. the logit protocol's present clients and fitted aggregator, from
    ``weigh`` to ``evaluate``; the round's diagnostics under ``"diagnostics"``), never kept on
    ``self``; the engine never reads it (``diagnostics(state)`` does, a hook). What
    outlives the round is server state (on the method: reputations, FedFV's past directions) or
    per-client state (``client_state``)."""

    round: int  # 0-based
    rng: np.random.Generator
    global_flat: torch.Tensor  # [P]
    global_buffers: dict[str, torch.Tensor]
    lr: float
    client_state: ClientState | None = None  # the engine's per-client state (``init_client_state``)
    updates: "ClientUpdates | None" = None  # the round's screened uploads, set before ``weigh``
    round_data: dict[str, Any] = field(default_factory=dict)  # the method's, between its hooks of this round


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
    # the parameters each client started the round from [n, P]; None = the global model
    start: torch.Tensor | None = None

    def deltas(self, global_flat: torch.Tensor) -> torch.Tensor:
        """Each client's local update ``w_i - start_i`` [n, P] (start = the global model when None)."""
        return self.flat - (global_flat if self.start is None else self.start)


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
    # False: the uploads are not updates of one shared model (the logit protocol's client models),
    # so the engine never clips them (non-finite ones are still dropped)
    parameter_uploads: ClassVar[bool] = True
    # The method's rule version, part of every cache key and stored result: change it (a short
    # string) whenever the method's update rule changes in a way its hyper-parameters do not show,
    # then regenerate its golden value (``python tests/golden_methods.py --regenerate <name>``).
    rule_version: ClassVar[str] = "1"

    # -- before the run --------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError (one line, naming the field and its range) for bad values."""

    def check(self, *rules: tuple[str, bool, str]) -> None:
        """For ``validate``: raise the first rule ``(field, ok, allowed)`` that fails as
        ``method '<name>': <field> must be <allowed> (got <value>)``."""
        for attr, ok, allowed in rules:
            if not ok:
                value = getattr(self, attr)  # echoed short (fedlib.errors.shown)
                raise ValueError(f"method {self.name!r}: {attr} must be {allowed} (got {shown_value(value)})")

    def check_run(self, rounds: int, n_clients: int) -> None:
        """Raise ValueError (one line) when the hyper-parameters do not fit the run (checked with the config)."""

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """The model this method trains, built from the config's (default: unchanged), e.g. MOON's
        projection head; called once, under the seeded model initialisation."""
        return model

    def setup(self, fed: Federation) -> None:
        self.fed = fed

    def init_client_state(self, fed: Federation, global_flat: torch.Tensor,
                          global_buffers: dict[str, torch.Tensor]) -> ClientState | None:
        """The engine-held per-client state at the start of the run; None (default) = none."""
        return None

    # -- 1. the server plans the round -----------------------------------------------------------
    def select_clients(self, state: RoundState) -> np.ndarray:
        """Uniform sampling without replacement (all clients when every one takes part)."""
        n, k = self.fed.n_clients, self.fed.clients_per_round
        if k >= n:
            return np.arange(n)
        return np.sort(state.rng.choice(n, size=k, replace=False))

    def local_training(self, state: RoundState, base: LocalTraining, clients: np.ndarray) -> LocalTraining:
        return base

    def start_models(self, state: RoundState, clients: np.ndarray) -> torch.Tensor | None:
        """Per-client starting parameters [n, P]; None = the clients' rows of the engine's
        per-client state when there is one, else everyone starts from the global model."""
        return None

    # -- 2. the clients train (the engine, vectorized) and 3. run more local passes --------------
    def local_phases(self, state: RoundState, clients: np.ndarray, base: LocalTraining) -> list[LocalPhase]:
        """More local passes of ``clients`` after the main one (default none)."""
        return []

    def phase_done(self, state: RoundState, phase: LocalPhase, clients: np.ndarray, flat: torch.Tensor,
                   buffers: dict[str, torch.Tensor]) -> ClientState | None:
        """The per-client state after ``phase`` trained ``clients`` to ``flat`` [n, P] / ``buffers``."""
        return state.client_state

    # -- 4. the clients upload -------------------------------------------------------------------
    def client_uploads(self, state: RoundState, clients: np.ndarray, flat: torch.Tensor,
                       buffers: dict[str, torch.Tensor], data: ClientData) -> dict[str, torch.Tensor] | None:
        """Client side, after local training: what the clients send besides their models
        (``{name: [n, ...]}``, arrives as ``ClientUpdates.extras``); None = nothing."""
        return None

    # -- 5. the server weighs the uploads and updates --------------------------------------------
    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        """The server's weights [n] on ``updates`` (``state.updates``, the same object); the
        engine averages the uploads with them (``fedlib.population.aggregate``, the matmul). It may
        move the method's server state and put what later hooks of the round need (its diagnostics
        too) in ``state.round_data``."""
        raise NotImplementedError

    def server_update(self, state: RoundState, weights: torch.Tensor, flat: torch.Tensor,
                      buffers: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The new global model from ``weights @ uploads`` (``flat``, ``buffers``); methods whose
        server step is not a weighted average of the uploads (q-FedAvg, FedFa, FedFV) change it."""
        return flat, buffers

    def update_client_state(self, state: RoundState, weights: torch.Tensor, global_flat: torch.Tensor,
                            global_buffers: dict[str, torch.Tensor]) -> ClientState | None:
        """After the server step: the next round's per-client state (``state.client_state`` and
        ``state.updates`` hold this round's); the default keeps it unchanged."""
        return state.client_state

    # -- 6. the round's record and 7. its evaluation ---------------------------------------------
    def scores(self) -> np.ndarray | None:
        """Current contribution score of every client, or None if the method has none."""
        return None

    def diagnostics(self, state: RoundState) -> dict[str, Any] | None:
        """JSON-ready extras of this round for the history (e.g. CELM's evidence matrix), called
        after ``evaluate``; by default what the round's hooks put in ``state.round_data["diagnostics"]``."""
        return state.round_data.get("diagnostics") or None

    def evaluate(self, state: RoundState, global_flat: torch.Tensor, global_buffers: dict[str, torch.Tensor],
                 test: TestSet) -> Any:
        """The round's test evaluation, a one-model ``fedlib.population.Evaluation`` (``test`` scores
        or predicts with any models). None (default): the engine scores the new global model.
        ``state.client_state`` is the updated state, ``state.updates`` the round's uploads."""
        return None

    def resolved_hyperparameters(self) -> dict[str, Any]:
        """Every hyper-parameter of this instance, defaults filled in (part of the cache key)."""
        if not dataclasses.is_dataclass(self):
            return {}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    @classmethod
    def hyperparameters(cls) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}


class DistillationProtocol:
    """The second protocol the engine runs: the logit-based one ("Who to trust?"), whose clients keep
    their own models and learn from each other's logits. Its three hooks exist for it alone, so they are
    named here, not on :class:`Method`; the engine calls them only for a method of this protocol (a
    ``Method`` that also derives from this class)."""

    def training_indices(self, indices: list[np.ndarray]) -> list[np.ndarray]:
        """Each client's samples for local training, from its share of the split (the logit protocol keeps
        a validation split out). Called once, after ``setup``."""
        return indices

    # -- 8. passes at the end of the round (then phase_done again); after the last round ---------
    def round_end_phases(self, state: RoundState, clients: np.ndarray, base: LocalTraining) -> list[LocalPhase]:
        """Local passes of ``clients`` at the end of the round, after the server step and the evaluation,
        e.g. the refinement on the new soft targets."""
        return []

    def final_extras(self) -> dict[str, Any] | None:
        """JSON-ready entries for the run's ``final`` block besides the test metrics."""
        return None


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: a method registers itself where it is defined, under its ``name`` (a
    name a config accepts); a missing name, or one another class holds, is a one-line error. The
    same class defined again (a notebook cell run twice, a reloaded module) replaces itself."""
    if not cls.name:
        raise ValueError(f"method class {cls.__name__}: set its name before registering it")
    taken = METHODS.get(cls.name)
    if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"method {cls.name!r}: the name is taken by {taken.__module__}.{taken.__qualname__}; "
                         f"choose another name for {cls.__module__}.{cls.__qualname__}")
    METHODS[cls.name] = cls
    return cls


def build_method(name: str, params: dict[str, Any] | None = None) -> Method:
    """Instantiate a registered method, with one-line errors for bad names and values."""
    if name not in METHODS:
        raise ValueError(f"method: unknown method {shown_value(name)}; known: {', '.join(sorted(METHODS))}")
    cls = METHODS[name]
    params = dict(params or {})
    allowed = cls.hyperparameters()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        hint = ", ".join(sorted(allowed)) or "none"
        raise ValueError(f"method {name!r}: unknown hyper-parameter {shown_value(unknown[0])}; allowed: {hint}")
    for key, value in params.items():
        default = allowed[key]
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"method {name!r}: {key} must be true or false (got {shown_value(value)})")
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"method {name!r}: {key} must be a number (got {shown_value(value)})")
    method = cls(**params)
    method.validate()
    return method


# ----------------------------------------------------------------------------- shared by methods


def global_model_on_clients(fed: Federation, state: RoundState, data) -> tuple[torch.Tensor, torch.Tensor]:
    """Client side, for q-FedAvg, FedFa and FedFV: the received global model's mean
    cross-entropy and accuracy on each selected client's own training data ([n] each),
    from one batched pass over the clients' samples."""
    flat_index, owner, sizes = (t.to(data.x.device) for t in flat_indices(data.indices))
    logits = predict(fed.model, state.global_flat.unsqueeze(0),
                     {k: v.unsqueeze(0) for k, v in state.global_buffers.items()}, data.x[flat_index])[0]
    y = data.y[flat_index]
    n = len(data.indices)
    loss = torch.zeros(n, device=logits.device).index_add_(0, owner, F.cross_entropy(logits, y, reduction="none"))
    correct = torch.zeros(n, device=logits.device).index_add_(0, owner, (logits.argmax(-1) == y).float())
    count = sizes.to(logits.device).clamp(min=1).float()
    return loss / count, correct / count
