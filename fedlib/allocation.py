"""What a split hands out and how: the :class:`Partition` every split returns, the client roles, and
the count-matrix and index-drawing helpers the splits are built from (``fedlib.partition``: the
generic splits and the split kinds a config names; ``fedlib.splits``: the papers' splits and the
modifiers).

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

from dataclasses import dataclass

import numpy as np
import torch


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

