"""The valuation library: a round's clients valued by the coalitions of their updates.

Coalition utilities (batched, memoized), the Shapley estimators, leave-one-out and the
Maverick-Shapley pieces (coreset, class difficulty). It registers no method: the Shapley-based
methods (FedMS, S-FedAvg, GreedyFed, FedSV, ...) are in ``fedlib.methods.shapley``.

A coalition Q of the round's n clients is valued by the model its members' updates make
(the gradient-reconstruction of MR / TMR / GTG: no retraining). With the round's trained
models as rows of ``W`` [n, P] and client weights ``a`` (sample counts, Eq. 3), a batch of
M coalitions is a boolean matrix ``S`` [M, n] and their models are ONE matmul

    W_Q = (S * a) / Σ_j (S * a)_j  @  W                    ModelAverage({w_i}_{i∈Q})

evaluated together on the server's validation set in one batched pass
(``fedlib.population.evaluate``). The utility is the class-wise accuracy (FedMS Eq. 7)

    V^c(w) = N^{cc} / Σ_j N^{cj}                            [M, C]

or, for the Maverick-unaware baselines, the plain validation accuracy [M]. The empty
coalition's utility is the previous global model's. Every coalition is evaluated at most
once per round (a memo keyed by the coalition's bitmask), so estimators may ask for the
same coalition again for free.

Estimators (all take a ``utility`` returning [M] or [M, C] and return φ [n] or [n, C]):

- ``exact_shapley``      Eq. 6 over all 2^n coalitions (n <= 16; MR evaluates exactly this).
- ``leave_one_out``      U(K) - U(K \\ {i}).
- ``monte_carlo_shapley`` mean marginal over random permutations (all prefixes of all
                          permutations in one batched call).
- ``gtg_shapley``        GTG-Shapley (Liu et al. 2022; FedMS Alg. 1): guided permutations
                          starting with each player in turn, between-round truncation ε_b,
                          within-round truncation ε_i, the convergence rule of Eq. 11.
- ``mr_shapley``         MR (Song et al. 2019): the exact Shapley value of the round's
                          clients on reconstructed models (accumulation across rounds is the
                          method's, Eq. 8).
- ``tmr_shapley``        TMR (Wei et al. 2020; FedMS Alg. 4): MR with the between-round
                          truncation ε_b.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from .population import aggregate, evaluate

__all__ = [
    "CoalitionUtility",
    "all_coalitions",
    "best_coalition",
    "class_difficulty",
    "coalition_utility",
    "exact_shapley",
    "gtg_shapley",
    "leave_one_out",
    "monte_carlo_shapley",
    "mr_shapley",
    "tmr_shapley",
]

MAX_MEMO_PLAYERS = 62  # coalitions are memoized by an int64 bitmask


# ----------------------------------------------------------------------------- utility


def _bits(n: int, device=None) -> torch.Tensor:
    return torch.ones(n, dtype=torch.long, device=device) << torch.arange(n, device=device)


def coalition_keys(coalitions: torch.Tensor) -> torch.Tensor:
    """int64 bitmask of each coalition row ``[M, n]`` (player i <-> bit i)."""
    coalitions = torch.as_tensor(coalitions).to(torch.bool)
    return (coalitions.long() * _bits(coalitions.shape[1], coalitions.device)).sum(1)


def coalitions_of_keys(keys: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`coalition_keys`: ``[M, n]`` booleans."""
    return (keys.unsqueeze(1) & _bits(n, keys.device)) != 0


def all_coalitions(n: int) -> torch.Tensor:
    """Every subset of n players as ``[2^n, n]`` booleans; row k is the bitmask k."""
    return coalitions_of_keys(torch.arange(2**n), n)


