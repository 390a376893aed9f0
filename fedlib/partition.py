"""Seeded client partitions of a labelled sample pool: the generic splits (``iid``, ``dirichlet``,
``k_classes``, ``pls``, ``sls``) and the split kinds a config names (:data:`SPLIT_KINDS`: their
declared parameters, ranges and defaults, ``check_split``, ``resolved_split``, ``make_partition``).
The papers' splits and the modifiers (free-riders, hostile roles, shift, noise) are in
``fedlib.splits``; the :class:`~fedlib.allocation.Partition` type, the roles and the count and draw
helpers in ``fedlib.allocation``.

Every split takes the training ``labels`` (int array), ``n_clients``, an optional
``n_classes`` (default ``labels.max() + 1``) and a ``seed`` (fed to
``np.random.default_rng``) and returns a :class:`Partition`. Each client's ``indices``
are int64, sorted ascending, disjoint across clients, and point into the sample pool:
the original training set, or ``Partition.x`` / ``Partition.y`` when a split or a
transform had to change the data (adversaries, covariate shift, noise).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .allocation import (Partition, _classes_per_client, _dirichlet_counts, _even_split_rows, _label_skew_counts,
                         _partition, _prepare, _require, client_class_counts)
from .errors import ConfigError, clipped, shown
from .limits import MAX_COUNT, MAX_RATE, MAX_SAMPLES
from .splits import (_flip_labels, _mark_benign, adversarial, celm_free_rider, celm_maverick, celm_maverick_shared,
                     covariate_shift, feature_noise, free_rider, label_noise, maverick, maverick_iid)


# ----------------------------------------------------------------------- basic splits


def iid(labels, n_clients: int, seed: int, n_classes: int | None = None) -> Partition:
    """Uniformly shuffled split; client sizes differ by at most 1."""
    labels, n_classes, _, rng = _prepare(labels, n_clients, n_classes, seed)
    shuffled = rng.permutation(labels.size)
    indices = [np.sort(part).astype(np.int64) for part in np.array_split(shuffled, n_clients)]
    counts = client_class_counts(indices, labels, n_classes)
    return Partition(indices, counts, ["benign"] * n_clients)


def dirichlet(
    labels, n_clients: int, alpha: float, seed: int, min_size: int = 1, n_classes: int | None = None
) -> Partition:
    """Label skew (CELM §5): per class, proportions over clients ~ Dir(alpha).

    Counts per class are multinomial with those proportions; all samples are used. Then
    every client below ``min_size`` samples takes samples from the currently largest
    client's most abundant class (ties: lowest index) without leaving the donor below
    ``min_size``; this repair is deterministic and needs no resampling.
    """
    labels, n_classes, class_sizes, rng = _prepare(labels, n_clients, n_classes, seed)
    _require(alpha > 0, f"alpha must be > 0, got {alpha}")
    _require(min_size >= 0, f"min_size must be >= 0, got {min_size}")
    counts = _dirichlet_counts(class_sizes, n_clients, alpha, min_size, rng)
    return _partition(labels, counts, ["benign"] * n_clients, rng)


def k_classes(labels, n_clients: int, k: int, seed: int, n_classes: int | None = None) -> Partition:
    """Pathological shards: every client holds exactly k distinct classes.

    Client i takes classes perm[(i k + j) mod C], j < k, for a random class permutation
    perm, so every class is used (needs n_clients * k >= C) and held by floor or ceil
    of n_clients k / C clients; a class's samples are split evenly among its holders.
    """
    labels, n_classes, class_sizes, rng = _prepare(labels, n_clients, n_classes, seed)
    _require(1 <= k <= n_classes, f"k must be in [1, n_classes={n_classes}], got {k}")
    _require(
        n_clients * k >= n_classes,
        f"k must be >= n_classes / n_clients = {n_classes / n_clients:g} to cover all classes, "
        f"got {k}",
    )
    slots = rng.permutation(n_classes)[np.arange(n_clients * k) % n_classes]
    slots = slots.reshape(n_clients, k)
    holds = np.zeros((n_clients, n_classes), dtype=bool)
    holds[np.arange(n_clients)[:, None], slots] = True
    counts = _even_split_rows(holds.T, class_sizes, holds.sum(axis=0)).T  # each class over its holders
    return _partition(labels, counts, ["benign"] * n_clients, rng)


def pls(
    labels, n_clients: int, seed: int, n_classes: int | None = None, classes_per_client: list[int] | None = None
) -> Partition:
    """Pure Label Skew (CELM §5): different numbers of classes, equal client sizes.

    Rule: client i of N holds k_i = 1 + floor(i (C-1)/(N-1) + 1/2) classes (or
    ``classes_per_client``). Clients in order of increasing k_i take the k_i least-loaded
    classes (load = sum of 1/k over holders; ties in a seeded random class order), so
    every class is covered. Each client holds S samples split evenly over its classes,
    with S = floor(min_c (n_c - holders_c) / load_c), the largest every class supplies.

    Fashion-MNIST (N=5, C=10, 6000 per class): k = 1, 3, 6, 8, 10 classes and
    S = 5452 samples per client (27,260 of 60,000 used); the 1-class client's class is
    shared only with the 10-class client. The CELM chapter passes ``classes_per_client =
    (2, 3, 4, 5, 9)`` (``fedlib.app.chapters.celm.protocol.PLS_ALLOCATION``, the allocation that gives CELM
    Table 4's Uniform column): S = 9814 samples per client.
    """
    labels, n_classes, class_sizes, rng = _prepare(labels, n_clients, n_classes, seed)
    k = _classes_per_client(classes_per_client, n_clients, n_classes)
    counts = _label_skew_counts(class_sizes, k, np.ones(n_clients), rng)
    return _partition(labels, counts, ["benign"] * n_clients, rng)


def sls(
    labels, n_clients: int, seed: int, n_classes: int | None = None, classes_per_client: list[int] | None = None
) -> Partition:
    """Step Label Skew (CELM §5): classes and sample count both grow with the client index.

    Rule: client i holds k_i = 1 + floor(i (C-1)/(N-1) + 1/2) classes (or
    ``classes_per_client``) and (i + 1) u samples, split evenly over its classes. Clients
    in order of increasing k_i take the k_i least-loaded classes (load = sum of
    (i+1)/k_i over holders; ties in a seeded random class order), and
    u = floor(min_c (n_c - holders_c) / load_c), the largest every class supplies.

    Fashion-MNIST (N=5, C=10, 6000 per class): k = 1, 3, 6, 8, 10 classes, u = 3598 and
    sizes 3598, 7196, 10794, 14392, 17990 (53,970 of 60,000 used).
    """
    labels, n_classes, class_sizes, rng = _prepare(labels, n_clients, n_classes, seed)
    k = _classes_per_client(classes_per_client, n_clients, n_classes)
    counts = _label_skew_counts(class_sizes, k, np.arange(1, n_clients + 1), rng)
    return _partition(labels, counts, ["benign"] * n_clients, rng)

# ----------------------------------------------------------------------------- a config's split


SPLIT_MODIFIERS = ("free_riders", "covariate_shift", "label_noise", "feature_noise", "noisy_clients",
                   "nan_updates", "huge_updates", "sign_flips", "scaled_updates", "noisy_updates", "alie",
                   "label_flips")
# faults and attacks for robustness tests: NaN uploads, uploads scaled by 1e6, sign-flipped uploads 2 w_g - w;
# issue 43: updates scaled by 10, Gaussian-noise uploads, colluding ALIE uploads, flipped labels (C - 1 - y)
HOSTILE_ROLES = {"nan_updates": "nan_update", "huge_updates": "huge_update", "sign_flips": "sign_flip",
                 "scaled_updates": "scaled_update", "noisy_updates": "random_update", "alie": "alie",
                 "label_flips": "label_flip"}


def _call_with_params(fn: Callable, spec_name: str, params: dict, **fixed):
    """Call a split function, rejecting parameters it does not take (one line)."""
    sig = inspect.signature(fn)
    allowed = [p for p in sig.parameters if p not in fixed and p not in ("labels", "x", "y")]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ConfigError(
            f"config: split {spec_name!r}: unknown parameter {shown(unknown[0])}; allowed: "
            f"{', '.join(allowed + list(SPLIT_MODIFIERS))}"
        )
    kwargs = {k: v for k, v in fixed.items() if k in sig.parameters}
    return fn(**kwargs, **params)


# ----------------------------------------------------------------------------- the split kinds (a registry)

# Every parameter a split kind or a modifier takes, with its allowed range, in one place (its default is
# the split function's): name -> (test, allowed range in words, integer?). A list parameter's range is
# that of each entry.
_COUNT = (lambda v: 0 <= v <= MAX_COUNT, f"in [0, {MAX_COUNT}]", True)
PARAMETER_RANGES: dict[str, tuple[Callable[[float], bool], str, bool]] = {
    "alpha": (lambda v: 0 < v <= MAX_RATE, f"in (0, {MAX_RATE:g}]", False),
    "gamma": (lambda v: 0 < v <= MAX_RATE, f"in (0, {MAX_RATE:g}]", False),
    "k": (lambda v: 1 <= v <= MAX_COUNT, f"in [1, {MAX_COUNT}]", True),
    "min_size": (lambda v: 0 <= v <= MAX_SAMPLES, f"in [0, {MAX_SAMPLES}]", True),
    "n_mavericks": _COUNT,
    "n_free_riders": _COUNT,
    "free_riders": _COUNT,
    "sigma": (lambda v: 0 <= v <= MAX_RATE, f"in [0, {MAX_RATE:g}]", False),
    "covariate_shift": (lambda v: 0 <= v <= MAX_RATE, f"in [0, {MAX_RATE:g}]", False),
    "rate": (lambda v: 0 <= v <= 1, "in [0, 1]", False),
    "label_noise": (lambda v: 0 <= v <= 1, "in [0, 1]", False),
    "std": (lambda v: 0 <= v <= MAX_RATE, f"in [0, {MAX_RATE:g}]", False),
    "feature_noise": (lambda v: 0 <= v <= MAX_RATE, f"in [0, {MAX_RATE:g}]", False),
    "maverick_share": (lambda v: 0 < v <= 1, "in (0, 1]", False),
    "rare_classes_per_maverick": (lambda v: 1 <= v <= MAX_COUNT, f"in [1, {MAX_COUNT}]", True),
    "rare_classes": (lambda v: 1 <= v <= MAX_COUNT, f"in [1, {MAX_COUNT}]", True),
    "free_rider_classes": _COUNT,
    "rare_fraction": (lambda v: 0 < v <= 1, "in (0, 1]", False),
    "free_rider_fraction": (lambda v: 0 < v <= 1, "in (0, 1]", False),
    "n_benign": _COUNT,
    "n_label_flip": _COUNT,
    "n_random_data": _COUNT,
    "n_random_update": _COUNT,
    "classes_per_client": (lambda v: 1 <= v <= MAX_COUNT, f"in [1, {MAX_COUNT}]", True),
    "maverick_classes": _COUNT,
    "maverick_class": _COUNT,
    "noisy_clients": _COUNT,
}
for _modifier in HOSTILE_ROLES:  # every hostile role is a count of clients
    PARAMETER_RANGES.setdefault(_modifier, _COUNT)
_FIXED = ("labels", "n_clients", "seed", "n_classes", "x", "y")  # what every split is given, not configured

# The declared type of each modifier (a split function's parameters declare theirs by annotation);
# None switches a modifier off. Hostile roles are counts of clients.
MODIFIER_TYPES: dict[str, str] = {"free_riders": "int | None", "covariate_shift": "float | None",
                                  "label_noise": "float | None", "feature_noise": "float | None",
                                  "noisy_clients": "list[int] | None",
                                  **{modifier: "int | None" for modifier in HOSTILE_ROLES}}
TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "list[int]": "a list of integers"}


@dataclass(frozen=True)
class SplitParameter:
    """One parameter a config may set on a split: its declared type (``int``, ``float``, ``bool`` or
    ``list[int]``), whether null is accepted, whether a config must set it, and its range
    (:data:`PARAMETER_RANGES`, per entry for a list)."""

    name: str
    type: str
    optional: bool = False
    required: bool = False

    @classmethod
    def declared(cls, name: str, annotation, required: bool = False) -> "SplitParameter":
        text = str(annotation).replace(" ", "")
        optional = text.endswith("|None") or text.startswith("None|")
        base = text.replace("|None", "").replace("None|", "")
        if base not in TYPE_WORDS:
            raise TypeError(f"split parameter {name!r}: declare its type (one of {', '.join(TYPE_WORDS)}), "
                            f"got {annotation!r}")
        return cls(name, base, optional, required)

    def expected(self) -> str:
        """What a value must be, in words: 'an integer in [1, 100000]', 'a number in (0, 1] (or null)'."""
        words = TYPE_WORDS[self.type]
        bounds = PARAMETER_RANGES.get(self.name)
        if bounds is not None and self.type != "bool":
            words += f" {bounds[1]}" if self.type != "list[int]" else f", each {bounds[1]},"
        return (words + (" or null" if self.optional else "")).rstrip(",")

    def accepts(self, value) -> bool:
        """Whether ``value`` is a value of this parameter: its type, and its range (each entry of a list)."""
        if value is None:
            return self.optional
        if self.type == "bool":
            return isinstance(value, bool)
        if self.type == "list[int]" and not isinstance(value, (list, tuple)):
            return False
        integer = self.type in ("int", "list[int]")
        bounds = PARAMETER_RANGES.get(self.name)
        for item in (value if self.type == "list[int]" else [value]):
            if isinstance(item, bool) or not isinstance(item, int if integer else (int, float)):
                return False
            if isinstance(item, float) and not math.isfinite(item):
                return False
            if bounds is not None and not bounds[0](item):
                return False
        return True


@dataclass(frozen=True)
class SplitKind:
    """A split a config may name: its function, and the parameters a config may set with their
    defaults (the function's keyword defaults), declared types (the function's annotations) and
    ranges (:data:`PARAMETER_RANGES`); :meth:`check` validates a config's parameters against them."""

    name: str
    function: Callable[..., Partition]

    @property
    def parameters(self) -> list[str]:
        return [p for p in inspect.signature(self.function).parameters if p not in _FIXED]

    @property
    def defaults(self) -> dict:
        return {p.name: p.default for p in inspect.signature(self.function).parameters.values()
                if p.name not in _FIXED and p.default is not inspect.Parameter.empty}

    @property
    def declared(self) -> dict[str, SplitParameter]:
        """Every parameter a config may set on this split: the function's, then the modifiers."""
        unkeyed = getattr(self.function, "key_only_when_set", frozenset())
        own = {p.name: SplitParameter.declared(p.name, p.annotation,
                                               required=p.default is inspect.Parameter.empty and p.name not in unkeyed)
               for p in inspect.signature(self.function).parameters.values() if p.name not in _FIXED}
        return {**own, **{m: SplitParameter.declared(m, MODIFIER_TYPES[m]) for m in SPLIT_MODIFIERS}}

    @property
    def required(self) -> list[str]:
        return [name for name, p in self.declared.items() if p.required]

    def check(self, params: dict, n_clients: int | None = None) -> None:
        """A one-line ValueError naming this split, the parameter and what it must be, for an unknown,
        missing, wrong-typed or out-of-range parameter (``n_clients``: also client indices in range)."""
        declared = self.declared
        for key in params:
            if key not in declared:
                raise ValueError(f"split.{clipped(key)}: split {self.name!r} has no such parameter; allowed: "
                                 f"{', '.join(declared)}")
        for key, value in params.items():
            if not declared[key].accepts(value):
                raise ValueError(f"split.{key}: split {self.name!r} needs {declared[key].expected()} "
                                 f"(got {'null' if value is None else shown(value)})")
        for name in self.required:
            if name not in params:
                raise ValueError(f"split.{name}: missing; split {self.name!r} needs it: {declared[name].expected()}")
        clients = params.get("noisy_clients") or []
        if n_clients is not None and any(i >= n_clients for i in clients):
            raise ValueError(f"split.noisy_clients: split {self.name!r} needs clients in [0, {n_clients - 1}] "
                             f"(got {shown(clients)})")


SPLIT_KINDS: dict[str, SplitKind] = {fn.__name__: SplitKind(fn.__name__, fn) for fn in (
    iid, dirichlet, k_classes, pls, sls, maverick, maverick_iid, celm_maverick, celm_maverick_shared, celm_free_rider,
    adversarial)}
SPLITS = tuple(SPLIT_KINDS)
for _kind in SPLIT_KINDS.values():  # every parameter is declared (a missing annotation fails here, at import)
    _kind.declared


# Parameters a split kind gained after runs of it were stored: at this default they stay out of a
# config's key (``resolved_split``), so the earlier runs keep theirs.
ADDED_LATER: dict[str, dict[str, Any]] = {"celm_free_rider": {"maverick_shares_common": False}}


def split_defaults(name: str) -> dict:
    """The defaults of split ``name``'s parameters ({} for a name that is not a split kind)."""
    kind = SPLIT_KINDS.get(name)
    return kind.defaults if kind is not None else {}


def resolved_split(name: str, params: dict) -> dict:
    """Split ``name`` with ``params`` and every default filled in, as a cache key reads it: a parameter
    added later (``ADDED_LATER``) left out while it has its default."""
    data = {"name": name, **split_defaults(name), **params}
    for param, default in ADDED_LATER.get(name, {}).items():
        if data.get(param) == default:
            data.pop(param)
    return data


def check_split(name, params: dict, n_clients: int | None = None) -> None:
    """A one-line ValueError for a split that is not a split kind, or whose parameters are unknown,
    missing, of the wrong type or out of range, all derived from :data:`SPLIT_KINDS`' declarations."""
    kind = SPLIT_KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ValueError(f"split: unknown split {shown(name)}; known: {', '.join(SPLITS)}")
    kind.check(params, n_clients)


def make_partition(spec, n_clients: int, seed: int, x: torch.Tensor, y: torch.Tensor) -> Partition:
    """The split ``spec`` (``.name`` and ``.params``, e.g. a config's ``split``) of ``n_clients`` clients,
    seeded with ``seed``, plus its modifiers (free-riders, covariate shift, noise)."""
    try:  # the declared parameters first: a missing or wrong-typed one is one line, not a TypeError
        check_split(spec.name, dict(spec.params), n_clients)
    except ValueError as err:
        raise ConfigError(f"config: {err}") from None
    params = dict(spec.params)
    mods = {k: params.pop(k) for k in list(params) if k in SPLIT_MODIFIERS}
    labels = y.cpu().numpy()
    fn = SPLIT_KINDS[spec.name].function
    try:
        part = _call_with_params(fn, spec.name, params, labels=labels, n_clients=n_clients,
                                 seed=seed, x=x, n_classes=int(y.max()) + 1)
        if mods.get("free_riders"):
            part = free_rider(part, mods["free_riders"])
        for modifier in HOSTILE_ROLES:
            count = mods.get(modifier)
            if count is not None and (isinstance(count, bool) or not isinstance(count, (int, np.integer))):
                raise ConfigError(f"config: split.{modifier}: must be an integer (got {count!r})")
            if mods.get(modifier):
                marked = _mark_benign(part, mods[modifier], HOSTILE_ROLES[modifier], modifier)
                part = _flip_labels(marked, part, y) if modifier == "label_flips" else marked
        clients = mods.get("noisy_clients")
        if mods.get("covariate_shift") is not None:
            part = covariate_shift(*part.pool(x, y), part, sigma=mods["covariate_shift"],
                                                    seed=seed)
        if mods.get("label_noise"):
            part = label_noise(*part.pool(x, y), part, rate=mods["label_noise"],
                                                seed=seed, clients=clients)
        if mods.get("feature_noise"):
            part = feature_noise(*part.pool(x, y), part, std=mods["feature_noise"],
                                                  seed=seed, clients=clients)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"config: split {spec.name!r}: {str(err).splitlines()[0]}") from None
    if part.n_clients != n_clients:
        raise ConfigError(f"config: n_clients: split {spec.name!r} makes {part.n_clients} clients "
                          f"(got n_clients = {n_clients})")
    return part
