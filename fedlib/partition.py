"""Seeded client partitions of a labelled sample pool.

Every split takes the training ``labels`` (int array), ``n_clients``, an optional
``n_classes`` (default ``labels.max() + 1``) and a ``seed`` (fed to
``np.random.default_rng``) and returns a :class:`Partition`. Each client's ``indices``
are int64, sorted ascending, disjoint across clients, and point into the sample pool:
the original training set, or ``Partition.x`` / ``Partition.y`` when a split or a
transform had to change the data (adversaries, covariate shift, noise).

Most splits first decide a client x class count matrix and then draw that many samples
of each class without replacement (:func:`_draw_indices`). ``counts`` is always
recomputed from the drawn indices with :func:`client_class_counts`.

Roles: ``benign``, ``maverick`` (owns classes no other client holds), ``free_rider``
(behavioural: the engine returns the received model unchanged), ``weak_free_rider``
(trains, on few samples of well-represented classes), ``label_flip`` and
``random_data`` (data poisoned in the pool), ``random_update`` (behavioural: the engine
sends a random update).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch

from .errors import ConfigError, clipped, shown
from .limits import MAX_COUNT, MAX_RATE, MAX_SAMPLES

ROLES = (
    "benign",
    "maverick",
    "free_rider",
    "weak_free_rider",
    "label_flip",
    "random_data",
    "random_update",
    "sign_flip",  # sends 2 w_g - w (its update negated), every round: a poisoning attack (issue 33)
    "scaled_update",  # sends w_g + 10 (w - w_g), its update scaled by the default clip factor (issue 43)
    "alie",  # colluding "A little is enough" attackers: all send w_g + mean - z std of the round's updates (issue 43)
)


@dataclass
class Partition:
    """Per-client sample indices, the client x class count matrix and client roles."""

    indices: list[np.ndarray]
    counts: np.ndarray
    roles: list[str]
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None

    @property
    def n_clients(self) -> int:
        return len(self.indices)

    @property
    def n_classes(self) -> int:
        return self.counts.shape[1]

    @property
    def sizes(self) -> np.ndarray:
        return self.counts.sum(axis=1)

    def pool(self, x, y):
        """The sample pool the indices point into: (self.x or x, self.y or y)."""
        return (x if self.x is None else self.x), (y if self.y is None else self.y)


# --------------------------------------------------------------------------- helpers


def client_class_counts(per_client, labels=None, n_classes: int | None = None) -> np.ndarray:
    """[n_clients, n_classes] int64 counts via one bincount.

    ``per_client`` holds per-client index arrays into ``labels``, or per-client label
    arrays when ``labels`` is None.
    """
    flat = np.concatenate([np.asarray(a, dtype=np.int64) for a in per_client])
    client_labels = flat if labels is None else np.asarray(labels, dtype=np.int64)[flat]
    if n_classes is None:
        n_classes = int(client_labels.max()) + 1 if client_labels.size else 0
    n_clients = len(per_client)
    owner = np.repeat(np.arange(n_clients), [len(a) for a in per_client])
    flat_counts = np.bincount(owner * n_classes + client_labels, minlength=n_clients * n_classes)
    return flat_counts.reshape(n_clients, n_classes).astype(np.int64)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _prepare(labels, n_clients: int, n_classes: int | None, seed: int):
    """Validate the common arguments; return int64 labels, n_classes, the class sizes and the
    split's ``np.random.default_rng(seed)``."""
    labels = np.asarray(labels, dtype=np.int64)
    _require(labels.ndim == 1 and labels.size > 0, f"labels must be a non-empty 1-D array, got shape {labels.shape}")
    if n_classes is None:
        n_classes = int(labels.max()) + 1
    _require(labels.min() >= 0 and labels.max() < n_classes,
             f"labels must lie in [0, n_classes={n_classes}), got [{labels.min()}, {labels.max()}]")
    _require(1 <= n_clients <= labels.size,
             f"n_clients must be in [1, {labels.size}] (no more clients than samples), got {n_clients}")
    return labels, n_classes, np.bincount(labels, minlength=n_classes), np.random.default_rng(seed)