class CoalitionUtility:
    """The utility of coalitions of the round's clients (rows of ``flat`` [n, P]), a callable
    ``utility(coalitions [M, n] bool) -> [M, C]`` (class-wise accuracy, Eq. 7) or ``[M]``
    (validation accuracy) when ``classwise=False``; see the module docstring.

    ``weights`` [n] (e.g. sample counts; None = equal) weigh a coalition's members;
    ``empty_flat`` [P] (and ``empty_buffers``) is the previous global model, the empty
    coalition. ``evaluations`` counts the models evaluated so far (each coalition at most
    once); ``evaluated()`` returns the memoized coalitions and their values (used to pick
    GTG's coreset among the coalitions it looked at).
    """

    def __init__(self, model, flat, buffers, weights, x_val, y_val, n_classes, empty_flat,
                 empty_buffers=None, classwise=True, chunk=32):
        self.model, self.flat = model, flat
        self.buffers = buffers or {}
        self.n = flat.shape[0]
        if self.n > MAX_MEMO_PLAYERS:
            raise ValueError(f"coalition_utility: at most {MAX_MEMO_PLAYERS} players (got {self.n})")
        weights = torch.ones(self.n) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
        if weights.shape != (self.n,) or bool((weights <= 0).any()):
            raise ValueError(f"coalition_utility: weights must be {self.n} positive numbers")
        self.weights = weights.to(flat.device, flat.dtype)
        self.x_val, self.y_val, self.n_classes = x_val, y_val, n_classes
        self.empty_flat = empty_flat.reshape(1, -1).to(flat)
        self.empty_buffers = {k: v.unsqueeze(0) for k, v in (empty_buffers or {}).items()}
        self.classwise = classwise
        self.chunk = chunk
        self.keys = torch.zeros(0, dtype=torch.long)  # sorted
        self.values = torch.zeros(0, n_classes)  # per-class accuracy, rows follow keys
        self.evaluations = 0

    # the batched evaluation ------------------------------------------------------------
    def _evaluate(self, keys: torch.Tensor) -> torch.Tensor:
        """Per-class accuracy [len(keys), C] of the coalitions ``keys`` (chunks of ``chunk``)."""
        out = []
        for lo in range(0, len(keys), self.chunk):  # memory-bounded chunks of coalitions
            part = keys[lo:lo + self.chunk]
            members = coalitions_of_keys(part, self.n).to(self.flat.device)
            a = members.to(self.flat.dtype) * self.weights
            empty = a.sum(1) == 0
            a = a / a.sum(1, keepdim=True).clamp(min=1e-30)
            flat, bufs = aggregate(self.flat, a, self.buffers)  # S @ W: one matmul
            if empty.any():  # the empty coalition is the previous global model
                flat[empty] = self.empty_flat
                for k in bufs:
                    bufs[k][empty] = self.empty_buffers[k].to(bufs[k])
            ev = evaluate(self.model, flat, bufs, self.x_val, self.y_val, self.n_classes)
            out.append(ev.per_class_accuracy.cpu())
        self.evaluations += len(keys)
        return torch.cat(out) if out else torch.zeros(0, self.n_classes)

    def per_class(self, coalitions: torch.Tensor) -> torch.Tensor:
        """Class-wise accuracy [M, C] of each coalition, from the memo where possible."""
        coalitions = torch.as_tensor(coalitions).to(torch.bool).cpu()
        if coalitions.dim() != 2 or coalitions.shape[1] != self.n:
            raise ValueError(f"utility: coalitions must be a [M, {self.n}] boolean tensor")
        keys = coalition_keys(coalitions)
        new = torch.unique(keys[~torch.isin(keys, self.keys)])
        if len(new):
            self.keys, order = torch.sort(torch.cat([self.keys, new]))
            self.values = torch.cat([self.values, self._evaluate(new)])[order]
        return self.values[torch.searchsorted(self.keys, keys)]

    def __call__(self, coalitions: torch.Tensor) -> torch.Tensor:
        pca = self.per_class(coalitions)
        if self.classwise:
            return pca
        counts = torch.bincount(self.y_val.cpu(), minlength=self.n_classes).to(pca)
        return pca @ (counts / counts.sum())  # plain validation accuracy

    def evaluated(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(coalitions [K, n] bool, class-wise accuracy [K, C]) evaluated so far."""
        return coalitions_of_keys(self.keys, self.n), self.values.clone()


coalition_utility = CoalitionUtility  # the name the callers use


# ----------------------------------------------------------------------------- helpers


def _as_matrix(values: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """[M] -> [M, 1] (remember to squeeze back), [M, C] unchanged; float64."""
    values = torch.as_tensor(values).to(torch.float64)
    return (values.unsqueeze(1), True) if values.dim() == 1 else (values, False)


def _rng(rng) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _shape(phi: torch.Tensor, scalar: bool) -> torch.Tensor:
    return phi.squeeze(1) if scalar else phi


def _scalar(values: torch.Tensor, class_weights: torch.Tensor | None) -> torch.Tensor:
    """[.., C] -> [..]: Σ_c β^c v^c with β the class weights (the mean when None)."""
    if class_weights is None:
        return values.mean(-1)
    return values @ torch.as_tensor(class_weights, dtype=values.dtype)


# ----------------------------------------------------------------------------- estimators


def exact_shapley(utility: Callable, n: int) -> torch.Tensor:
    """Eq. 6: φ_i = Σ_{Q ⊆ K\\{i}} |Q|!(n-|Q|-1)!/n! (U(Q ∪ {i}) - U(Q)), per class.

    All 2^n coalitions are valued in one call of ``utility``; returns [n, C] (or [n]).
    """
    if not 1 <= n <= 16:
        raise ValueError(f"exact_shapley: n must be in [1, 16] (got {n})")
    coalitions = all_coalitions(n)  # row k = bitmask k
    u, scalar = _as_matrix(utility(coalitions))
    size = coalitions.sum(1)
    # Shapley weight of a coalition Q not containing i: |Q|! (n - |Q| - 1)! / n!
    w = torch.tensor([math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) if s < n else 0.0
                      for s in range(n + 1)], dtype=torch.float64)
    keys = torch.arange(2**n)
    with_i = keys.unsqueeze(1) | _bits(n)  # [2^n, n]: Q ∪ {i}
    outside = ~coalitions  # i ∉ Q
    marginal = u[with_i] - u.unsqueeze(1)  # [2^n, n, C]
    phi = torch.einsum("qi,qic->ic", outside.double() * w[size].unsqueeze(1), marginal)
    return _shape(phi, scalar)


def mr_shapley(utility: Callable, n: int) -> torch.Tensor:
    """MR (Song et al. 2019; FedMS Alg. 3 line 8): the exact Shapley value of the round's clients
    on reconstructed subset models; the accumulation over rounds is the caller's (Eq. 8)."""
    return exact_shapley(utility, n)


def _gap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| of class-value vectors [.., C]: the largest class difference (max-norm), so a
    truncation fires only when no class moved by the threshold; plain |a - b| for C = 1."""
    return (a - b).abs().amax(-1)


def _between_round_gap(utility: Callable, n: int):
    """|v_N - v_0| (max over classes), v_0, v_N and whether the utility is scalar."""
    ends = torch.zeros(2, n, dtype=torch.bool)
    ends[1] = True
    v, scalar = _as_matrix(utility(ends))
    return float(_gap(v[1], v[0])), v[0], v[1], scalar


def tmr_shapley(utility: Callable, n: int, eps_between: float = 0.001) -> torch.Tensor:
    """TMR (Wei et al. 2020; FedMS Alg. 4): φ = 0 when the round changed no class's utility by
    more than ε_b (between-round truncation, line 6), else the exact (MR) value."""
    gap, v0, _, scalar = _between_round_gap(utility, n)
    if gap <= eps_between:
        return _shape(torch.zeros(n, v0.shape[0], dtype=torch.float64), scalar)
    return exact_shapley(utility, n)


def leave_one_out(utility: Callable, n: int) -> torch.Tensor:
    """φ_i = U(K) - U(K \\ {i}); one call for the n + 1 coalitions. [n, C] (or [n])."""
    coalitions = torch.ones(n + 1, n, dtype=torch.bool)
    coalitions[torch.arange(n), torch.arange(n)] = False
    u, scalar = _as_matrix(utility(coalitions))
    return _shape(u[n].unsqueeze(0) - u[:n], scalar)


def _prefix_values(utility: Callable, perms: torch.Tensor):
    """(position [R, n] of each player in each order, U of all R (n + 1) prefixes [R, n + 1, C]
    from one batched call, whether the utility is scalar) for permutations ``perms`` [R, n]."""
    r, n = perms.shape
    position = torch.empty_like(perms)
    position.scatter_(1, perms, torch.arange(n).expand(r, n))  # position[p, i] of player i
    prefixes = position.unsqueeze(1) < torch.arange(n + 1).view(1, n + 1, 1)  # [R, n+1, n]
    u, scalar = _as_matrix(utility(prefixes.reshape(-1, n)))
    return position, u.view(r, n + 1, -1), scalar


def _prefix_marginals(utility: Callable, perms: torch.Tensor):
    """Marginal contributions along permutations ``perms`` [R, n]: [R, n, C] indexed by
    player (not position)."""
    position, u, scalar = _prefix_values(utility, perms)
    by_position = u[:, 1:] - u[:, :-1]  # [R, n, C]
    return torch.gather(by_position, 1, position.unsqueeze(-1).expand(-1, -1, u.shape[-1])), scalar


def monte_carlo_shapley(utility: Callable, n: int, permutations: int, rng=None,
                        truncation: float | None = None) -> torch.Tensor:
    """Monte-Carlo permutation sampling: φ_i = mean over random orders of U(pre_i ∪ {i}) - U(pre_i).

    All prefixes of all ``permutations`` orders are valued in one call. ``truncation`` (TMC,
    Ghorbani & Zou 2019): marginals after the first prefix within ``truncation`` of U(K)
    count as 0. Returns [n, C] (or [n]).
    """
    if permutations < 1:
        raise ValueError(f"monte_carlo_shapley: permutations must be >= 1 (got {permutations})")
    rng = _rng(rng)
    perms = torch.from_numpy(np.argsort(rng.random((permutations, n)), axis=1))
    marginal, scalar = _prefix_marginals(utility, perms)
    if truncation is not None:
        marginal = marginal * _not_truncated(utility, perms, truncation).unsqueeze(-1)
    return _shape(marginal.mean(0), scalar)


def _not_truncated(utility, perms, eps):
    """[R, n] (by player): 1 while |U(K) - U(prefix before the player)| >= eps along each order."""
    position, u, _ = _prefix_values(utility, perms)
    close = _gap(u[:, -1:], u[:, :-1]) < eps  # [R, n] by position j: before the j-th player
    alive = torch.cumprod((~close).double(), dim=1)  # once truncated, truncated for the rest
    return torch.gather(alive, 1, position)


def gtg_shapley(utility: Callable, n: int, rng=None, eps_between: float = 0.001, eps_within: float = 0.001,
                tolerance: float = 0.05, window: int | None = None, max_iterations: int = 50,
                min_iterations: int = 2, class_weights=None, return_info: bool = False,
                stopping: str = "eq11", rescale: bool = False, orderings: str = "all"):
    """GTG-Shapley (Liu et al. 2022), the estimator of FedMS Algorithm 1.

    - between-round truncation (line 7): φ = 0 unless |v_N - v_0| > ε_b (for class-wise
      values: some class moved by more than ε_b, i.e. the max-norm);
    - guided sampling (line 11): each iteration draws n permutations, the k-th starting
      with player k, the rest in random order;
    - within-round truncation (line 15): along an order, once |v_N - v_{j-1}| < ε_i (max-norm) the
      remaining players' marginals are 0 (and their coalitions are not evaluated);
    - φ_{π[j]} <- (r-1)/r φ_{π[j]} + (v_j - v_{j-1}) / r  (line 22), per class;
    - stop when Eq. 11 holds: 1/(n m) Σ_{j=1..m} Σ_i |φ_i^[r] - φ_i^[r-j]| / |φ_i^[r]| < tolerance,
      with φ_i = Σ_c β^c φ_i^c (``class_weights`` β; class mean when None), m = ``window``
      (default n: the last guided iteration), checked after each iteration of n orders,
      at least ``min_iterations`` and at most ``max_iterations`` iterations.

    ``stopping = "original"`` and ``rescale = True`` follow the GTG-Shapley authors' code
    instead (github.com/cyyever/torch_algorithm at d09097c; the folder was ``shapely_value/``
    before it became ``cyy_torch_algorithm/shapley_value/``: ``gtg_shapley_value.py``
    ``GTGShapleyValue.__init__`` lines 19-31 (budget), ``_compute_impl`` lines 34-142 and
    ``not_convergent`` lines 153-179; ``shapley_value.py`` ``RoundBasedShapleyValue.compute``
    lines 94-114 (between-round truncation) and ``normalize_shapley_values`` lines 56-69):
    - budget: at least max(30, n) and at most min(2^n, max(30, 0.8 · 2^n)) permutations
      (theirs adds a random ±5 to 0.8 · 2^n), checked after each iteration of n orders;
    - stop when, over the running means φ^[r-k] of the last 10 permutations,
      max_k mean_i |φ_i^[r-k] - φ_i^[r]| / (|φ_i^[r]| + 1e-12) <= ``tolerance``;
    - rescale (per class): with the round's gain G = v_N - v_0, φ <- G φ / Σ_{φ_j >= 0} φ_j
      when G >= 0, else G φ / Σ_{φ_j < 0} φ_j (a zero sum counts as ±1e-9), so the
      positive (negative) values add up to the gain. Their coreset (best_S) values are not
      computed here.

    ``orderings``: which sampled orders the final mean runs over. ``"all"``: every draw, a
    repeated order once per draw. ``"authors"``: as ``GTGShapleyValue._compute_impl`` of the
    authors' code (cyyever/torch_algorithm at d09097c, ``cyy_torch_algorithm/shapley_value/
    gtg_shapley_value.py`` lines 41-42 and 89 keep a dict ``perm_records`` of orders, so a
    repeated order counts once; lines 92-98 pick best_S, the evaluated coalition with the
    highest utility, ties to the smaller one; lines 115-118 report the full-set values from
    that dict when best_S is the grand coalition; lines 119-132 average every draw
    otherwise). So: when the grand coalition was evaluated along some order and its value
    (Σ_c β^c v^c for class-wise values) is strictly above that of every other coalition the
    orders evaluated, φ is the mean over the distinct orders; otherwise over every draw. The
    stopping rule sees every draw in both cases (their ``not_convergent`` reads all records).

    The n orders of one iteration advance together position by position: one batched
    utility call per position for the orders not yet truncated. Returns φ [n, C] (or [n]);
    with ``return_info`` also a dict (permutations used, converged, truncated_round, the drawn
    ``orderings`` [R, n] and ``distinct``: whether the mean ran over the distinct orders).
    """
    if stopping not in ("eq11", "original"):
        raise ValueError(f"gtg_shapley: stopping must be 'eq11' or 'original' (got {stopping!r})")
    if orderings not in ("all", "authors"):
        raise ValueError(f"gtg_shapley: orderings must be 'all' or 'authors' (got {orderings!r})")
    if n < 1:
        raise ValueError(f"gtg_shapley: n must be >= 1 (got {n})")
    rng = _rng(rng)
    window = window or n
    gap, v0, vn, scalar = _between_round_gap(utility, n)
    n_c = v0.shape[0]
    phi = torch.zeros(n, n_c, dtype=torch.float64)
    info = {"permutations": 0, "converged": False, "truncated_round": gap <= eps_between,
            "orderings": torch.zeros(0, n, dtype=torch.long), "distinct": False}
    if gap <= eps_between:  # line 7
        return (_shape(phi, scalar), info) if return_info else _shape(phi, scalar)
    trail = []  # φ_i^[r] (scalar) after every permutation r
    drawn, marginals = [], []  # every order [n] and its marginals by player [n, C]
    seen_keys, seen_values = [], []  # coalitions the orders evaluated and their scalar utility
    r = 0
    iterations = max_iterations if stopping == "eq11" else math.ceil(max(30, n, 0.8 * 2**n) / n) + 1
    for iteration in range(iterations):
        rest = np.argsort(rng.random((n, n)), axis=1)
        rest = rest[rest != np.arange(n)[:, None]].reshape(n, n - 1)  # drop the leading player
        perms = torch.from_numpy(np.concatenate([np.arange(n)[:, None], rest], axis=1))  # line 11
        prefix = torch.zeros(n, n, dtype=torch.bool)
        prev = v0.expand(n, n_c).clone()  # v_0^[r] = v_0 (line 12)
        marg = torch.zeros(n, n, n_c, dtype=torch.float64)  # [order, position, class]
        alive = torch.ones(n, dtype=torch.bool)
        for j in range(n):  # positions (all n orders at once), not subsets
            alive &= _gap(vn, prev) >= eps_within  # line 15
            if not alive.any():
                break
            prefix[torch.arange(n), perms[:, j]] = True
            rows = torch.nonzero(alive).squeeze(1)
            v, _ = _as_matrix(utility(prefix[rows]))  # lines 16-18
            seen_keys.append(coalition_keys(prefix[rows]))
            seen_values.append(_scalar(v, class_weights))
            marg[rows, j] = v - prev[rows]
            prev[rows] = v  # truncated orders keep v_j = v_{j-1} (line 20)
        by_player = torch.zeros_like(marg)
        by_player.scatter_(1, perms.unsqueeze(-1).expand(-1, -1, n_c), marg)
        drawn.append(perms)
        marginals.append(by_player)
        for k in range(n):  # line 22, one permutation r at a time (keeps the trail for Eq. 11)
            r += 1
            phi = (r - 1) / r * phi + by_player[k] / r
            trail.append(_scalar(phi, class_weights))
        info["permutations"] = r
        if stopping == "original":
            if r >= min(2**n, max(30, n, int(0.8 * 2**n))):  # their max_number (without the ±5)
                break
            if r <= max(30, n):  # their converge_min
                continue
            recent = torch.stack(trail[-10:])
            errors = ((recent - recent[-1]).abs() / (recent[-1].abs() + 1e-12)).mean(-1)
            if float(errors.max()) <= tolerance:
                info["converged"] = True
                break
            continue
        if iteration + 1 >= min_iterations and len(trail) > window:
            now = trail[-1]
            past = torch.stack(trail[-1 - window:-1])  # φ^[r-j], j = 1..m
            change = ((now - past).abs() / now.abs().clamp(min=1e-12)).sum() / (n * window)  # Eq. 11
            if change < tolerance:
                info["converged"] = True
                break
    info["orderings"] = torch.cat(drawn)
    if orderings == "authors" and _grand_coalition_best(torch.cat(seen_keys), torch.cat(seen_values), n):
        phi = _mean_over_distinct(info["orderings"], torch.cat(marginals))
        info["distinct"] = True
    if rescale:
        phi = rescale_to_gain(phi, vn - v0)
    return (_shape(phi, scalar), info) if return_info else _shape(phi, scalar)


def _grand_coalition_best(keys: torch.Tensor, values: torch.Tensor, n: int) -> bool:
    """Whether the grand coalition is among ``keys`` and its value is strictly above every other
    coalition's (their best_S: highest value, ties to the smaller coalition)."""
    grand = keys == (1 << n) - 1
    return bool(grand.any()) and (not bool((~grand).any()) or float(values[grand].max()) > float(values[~grand].max()))


