"""The Shapley-based methods: FedMS (Maverick-Shapley), the Shapley rewards, S-FedAvg, GreedyFed and FedSV.

They value a round's clients with the valuation library ``fedlib.valuation`` (coalition utilities on
the server's validation set, exact / MR / TMR / GTG / Monte-Carlo Shapley, leave-one-out) and select
or weigh clients by those values (FedMS Eq. 12: a softmax over the scores).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..valuation import (CoalitionUtility, best_coalition, class_difficulty, coalition_utility, exact_shapley,
                         gtg_shapley, monte_carlo_shapley, mr_shapley, tmr_shapley)
from .base import ClientUpdates, Federation, Method, RoundState, register
from .fedavg import sample_count_weights

#
# Shared choices (the paper is silent; the chapter page states them):
# - the utility's validation set is the engine's server validation set (``server_val``
#   samples held out of the training set), where the paper uses 20 % of the test set;
# - a coalition's model weighs its members by sample count (Eq. 3), the empty coalition is
#   the previous global model;
# - Eq. 12 is softmax(Ŝ_i) as printed, on scores that are accuracy fractions (``score_scale``
#   = 1, the default). ``score_scale`` = 100 (scores in percentage points, our earlier
#   reading) is an option: with fractions the softmax over 50 clients is nearly uniform
#   (ratio at most e). The chapter runs both. S-FedAvg likewise (its softmax is unscaled in
#   the public implementation the FedMS authors compare with, see ``SFedAvg``).


def selection_probabilities(scores, scale: float = 1.0) -> np.ndarray:
    """Eq. 12: P_i = exp(s Ŝ_i) / Σ_j exp(s Ŝ_j) with s = ``scale`` (1: as printed)."""
    z = scale * np.asarray(scores, dtype=float)
    p = np.exp(z - z.max())
    return p / p.sum()


def _softmax_sample(rng: np.random.Generator, scores: np.ndarray, k: int) -> np.ndarray:
    """k distinct clients drawn with probabilities softmax(scores) (Eq. 12), sorted."""
    p = selection_probabilities(scores)
    p = (p + 1e-12) / (p + 1e-12).sum()  # every client stays drawable (k distinct draws)
    return np.sort(rng.choice(len(scores), size=k, replace=False, p=p))


class _ShapleyMethod(Method):
    """Helpers shared by the Shapley-based methods."""

    needs_validation = True

    def round_utility(self, state: RoundState, updates: ClientUpdates, classwise: bool = True) -> CoalitionUtility:
        fed = self.fed
        return coalition_utility(fed.model, updates.flat, updates.buffers, self.client_sizes(updates),
                                 fed.x_val, fed.y_val, fed.n_classes, state.global_flat,
                                 state.global_buffers, classwise=classwise)

    @staticmethod
    def uniform_view(utility: CoalitionUtility) -> Callable:
        """The plain-accuracy utility over the same memo (a class-wise utility underneath)."""
        counts = torch.bincount(utility.y_val.cpu(), minlength=utility.n_classes).double()
        freq = counts / counts.sum()
        return lambda coalitions: utility.per_class(coalitions).double() @ freq

    @staticmethod
    def client_sizes(updates: ClientUpdates) -> torch.Tensor:
        """The round's clients' sample counts (a client reporting 0 samples counts 1), float32."""
        return torch.as_tensor(np.maximum(updates.sizes, 1), dtype=torch.float32)

    def fedavg_weights(self, updates: ClientUpdates) -> torch.Tensor:
        """Sample-count weights of the round's clients."""
        sizes = self.client_sizes(updates)
        return sizes / sizes.sum()

    def eps_rules(self) -> tuple:
        return ("eps_between", self.eps_between >= 0, ">= 0"), ("eps_within", self.eps_within >= 0, ">= 0")


def _estimate(name: str, utility: Callable, n: int, rng, eps_between: float, eps_within: float,
              class_weights=None, permutations: int = 50):
    """φ by the named estimator (gtg | mr | tmr | mc | exact) and the coalitions it evaluated
    for the coreset search (None: all)."""
    if name == "gtg":
        return gtg_shapley(utility, n, rng, eps_between=eps_between, eps_within=eps_within,
                           class_weights=class_weights), "evaluated"
    if name in ("mr", "exact"):
        return mr_shapley(utility, n), None
    if name == "tmr":
        return tmr_shapley(utility, n, eps_between=eps_between), None
    if name == "mc":
        return monte_carlo_shapley(utility, n, permutations, rng), None
    raise ValueError(f"estimator must be one of gtg, mr, tmr, mc, exact (got {name!r})")