def _even_split(total: int, parts: int) -> np.ndarray:
    """``total`` split into ``parts`` integers differing by at most 1 (larger first)."""
    return total // parts + (np.arange(parts) < total % parts)


def _even_split_rows(holds: np.ndarray, totals: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """Row i: ``totals[i]`` split by :func:`_even_split` over the ``parts[i]`` True entries of
    ``holds[i]`` (in column order), zero elsewhere; all rows at once."""
    rank = np.cumsum(holds, axis=1) - 1  # position of an entry among its row's held entries
    share = totals // np.maximum(parts, 1)
    extra = rank < (totals % np.maximum(parts, 1))[:, None]
    return np.where(holds, share[:, None] + extra, 0).astype(np.int64)


def _draw_indices(labels, counts, rng) -> list[np.ndarray]:
    """Draw counts[i, c] samples of class c for client i, without replacement."""
    n_clients, n_classes = counts.shape
    class_sizes = np.bincount(labels, minlength=n_classes)
    _require(
        bool(np.all(counts.sum(axis=0) <= class_sizes)),
        "counts must not exceed the samples available per class",
    )
    by_class = np.split(np.argsort(labels, kind="stable"), np.cumsum(class_sizes)[:-1])
    chosen, owner = [], []
    for c in range(n_classes):
        take = counts[:, c]
        chosen.append(rng.permutation(by_class[c])[: take.sum()])
        owner.append(np.repeat(np.arange(n_clients), take))
    chosen, owner = np.concatenate(chosen), np.concatenate(owner)
    order = np.lexsort((chosen, owner))
    return np.split(chosen[order].astype(np.int64), np.cumsum(counts.sum(axis=1))[:-1])


def _partition(labels, counts, roles, rng) -> Partition:
    indices = _draw_indices(labels, counts, rng)
    return Partition(indices, client_class_counts(indices, labels, counts.shape[1]), list(roles))


def _repair_min_size(counts: np.ndarray, min_size: int) -> np.ndarray:
    """Give every client at least ``min_size`` samples by a deterministic transfer.

    Each client below ``min_size`` (in client order) repeatedly takes samples from the
    currently largest client's most abundant class (ties: lowest index), never leaving
    the donor below ``min_size``. Needs counts.sum() >= n_clients * min_size.
    """
    counts = counts.copy()
    sizes = counts.sum(axis=1)
    for client in np.flatnonzero(sizes < min_size):
        while sizes[client] < min_size:
            donor = int(np.argmax(sizes))
            cls = int(np.argmax(counts[donor]))
            moved = min(min_size - sizes[client], counts[donor, cls], sizes[donor] - min_size)
            counts[donor, cls] -= moved
            counts[client, cls] += moved
            sizes[donor] -= moved
            sizes[client] += moved
    return counts


def _dirichlet_counts(class_sizes, n_clients, concentration, min_size, rng) -> np.ndarray:
    """[n_clients, len(class_sizes)] counts: per class, proportions ~ Dir(concentration)."""
    _require(
        class_sizes.sum() >= n_clients * min_size,
        f"min_size must be <= n_samples / n_clients = {class_sizes.sum() // n_clients}, "
        f"got {min_size}",
    )
    alphas = np.full(n_clients, float(concentration))
    proportions = rng.dirichlet(alphas, size=len(class_sizes))
    proportions /= proportions.sum(axis=1, keepdims=True)
    counts = rng.multinomial(class_sizes, proportions).T
    return _repair_min_size(counts, min_size)


def _step_classes(n_clients: int, n_classes: int) -> np.ndarray:
    """k_i = 1 + floor(i (C-1) / (N-1) + 1/2): 1 class for client 0 up to C for client N-1."""
    if n_clients == 1:
        return np.array([n_classes])
    steps = np.arange(n_clients) * (n_classes - 1) / (n_clients - 1)
    return 1 + np.floor(steps + 0.5).astype(np.int64)


def _label_skew_counts(class_sizes, classes_per_client, size_weights, rng) -> np.ndarray:
    """Counts for PLS/SLS: client i holds k_i classes and size_weights[i] * u samples.

    Clients in order of increasing k_i take the k_i classes with the lowest load so far
    (load of class c = sum over its holders of size_weight / k; ties broken by a random
    class order). A client's samples are split evenly over its classes. The unit
    u = floor(min_c (n_c - holders_c) / load_c) is the largest that every class supplies.
    """
    n_clients, n_classes = len(classes_per_client), len(class_sizes)
    tie_break = rng.permutation(n_classes)
    load = np.zeros(n_classes)
    holds = np.zeros((n_clients, n_classes), dtype=bool)
    for i in np.argsort(classes_per_client, kind="stable"):
        chosen = np.lexsort((tie_break, load))[: classes_per_client[i]]
        holds[i, chosen] = True
        load[chosen] += size_weights[i] / classes_per_client[i]
    unit = int(np.min((class_sizes - holds.sum(axis=0)) / load))
    _require(unit >= 1, "labels have too few samples per class for this split")
    sizes = (np.asarray(size_weights, dtype=float) * unit).astype(np.int64)
    return _even_split_rows(holds, sizes, np.asarray(classes_per_client, dtype=np.int64))


def _classes_per_client(classes_per_client, n_clients, n_classes) -> np.ndarray:
    """The given classes per client, validated, or the default step rule."""
    if classes_per_client is None:
        return _step_classes(n_clients, n_classes)
    k = np.asarray(classes_per_client, dtype=np.int64)
    name = "classes_per_client"
    _require(k.shape == (n_clients,), f"{name} must have {n_clients} entries, got {k.shape}")
    _require(
        bool(np.all((k >= 1) & (k <= n_classes))),
        f"{name} entries must be in [1, n_classes={n_classes}], got {k.tolist()}",
    )
    _require(
        k.sum() >= n_classes,
        f"{name} must sum to >= n_classes={n_classes} to cover every class, got {k.sum()}",
    )
    return k


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
    (2, 3, 4, 5, 9)`` (``fedlib.app.chapters.celm.PLS_ALLOCATION``, the allocation that gives CELM
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


# -------------------------------------------------------------------------- Mavericks


def _maverick_columns(class_sizes, n_clients, n_mavericks, maverick_classes, rng):
    """Counts in which each of the last n_mavericks clients owns all of one class.

    Returns (counts with only the Maverick columns filled, boolean mask of shared classes).
    """
    n_classes = len(class_sizes)
    top = min(n_classes, n_clients) - 1
    _require(
        0 <= n_mavericks <= top,
        f"n_mavericks must be in [0, min(n_classes, n_clients) - 1] = [0, {top}], "
        f"got {n_mavericks}",
    )
    if maverick_classes is None:
        maverick_classes = np.sort(rng.choice(n_classes, n_mavericks, replace=False))
    maverick_classes = np.asarray(maverick_classes, dtype=np.int64)
    _require(
        np.unique(maverick_classes).size == maverick_classes.size == n_mavericks
        and np.all((maverick_classes >= 0) & (maverick_classes < n_classes)),
        f"maverick_classes must be {n_mavericks} distinct classes in [0, {n_classes}), "
        f"got {maverick_classes.tolist()}",
    )
    counts = np.zeros((n_clients, n_classes), dtype=np.int64)
    owners = n_clients - n_mavericks + np.arange(n_mavericks)
    counts[owners, maverick_classes] = class_sizes[maverick_classes]
    shared = np.ones(n_classes, dtype=bool)
    shared[maverick_classes] = False
    return counts, shared


def maverick(
    labels,
    n_clients: int,
    n_mavericks: int,
    gamma: float,
    seed: int,
    min_size: int = 1,
    n_classes: int | None = None,
    maverick_classes: list[int] | None = None,
    maverick_share: float = 1.0,
) -> Partition:
    """FedMS §5.1 Maverick scenario "Mavericks + Dir(gamma)".

    The last ``n_mavericks`` clients each own one class (seeded random choice, or
    ``maverick_classes``): floor(``maverick_share`` x its size) samples of it, drawn at random;
    the rest of that class is left out, since no other client may hold it (FedMS Fig. 1: the
    Mavericks' share of data is a reading of its circle sizes; default 1, the whole class).
    Every other class is spread over ALL clients, Mavericks included, with Dir(gamma)
    proportions per class, so non-Mavericks hold only non-Maverick classes. Clients with fewer
    than ``min_size`` samples of the shared classes are repaired as in :func:`dirichlet`,
    within the shared classes.

    MNIST (N=50, 2 Mavericks): with ``maverick_share`` 1 a Maverick holds its whole class
    (about 6,000) plus about 1/50 of the shared classes; with 1/50 it holds as much of its
    class as an average client holds of a shared one (about 120).
    """
    labels, n_classes, class_sizes, rng = _prepare(labels, n_clients, n_classes, seed)
    _require(gamma > 0, f"gamma must be > 0, got {gamma}")
    _require(min_size >= 0, f"min_size must be >= 0, got {min_size}")
    _require(0 < maverick_share <= 1, f"maverick_share must be in (0, 1], got {maverick_share}")
    counts, shared = _maverick_columns(class_sizes, n_clients, n_mavericks, maverick_classes, rng)
    if maverick_share < 1:
        owned = np.floor(maverick_share * counts[:, ~shared]).astype(np.int64)
        _require(np.all(owned.sum(0) >= 1),
                 f"maverick_share {maverick_share} leaves a Maverick no sample of its class")
        counts[:, ~shared] = owned
    counts[:, shared] = _dirichlet_counts(class_sizes[shared], n_clients, gamma, min_size, rng)
    roles = ["benign"] * (n_clients - n_mavericks) + ["maverick"] * n_mavericks
    return _partition(labels, counts, roles, rng)


def _key_only_when_set(fn: Callable, *names: str) -> Callable:
    """Show ``names`` to configs as parameters without a default, so that a config's resolved split
    (its cache key) holds them only where it sets them: the runs stored before they existed keep
    their keys. Their defaults still apply when a config leaves them out."""
    sig = inspect.signature(fn)
    fn.key_only_when_set = frozenset(names)  # not required of a config (SplitKind.required)
    fn.__signature__ = sig.replace(parameters=[
        p.replace(default=inspect.Parameter.empty, kind=inspect.Parameter.KEYWORD_ONLY) if p.name in names else p
        for p in sig.parameters.values()])
    return fn


_key_only_when_set(maverick, "maverick_share")


def maverick_iid(
    labels, n_clients: int = 5, *, seed: int, n_classes: int | None = None, maverick_class: int | None = None
) -> Partition:
    """FedMS §5.1 "4 IID + 1 Maverick": the last client owns one class exclusively.

    Every other class is split evenly over ALL clients: the first N-1 clients are IID
    over the C-1 shared classes and the Maverick also holds an equal share of them
    (FedMS Fig. 1: Mavericks "still contain samples from other classes").

    Fashion-MNIST (N=5): 4 clients x 10,800 (1,200 of each of 9 classes); the Maverick
    holds 10,800 + 6,000 = 16,800. All 60,000 samples are used.
    """
    labels, n_classes, class_sizes, rng = _prepare(labels, n_clients, n_classes, seed)
    chosen = None if maverick_class is None else [maverick_class]
    counts, shared = _maverick_columns(class_sizes, n_clients, 1, chosen, rng)
    every = np.ones((int(shared.sum()), n_clients), dtype=bool)  # each shared class over all clients
    counts[:, shared] = _even_split_rows(every, class_sizes[shared], np.full(len(every), n_clients)).T
    return _partition(labels, counts, ["benign"] * (n_clients - 1) + ["maverick"], rng)


# ------------------------------------------------------------- CELM Maverick / free-rider


def _celm_counts(class_sizes, n_clients, rng, rare_per_maverick, rare_fraction, weak, mavericks_share_common=False):
    """Client x class counts for CELM's Maverick / free-rider splits.

    Clients: benign, then one Maverick per entry of ``rare_per_maverick`` (that many
    rare classes, floor(rare_fraction * n_c) samples each, absent elsewhere), then an
    optional weak free-rider (``weak`` = (n_classes, fraction): that fraction of the most
    abundant common classes). Benign clients (and the Mavericks, with ``mavericks_share_common``)
    split the rest of each common class evenly; leftover rare-class samples are unused.
    """
    n_classes = len(class_sizes)
    n_rare = sum(rare_per_maverick)
    n_special = len(rare_per_maverick) + (weak is not None)
    _require(
        n_clients > n_special,
        f"n_clients must be > {n_special} (Mavericks + free-riders), got {n_clients}",
    )
    _require(
        n_rare < n_classes, f"rare classes in total must be < n_classes={n_classes}, got {n_rare}"
    )
    _require(0 < rare_fraction <= 1, f"rare_fraction must be in (0, 1], got {rare_fraction}")
    class_order = rng.permutation(n_classes)
    rare, common = class_order[:n_rare], class_order[n_rare:]
    counts = np.zeros((n_clients, n_classes), dtype=np.int64)
    n_benign = n_clients - n_special
    owner = n_benign + np.repeat(np.arange(len(rare_per_maverick)), rare_per_maverick)  # Maverick of each rare class
    counts[owner, rare] = _fraction_of(class_sizes[rare], rare_fraction)
    if weak is not None:
        n_weak_classes, weak_fraction = weak
        top = n_classes - n_rare
        _require(
            0 <= n_weak_classes <= top,
            f"free_rider_classes must be in [0, {top}], got {n_weak_classes}",
        )
        _require(
            0 < weak_fraction <= 1, f"free_rider_fraction must be in (0, 1], got {weak_fraction}"
        )
        abundant = common[np.argsort(-class_sizes[common], kind="stable")[:n_weak_classes]]
        counts[-1, abundant] = _fraction_of(class_sizes[abundant], weak_fraction)
    left = class_sizes[common] - counts[:, common].sum(axis=0)  # each common class over the benign clients
    sharers = n_benign + (len(rare_per_maverick) if mavericks_share_common else 0)
    every = np.ones((len(common), sharers), dtype=bool)
    counts[:sharers, common] = _even_split_rows(every, left, np.full(len(common), sharers)).T
    return counts


def _fraction_of(class_sizes, fraction) -> np.ndarray:
    """floor(fraction * n_c), at least 1."""
    return np.maximum(1, np.floor(fraction * class_sizes)).astype(np.int64)


def celm_maverick(
    labels,
    n_clients: int = 5,
    *,
    seed: int,
    n_mavericks: int = 1,
    rare_classes_per_maverick: int = 2,
    rare_fraction: float = 0.1,
    n_classes: int | None = None,
) -> Partition:
    """CELM §6.1 Maverick split (Fig. 3a): Mavericks hold few samples of classes absent elsewhere.

    Each of the last ``n_mavericks`` clients owns ``rare_classes_per_maverick`` classes
    (seeded random), keeping floor(rare_fraction * n_c) samples of each and nothing else;
    no other client holds them, so they are rare globally. The benign clients split every
    other class evenly (IID over the common classes).

    Fashion-MNIST (N=5): 4 benign clients x 12,000 (1,500 of each of 8 classes) and one
    Maverick with 600 + 600 = 1,200 samples of its 2 rare classes.
    """
    return _celm_mavericks(labels, n_clients, seed, n_mavericks, rare_classes_per_maverick, rare_fraction, n_classes,
                           share_common=False)


def celm_maverick_shared(
    labels,
    n_clients: int = 5,
    *,
    seed: int,
    n_mavericks: int = 1,
    rare_classes_per_maverick: int = 2,
    rare_fraction: float = 1.0,
    n_classes: int | None = None,
) -> Partition:
    """A reading of CELM §6.1's Maverick (issue 30): as :func:`celm_maverick`, but the Mavericks also
    take an even share of every common class with the benign clients, so a Maverick is an ordinary
    client that alone holds its rare classes (``rare_fraction`` of each; default the whole class).

    Fashion-MNIST (N=5, defaults): every client holds 1,200 of each of the 8 common classes, and the
    Maverick also all 6,000 + 6,000 samples of its 2 rare classes.
    """
    return _celm_mavericks(labels, n_clients, seed, n_mavericks, rare_classes_per_maverick, rare_fraction, n_classes,
                           share_common=True)


def _celm_mavericks(labels, n_clients, seed, n_mavericks, rare_classes_per_maverick, rare_fraction, n_classes,
                    share_common):
    """The Maverick splits of CELM §6.1 (:func:`celm_maverick`, :func:`celm_maverick_shared`)."""
    labels, n_classes, class_sizes, rng = _prepare(labels, n_clients, n_classes, seed)
    _require(n_mavericks >= 1, f"n_mavericks must be >= 1, got {n_mavericks}")
    _require(
        rare_classes_per_maverick >= 1,
        f"rare_classes_per_maverick must be >= 1, got {rare_classes_per_maverick}",
    )
    rare = [rare_classes_per_maverick] * n_mavericks
    counts = _celm_counts(class_sizes, n_clients, rng, rare, rare_fraction, weak=None,
                          mavericks_share_common=share_common)
    roles = ["benign"] * (n_clients - n_mavericks) + ["maverick"] * n_mavericks
    return _partition(labels, counts, roles, rng)


def celm_free_rider(
    labels,
    n_clients: int = 5,
    *,
    seed: int,
    with_maverick: bool = False,
    free_rider_classes: int = 2,
    free_rider_fraction: float = 0.02,
    rare_classes: int = 2,
    rare_fraction: float = 0.1,
    maverick_shares_common: bool = False,
    n_classes: int | None = None,
) -> Partition:
    """CELM §6.2 FR / FRM splits (Fig. 3b/3c): one weak free-rider, optionally plus a Maverick.

    The last client ("weak_free_rider") keeps floor(free_rider_fraction * n_c) samples of
    each of the ``free_rider_classes`` globally most abundant classes (ties in a seeded
    random order): it trains, on little, redundant data. With ``with_maverick`` (FRM) the
    client before it is a Maverick as in :func:`celm_maverick` (``rare_classes`` classes
    absent elsewhere, floor(rare_fraction * n_c) samples each; with ``maverick_shares_common``
    it also takes an even share of every common class, as in :func:`celm_maverick_shared`).
    Benign clients split the rest of every common class evenly.

    Fashion-MNIST (N=5). FR: 4 benign x 14,940 (1,500 of 8 classes + 1,470 of the 2
    free-rider classes), free-rider 2 x 120 = 240. FRM: 3 benign x 15,920 (2,000 of 6
    classes + 1,960 of the 2 free-rider classes), Maverick 2 x 600 = 1,200, free-rider 240.
    """
    labels, n_classes, class_sizes, rng = _prepare(labels, n_clients, n_classes, seed)
    _require(rare_classes >= 1, f"rare_classes must be >= 1, got {rare_classes}")
    rare = [rare_classes] if with_maverick else []
    weak = (free_rider_classes, free_rider_fraction)
    _require(with_maverick or not maverick_shares_common, "maverick_shares_common needs with_maverick")
    counts = _celm_counts(class_sizes, n_clients, rng, rare, rare_fraction, weak,
                          mavericks_share_common=maverick_shares_common)
    roles = ["benign"] * (n_clients - 1 - len(rare)) + ["maverick"] * len(rare)
    return _partition(labels, counts, roles + ["weak_free_rider"], rng)


# ------------------------------------------------------------ free-riders and adversaries


def free_rider(base: Partition, n_free_riders: int) -> Partition:
    """Mark the last ``n_free_riders`` benign clients of ``base`` as "free_rider".

    Behavioural role (FedMS §5.1): the engine returns the received model unchanged for
    them; their data (and claimed size) stay as in ``base``.
    """
    return _mark_benign(base, n_free_riders, "free_rider", "n_free_riders")


def _mark_benign(base: Partition, count: int, role: str, what: str) -> Partition:
    """``base`` with its last ``count`` benign clients given ``role`` (``what``: the count's name in errors)."""
    roles = np.asarray(base.roles, dtype=object)
    benign = np.flatnonzero(roles == "benign")
    _require(0 <= count <= len(benign), f"{what} must be in [0, {len(benign)}] (the benign clients), got {count}")
    roles[benign[len(benign) - count:]] = role
    return replace(base, roles=roles.tolist())


def adversarial(
    labels,
    *,
    gamma: float,
    seed: int,
    x: torch.Tensor | None = None,
    n_benign: int = 48,
    n_mavericks: int = 2,
    n_label_flip: int = 2,
    n_random_data: int = 2,
    n_random_update: int = 2,
    n_free_riders: int = 2,
    min_size: int = 1,
    n_classes: int | None = None,
) -> Partition:
    """FedMS §5.1 adversarial and free-riding scenario (default 58 clients).

    Data as :func:`maverick` with Dir(gamma) over all clients; client order: benign,
    maverick, label_flip, random_data, random_update, free_rider. The pool is a copy of
    the training set (same indices) in which label-flipping clients' labels become
    C-1-y (this can land on a Maverick class) and random-data clients' images are
    replaced by Gaussian noise with the images' overall mean and std (labels kept).
    ``x`` is needed only with random-data clients (else ``Partition.x`` is None).
    "random_update" and "free_rider" are behavioural roles for the engine.
    """
    role_sizes = {
        "benign": n_benign,
        "maverick": n_mavericks,
        "label_flip": n_label_flip,
        "random_data": n_random_data,
        "random_update": n_random_update,
        "free_rider": n_free_riders,
    }
    for role, n in role_sizes.items():
        _require(n >= 0, f"n_{role} must be >= 0, got {n}")
    _require(x is not None or n_random_data == 0, "x is required when n_random_data > 0")
    n_clients = sum(role_sizes.values())
    base = maverick(labels, n_clients, n_mavericks, gamma, seed, min_size, n_classes)
    n_plain = n_clients - n_mavericks
    order = np.r_[np.arange(n_benign), np.arange(n_plain, n_clients), np.arange(n_benign, n_plain)]
    roles = [role for role, n in role_sizes.items() for _ in range(n)]
    ordered = Partition([base.indices[i] for i in order], base.counts[order], roles)
    return _poison(ordered, labels, x, np.random.default_rng([seed, 1]))


def _poison(partition: Partition, labels, x, rng) -> Partition:
    """Copy the pool, flip labels of label_flip clients, noise images of random_data
    clients, and recount."""
    flipped = _role_indices(partition, "label_flip")
    noised = _role_indices(partition, "random_data")
    y = torch.as_tensor(np.asarray(labels), dtype=torch.int64).clone()
    y[flipped] = partition.n_classes - 1 - y[flipped]
    x_pool = None
    if noised.numel():
        x_pool = x.to(torch.float32, copy=True)
        noise = torch.randn((noised.numel(), *x.shape[1:]), generator=_torch_generator(rng))
        x_pool[noised] = noise * x_pool.std() + x_pool.mean()
    counts = client_class_counts(partition.indices, y.numpy(), partition.n_classes)
    y_pool = y if flipped.numel() else None
    return replace(partition, counts=counts, x=x_pool, y=y_pool)


def _flip_labels(marked: Partition, before: Partition, y) -> Partition:
    """``marked`` with the labels of its newly marked label_flip clients' samples flipped to C - 1 - y (issue 43)."""
    new = [i for i, (a, b) in enumerate(zip(marked.roles, before.roles)) if a == "label_flip" != b]
    pool_y = torch.as_tensor(marked.pool(None, y)[1]).cpu().clone()
    flipped = _client_indices(marked, new)
    pool_y[flipped] = marked.n_classes - 1 - pool_y[flipped]
    return replace(marked, y=pool_y, counts=client_class_counts(marked.indices, pool_y.cpu().numpy(), marked.n_classes))


def _role_indices(partition: Partition, role: str) -> torch.Tensor:
    return _client_indices(partition, np.flatnonzero(np.asarray(partition.roles, dtype=object) == role))


def _client_indices(partition: Partition, clients) -> torch.Tensor:
    """Concatenated sample indices of ``clients`` (None: all) as a torch tensor."""
    chosen = range(partition.n_clients) if clients is None else clients
    parts = [partition.indices[i] for i in chosen]
    return torch.from_numpy(np.concatenate(parts + [np.zeros(0, dtype=np.int64)]))


def _torch_generator(rng: np.random.Generator) -> torch.Generator:
    return torch.Generator().manual_seed(int(rng.integers(2**62)))


# ------------------------------------------------------------------------- transforms


def covariate_shift(
    x: torch.Tensor, y, partition: Partition, sigma: float = 0.05, *, seed: int
) -> Partition:
    """FedSCM §6.1 covariate shift: per client, x -> (I + Lambda) x + delta.

    As in the paper, x is the flattened feature vector (d = channels x pixels) and
    Lambda [d, d], delta [d] have i.i.d. N(0, sigma^2) entries drawn per client (one
    [d, d] draw and one [n_i, d] @ [d, d] product per client). Pass the pool the partition
    indexes (``partition.x`` is used when set). Samples outside every client are left
    unchanged; sigma = 0 is the identity.
    """
    _require(sigma >= 0, f"sigma must be >= 0, got {sigma}")
    x, _ = partition.pool(x, y)
    gen = _torch_generator(np.random.default_rng(seed))
    flat = x.reshape(x.shape[0], -1).float()
    shifted = flat.clone()
    d = flat.shape[1]
    for idx in partition.indices:
        idx = torch.from_numpy(idx)
        mixing = torch.randn(d, d, generator=gen) * sigma
        offset = torch.randn(d, generator=gen) * sigma
        shifted[idx] = flat[idx] + flat[idx] @ mixing.T + offset
    return replace(partition, x=shifted.reshape(x.shape))


def label_noise(x, y, partition: Partition, rate: float, seed: int, clients=None) -> Partition:
    """FLCE §4.7 label noise: round(rate * n_i) random labels of each chosen client
    (None: all) become a uniformly random OTHER class, (y + U{1..C-1}) mod C."""
    _require(0 <= rate <= 1, f"rate must be in [0, 1], got {rate}")
    _, y = partition.pool(x, y)
    rng = np.random.default_rng(seed)
    noisy_y = torch.as_tensor(np.asarray(y), dtype=torch.int64).clone()
    n_classes = partition.n_classes
    for i in range(partition.n_clients) if clients is None else clients:
        idx = partition.indices[i]
        picked = torch.from_numpy(rng.choice(idx, int(round(rate * idx.size)), replace=False))
        shift = torch.from_numpy(rng.integers(1, n_classes, picked.numel()))
        noisy_y[picked] = (noisy_y[picked] + shift) % n_classes
    counts = client_class_counts(partition.indices, noisy_y.numpy(), n_classes)
    return replace(partition, counts=counts, y=noisy_y)


def feature_noise(
    x: torch.Tensor, y, partition: Partition, std: float, seed: int, clients=None
) -> Partition:
    """FLCE §4.7 feature noise: N(0, std^2) added to every feature of the chosen
    clients' samples (None: all)."""
    _require(std >= 0, f"std must be >= 0, got {std}")
    x, _ = partition.pool(x, y)
    idx = _client_indices(partition, clients)
    noisy = x.to(torch.float32, copy=True)
    gen = _torch_generator(np.random.default_rng(seed))
    noisy[idx] += torch.randn((idx.numel(), *x.shape[1:]), generator=gen) * std
    return replace(partition, x=noisy)

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