def _mean_over_distinct(perms: torch.Tensor, marginals: torch.Tensor) -> torch.Tensor:
    """Mean marginals [n, C] over the distinct orders of ``perms`` [R, n] (``marginals`` [R, n, C]
    by player; a repeated order has the same marginals, so each counts once)."""
    _, inverse = torch.unique(perms, dim=0, return_inverse=True)
    sums = torch.zeros(int(inverse.max()) + 1, *marginals.shape[1:], dtype=marginals.dtype)
    sums.index_add_(0, inverse, marginals)
    return (sums / torch.bincount(inverse).to(sums).view(-1, 1, 1)).mean(0)


def rescale_to_gain(phi: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """GTG's ``normalize_shapley_values`` per class column of ``phi`` [n, C] with gains [C]:
    φ G / Σ_{φ_j >= 0} φ_j when G >= 0, else φ G / Σ_{φ_j < 0} φ_j (a zero sum counts as ±1e-9)."""
    gain = torch.as_tensor(gain, dtype=phi.dtype)
    positive = torch.where(phi >= 0, phi, torch.zeros_like(phi)).sum(0)
    negative = torch.where(phi < 0, phi, torch.zeros_like(phi)).sum(0)
    total = torch.where(gain >= 0, positive, negative)
    tiny = torch.where(gain >= 0, torch.full_like(total, 1e-9), torch.full_like(total, -1e-9))
    total = torch.where(total.abs() < 1e-12, tiny, total)
    return phi * gain / total


# ----------------------------------------------------------------------------- Maverick-Shapley pieces


def best_coalition(utility: CoalitionUtility | Callable, n: int, among: torch.Tensor | None = None):
    """Coreset (FedMS Alg. 1 line 24): the non-empty coalition with the highest summed
    class-wise accuracy, and its class-wise accuracy v̂ [C].

    ``among`` [K, n] restricts the search (default: every coalition when n <= 16, else
    the coalitions the utility has evaluated)."""
    if among is None:
        if n <= 16:
            among = all_coalitions(n)[1:]
        else:
            among = utility.evaluated()[0]
    among = among[among.any(1)]
    if len(among) == 0:
        raise ValueError("best_coalition: no non-empty coalition to choose from")
    u, _ = _as_matrix(utility(among))
    best = int(torch.argmax(u.sum(1)))
    return among[best].clone(), u[best].clone()


def class_difficulty(class_accuracy: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. 10: β^c = exp((1 - v̂^c)/T) / Σ_c' exp((1 - v̂^c')/T)."""
    return torch.softmax((1.0 - torch.as_tensor(class_accuracy, dtype=torch.float64)) / temperature, dim=-1)