ESTIMATORS = ("gtg", "mr", "tmr", "mc", "exact")


@register
@dataclass
class FedMS(_ShapleyMethod):
    """FedMS (Algorithm 2) with Maverick-Shapley (Algorithm 1: MS-GTG; MS-MR / MS-TMR, Alg. 3-4).

    Round t, selected clients K^t, their updates w_i, the global model w^t:
        φ_i^c            class-wise Shapley value (Eq. 6 with the utility of Eq. 7), by GTG
        K̂^t, v̂           coreset: the coalition with the highest Σ_c V^c (Alg. 1 line 24)
        β^c  = softmax_c((1 - v̂^c) / T)                        class difficulty (Eq. 10)
        S_i^c = α S_i^c + (1 - α) φ_i^c,  i ∈ K^t             accumulated value (Eq. 8)
        Ŝ_i  = Σ_c β^c S_i^c,             every client i      contribution score (Eq. 9)
        R_i^t = Σ_c β^c φ_i^c,            i ∈ K^t             Shapley reward (Eq. 13)
        P_i  = softmax_i(s Ŝ_i), s = ``score_scale`` (1: Eq. 12 as printed)  selection (Eq. 12)
        w^{t+1} = Σ_{i∈K̂^t} n_i w_i / Σ n_i                    coreset aggregation (§4.2)
    Divergence guard (§5.1): with d̂ = Σ_c v̂^c - Σ_c V^c(w^t), the coreset is discarded
    (w^{t+1} = w^t) when d̂ < 0 and |d̂| > ε_d; ε_d decays exponentially from ``eps_d_start``
    at the first round to ``eps_d_end`` at the last.
    Round 0 (footnote 1): every client trains; S_i^c = V^c(w_i) of its update, the global
    model is their sample-count average, and β comes from that model's class accuracies.
    GTG's convergence (Eq. 11) and truncations weigh classes with the previous round's β.
    """

    name = "fedms"
    rule_version = "2"  # 2: Eq. 12 unscaled by default (was ×100)
    estimator: str = "gtg"
    alpha: float = 0.6
    temperature: float = 0.01
    eps_between: float = 0.001
    eps_within: float = 0.001
    eps_d_start: float = 3.0
    eps_d_end: float = 0.1
    score_scale: float = 1.0  # 100: the scaled-softmax variant
    init_all: bool = True
    coreset: bool = True

    def validate(self) -> None:
        self.check(("estimator", self.estimator in ESTIMATORS, f"one of {', '.join(ESTIMATORS)}"), *self.eps_rules(),
                   ("alpha", 0 <= self.alpha < 1, "in [0, 1)"), ("temperature", self.temperature > 0, "> 0"))
        if not 0 < self.eps_d_end <= self.eps_d_start:
            raise ValueError(f"method 'fedms': need 0 < eps_d_end <= eps_d_start (got {self.eps_d_end}, "
                             f"{self.eps_d_start})")
        self.check(("score_scale", self.score_scale > 0, "> 0"))

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.S = torch.zeros(fed.n_clients, fed.n_classes, dtype=torch.float64)
        self.S_hat = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.beta = torch.full((fed.n_classes,), 1.0 / fed.n_classes, dtype=torch.float64)

    def eps_d(self, t: int) -> float:
        """ε_d(t) = ε_start (ε_end / ε_start)^(t / (T - 1))  (exponential decay, §5.1)."""
        span = max(self.fed.rounds - 1, 1)
        return self.eps_d_start * (self.eps_d_end / self.eps_d_start) ** (t / span)

    def select_clients(self, state: RoundState) -> np.ndarray:
        n, k = self.fed.n_clients, self.fed.clients_per_round
        if k >= n or (state.round == 0 and self.init_all):
            return np.arange(n)
        return _softmax_sample(state.rng, self.score_scale * self.S_hat.numpy(), k)  # Eq. 12

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        clients = torch.as_tensor(updates.clients, dtype=torch.long)
        n = len(clients)
        u = self.round_utility(state, updates)
        sizes = self.client_sizes(updates)
        if state.round == 0 and self.init_all:  # footnote 1: initial scores from the updates
            singles = torch.eye(n, dtype=torch.bool)
            every = torch.ones(1, n, dtype=torch.bool)
            values = u(torch.cat([singles, every])).double()
            self.S[clients] = values[:n]
            self.beta = class_difficulty(values[n], self.temperature)
            self.S_hat = self.S @ self.beta
            state.round_data["diagnostics"] = {"beta": self.beta.tolist(), "coreset": updates.clients.tolist()}
            return sizes / sizes.sum()
        phi, among = _estimate(self.estimator, u, n, state.rng, self.eps_between, self.eps_within, self.beta)
        members, v_hat = best_coalition(u, n, u.evaluated()[0] if among == "evaluated" else None)
        v0 = u(torch.zeros(1, n, dtype=torch.bool))[0].double()
        self.beta = class_difficulty(v_hat, self.temperature)  # Eq. 10 (Alg. 1 line 26)
        self.S[clients] = self.alpha * self.S[clients] + (1 - self.alpha) * phi  # Eq. 8
        self.S_hat = self.S @ self.beta  # Eq. 9
        rewards = phi @ self.beta  # Eq. 13
        d_hat = float(v_hat.sum() - v0.sum())
        discarded = d_hat < 0 and abs(d_hat) > self.eps_d(state.round)  # §5.1 divergence guard
        if not self.coreset:
            members = torch.ones(n, dtype=torch.bool)
        weights = sizes * members.float() * (not discarded)
        state.round_data["diagnostics"] = {
            "rewards": rewards.tolist(), "beta": self.beta.tolist(),
            "coreset": updates.clients[members.numpy()].tolist() if not discarded else [],
            "d_hat": d_hat, "eps_d": self.eps_d(state.round), "evaluations": u.evaluations}
        return weights / weights.sum() if weights.sum() > 0 else weights

    def scores(self) -> np.ndarray:
        return self.S_hat.numpy().copy()


