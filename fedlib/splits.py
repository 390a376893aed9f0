"""The papers' split kinds and the modifiers of a split.

The Maverick splits (FedMS and CELM: clients owning classes no other client holds), CELM's Maverick
and free-rider splits, and what a config's split may add on top of any split: free-riders, hostile
clients (adversaries, label flips, random data), covariate shift, label and feature noise. Each
takes and returns a :class:`fedlib.allocation.Partition`; ``fedlib.partition`` registers them as
split kinds.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Callable

import numpy as np
import torch

from .allocation import Partition, _dirichlet_counts, _even_split_rows, _partition, _prepare, _require, client_class_counts



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