@register
@dataclass
class ShapleyRewards(_ShapleyMethod):
    """FedAvg aggregation with Shapley rewards of every round's clients (FedMS Fig. 2).

    Each round values the clients twice over one memo of coalition evaluations:
    GTG with the plain validation accuracy (``rewards_gtg``) and MS-GTG, Σ_c β^c φ_i^c with
    β from the coreset's class accuracies (Eq. 10, 13; ``rewards_ms``). Training is plain
    FedAvg and does not depend on the values. ``excluded`` clients never take part (the
    "without Mavericks" curve of Fig. 2).
    """

    name = "shapley_rewards"
    estimator: str = "gtg"
    temperature: float = 0.01
    eps_between: float = 0.001
    eps_within: float = 0.001
    excluded: tuple = ()

    def validate(self) -> None:
        self.check(("estimator", self.estimator in ESTIMATORS, f"one of {', '.join(ESTIMATORS)}"), *self.eps_rules(),
                   ("temperature", self.temperature > 0, "> 0"),
                   ("excluded", all(isinstance(i, int) and i >= 0 for i in self.excluded), "client ids >= 0"))

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        if any(i >= fed.n_clients for i in self.excluded):
            raise ValueError(f"method 'shapley_rewards': excluded ids must be < {fed.n_clients}")
        self.beta = torch.full((fed.n_classes,), 1.0 / fed.n_classes, dtype=torch.float64)

    def select_clients(self, state: RoundState) -> np.ndarray:
        pool = np.setdiff1d(np.arange(self.fed.n_clients), np.asarray(self.excluded, dtype=np.int64))
        k = min(self.fed.clients_per_round, len(pool))
        return pool if k >= len(pool) else np.sort(state.rng.choice(pool, size=k, replace=False))

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        n = len(updates.clients)
        u = self.round_utility(state, updates)
        plain, _ = _estimate(self.estimator, self.uniform_view(u), n, state.rng, self.eps_between,
                             self.eps_within)
        phi, among = _estimate(self.estimator, u, n, state.rng, self.eps_between, self.eps_within, self.beta)
        _, v_hat = best_coalition(u, n, u.evaluated()[0] if among == "evaluated" else None)
        self.beta = class_difficulty(v_hat, self.temperature)  # Eq. 10
        state.round_data["diagnostics"] = {
            "rewards_gtg": plain.tolist(), "rewards_ms": (phi @ self.beta).tolist(),  # Eq. 13
            "class_values": phi.tolist(), "beta": self.beta.tolist()}
        return self.fedavg_weights(updates)


@register
@dataclass
class SFedAvg(_ShapleyMethod):
    """S-FedAvg (Nagalapatti & Narayanam 2021, "Game of Gradients"), as FedMS §5.1 runs it.

    Values v_i (0 at the start); each round draws K^t with P_i = softmax_i(s v_i), s =
    ``score_scale`` (1 by default, as in ``sfedavg_run`` of pringlesinghal/GreedyFed,
    algorithms.py, whose selection probabilities are exp(Phi) / Σ exp(Phi); 100, scores in
    percentage points, is the scaled variant), values the selected clients with MR — the exact Shapley value of
    the round's clients on reconstructed models with the plain validation accuracy, all
    permutations, no Monte-Carlo (§5.1) — updates v_i = α v_i + (1 - α) φ_i for i ∈ K^t
    (α = 0.7, §5.1), and aggregates the selected clients with FedAvg weights.
    The Shapley reward of a selected client is its round value φ_i. Source: FedMS §5.1; the
    re-implementation in github.com/pringlesinghal/GreedyFed ``algorithms.py`` ``sfedavg_run``
    differs (book/reference/baselines.md).
    """

    name = "s_fedavg"
    rule_version = "2"  # 2: softmax unscaled by default (was ×100)
    alpha: float = 0.7
    score_scale: float = 1.0  # 100: the scaled-softmax variant

    def validate(self) -> None:
        self.check(("alpha", 0 <= self.alpha < 1, "in [0, 1)"), ("score_scale", self.score_scale > 0, "> 0"))

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.values = np.zeros(fed.n_clients)

    def select_clients(self, state: RoundState) -> np.ndarray:
        n, k = self.fed.n_clients, self.fed.clients_per_round
        if k >= n:
            return np.arange(n)
        return _softmax_sample(state.rng, self.score_scale * self.values, k)

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        u = self.round_utility(state, updates)
        phi = mr_shapley(self.uniform_view(u), len(updates.clients)).numpy()
        c = updates.clients
        self.values[c] = self.alpha * self.values[c] + (1 - self.alpha) * phi
        state.round_data["diagnostics"] = {"rewards": phi.tolist()}
        return self.fedavg_weights(updates)

    def scores(self) -> np.ndarray:
        return self.values.copy()


@register
@dataclass
class GreedyFed(_ShapleyMethod):
    """GreedyFed (Singhal et al. 2024): greedy selection by GTG-Shapley values.

    Source: github.com/pringlesinghal/GreedyFed at 563d991, ``algorithms.py`` ``ucb_run``
    (β = 0 is GreedyFed), read for the selection (0-based round t, N clients, K per round):
    - t < floor(N/K): round-robin, clients tK .. (t+1)K - 1;
    - t = floor(N/K): the clients not seen yet plus K(t+1) - N drawn uniformly from the seen
      ones; when K divides N none is left unseen and the round draws K clients uniformly
      from all N (a random round, e.g. round 10 of the FedMS profile, N = 50, K = 5);
    - later: the top K of SV_i + β sqrt(log(t) / N_i). Their ``UCB`` is computed at the end
      of round t - 1 with ``np.log(t + 1)`` of that round's index, i.e. log(t) of the round
      that selects (N_i = rounds client i took part so far).
    Here ``ucb`` is β (0 = greedy, the paper's main variant). Values: GTG with the plain
    validation accuracy, by default as the GTG authors' code runs it (``gtg = "original"``:
    their permutation budget, stopping rule, distinct-order mean and rescaling to the
    round's gain, see :func:`gtg_shapley`; ``"eq11"``: FedMS's Eq. 11 rule, every draw). The first value of a client is its φ_i, later v_i = α v_i + (1 - α) φ_i (α = 0.7,
    FedMS §5.1, ``average = "ema"``) or the running mean of its φ as in ``ucb_run``
    (``average = "mean"``). Their code's own GTG scores 1 - validation loss with thresholds
    1e-4; the FedMS protocol (accuracy, 0.001) is kept here.
    FedAvg aggregation of the selected clients; the Shapley reward is φ_i.
    """

    name = "greedyfed"
    rule_version = "3"  # 3: ucb_run's random round N/K, log(t) bonus; GTG's distinct-order mean
    alpha: float = 0.7
    ucb: float = 0.0
    eps_between: float = 0.001
    eps_within: float = 0.001
    gtg: str = "original"
    average: str = "ema"

    def validate(self) -> None:
        self.check(*self.eps_rules(), ("alpha", 0 <= self.alpha < 1, "in [0, 1)"), ("ucb", self.ucb >= 0, ">= 0"),
                   ("gtg", self.gtg in ("original", "eq11"), "'original' or 'eq11'"),
                   ("average", self.average in ("ema", "mean"), "'ema' or 'mean'"))

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.values = np.zeros(fed.n_clients)
        self.taken = np.zeros(fed.n_clients)

    def select_clients(self, state: RoundState) -> np.ndarray:
        n, k = self.fed.n_clients, self.fed.clients_per_round
        if k >= n:
            return np.arange(n)
        if n % k == 0 and state.round == n // k:  # ucb_run's round floor(N/K) when K | N: uniform
            return np.sort(state.rng.choice(n, size=k, replace=False))
        unseen = np.flatnonzero(self.taken == 0)
        if len(unseen):  # round-robin initialisation
            first = unseen[:k]
            rest = np.setdiff1d(np.arange(n), first)
            extra = state.rng.choice(rest, size=k - len(first), replace=False) if len(first) < k else []
            return np.sort(np.concatenate([first, np.asarray(extra, dtype=np.int64)]))
        bonus = self.ucb * np.sqrt(np.log(max(state.round, 1)) / np.maximum(self.taken, 1))  # ucb_run: log(t)
        return np.sort(np.argsort(-(self.values + bonus), kind="stable")[:k])

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        u = self.round_utility(state, updates)
        phi = gtg_shapley(self.uniform_view(u), len(updates.clients), state.rng, eps_between=self.eps_between,
                          eps_within=self.eps_within, stopping="original" if self.gtg == "original" else "eq11",
                          rescale=self.gtg == "original",
                          orderings="authors" if self.gtg == "original" else "all").numpy()
        c = updates.clients
        first = self.taken[c] == 0
        self.taken[c] += 1
        if self.average == "mean":  # ucb_run: SV_i <- ((N_i - 1) SV_i + φ_i) / N_i
            self.values[c] = self.values[c] + (phi - self.values[c]) / self.taken[c]
        else:
            self.values[c] = np.where(first, phi, self.alpha * self.values[c] + (1 - self.alpha) * phi)
        state.round_data["diagnostics"] = {"rewards": phi.tolist()}
        return self.fedavg_weights(updates)

    def scores(self) -> np.ndarray:
        return self.values.copy()


@register
@dataclass
class FedSV(Method):
    """FedSV (Wang, Rausch, Zhang, Jia, Song 2020): the federated Shapley value. Each round the
    server values the selected clients by Shapley values of the coalition game whose utility is
    the validation accuracy of the sample-count-weighted average of the members' uploads (the
    empty coalition is the previous global model); values add up over rounds (a client not
    selected gets 0 that round). Estimated by Monte-Carlo permutation sampling (FLCE §4.1.2),
    or exactly over all 2^K coalitions with ``exact`` (the 'canonical Shapley value' of FLCE
    Fig. 4). Aggregation: sample-count weights (FedAvg). ``scores()``: Σ_t φ_t clamped at 0,
    normalised. Uses ``fedlib.valuation`` (coalition utility, estimators). Source: the paper
    (Wang et al. 2020; no public code by its authors found); no truncation of permutations."""

    name = "fedsv"
    needs_validation = True
    permutations: int = 20
    exact: bool = False
    seed: int = 0

    def validate(self) -> None:
        self.check(("permutations", self.permutations >= 1 and float(self.permutations).is_integer(),
                    "an integer >= 1"))

    def setup(self, fed: Federation) -> None:
        if fed.x_val is None or fed.y_val is None:
            raise ValueError("method 'fedsv': needs the server's validation set (Federation.x_val, y_val)")
        super().setup(fed)
        self.total = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.rng = np.random.default_rng(self.seed)

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:

        fed, n = self.fed, len(updates.clients)
        utility = coalition_utility(fed.model, updates.flat, updates.buffers,
                                    torch.as_tensor(updates.sizes, dtype=torch.float32).clamp(min=1),
                                    fed.x_val, fed.y_val, fed.n_classes, state.global_flat,
                                    state.global_buffers, classwise=False)
        phi = exact_shapley(utility, n) if self.exact else monte_carlo_shapley(utility, n, int(self.permutations),
                                                                              self.rng)
        self.total[torch.as_tensor(updates.clients, dtype=torch.long)] += phi.double().cpu()
        return sample_count_weights(updates.sizes)

    def scores(self) -> np.ndarray:
        positive = self.total.clamp(min=0)
        return (positive / positive.sum()).numpy() if positive.sum() > 0 else positive.numpy()
