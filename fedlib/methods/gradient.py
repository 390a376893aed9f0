"""Gradient-alignment contribution baselines: CGSV (Xu et al. 2021) and ShapFed (Tastan et al. 2024).

Both value client i by cosine similarities between its update ``Δ_i = w_i - w_g`` and a
weighted aggregate of the round's updates, without data or client metadata. A true gradient
is ``(w_g - w_i) / lr``; the sign and the positive factor cancel in every cosine below, so the
updates are used directly.

Partial participation (both papers assume every client takes part every round): values are
kept for all clients and only the selected ones are updated. A client not seen yet counts as
holding the mean value of the clients seen so far, and 0 before anyone has been seen, so the
first round is uniform and, with full participation, everything reduces to the papers'
updates. ``scores()`` is 0 for clients never seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..population import ParamLayout
from .base import ClientUpdates, Federation, Method, RoundState, register


def simplex(values: torch.Tensor) -> torch.Tensor:
    """``max(v, 0) / sum max(v, 0)``; uniform when no entry is positive (e.g. all similarities <= 0)."""
    positive = values.clamp(min=0)
    total = positive.sum()
    if not total > 0:
        return torch.full_like(values, 1.0 / len(values))
    return positive / total


def _with_prior(values: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """``values`` [N] with never-seen entries set to the mean of the seen ones (0 when none is seen)."""
    prior = values[seen].mean() if seen.any() else values.new_tensor(0.0)
    return torch.where(seen, values, prior)


@register
@dataclass
class CGSV(Method):
    """CGSV: cosine gradient Shapley value with a reputation moving average (Xu et al., NeurIPS 2021).

    Round t, selected clients S, reputations r_{t-1} (Algorithm 1 and the authors' code,
    github.com/XinyiYS/Gradient-Driven-Rewards-to-Guarantee-Fairness-in-Collaborative-Machine-Learning):

        u_i   = Δ_i / (||Δ_i|| + 1e-7)                 normalised update (their Γ scale cancels below)
        c_i   = r_{t-1,i} / Σ_{j∈S} r_{t-1,j}          aggregation weights (uniform in the first round)
        u_N   = Σ_{i∈S} c_i u_i
        ψ_i   = cos(u_i, u_N)                          CGSV approximation (paper Eq. 3)
        r_t,i = max(α r_{t-1,i} + (1 - α) ψ_i, 1e-3),  then r_t <- r_t / Σ r_t

    with α = 0.95 (their code, every dataset). The global model is the c-weighted average of
    the uploads (this engine's aggregation); the paper's server instead adds Γ·u_N, i.e. it
    steps with normalised updates, which simplex weights over the uploads cannot express. The
    first round is uniform here, where their code uses data-size (FedAvg) weights: no client
    metadata, as in CELM's protocol. Not implemented: the reward mechanism (each agent
    downloads a sparsified aggregate whose density follows tanh(β r_i)); it shapes what
    clients receive, not the aggregation or the contribution estimate.
    """

    name = "cgsv"
    alpha: float = 0.95

    def validate(self) -> None:
        if not 0 <= self.alpha < 1:
            raise ValueError(f"method 'cgsv': alpha must be in [0, 1) (got {self.alpha})")

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.reputation = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.seen = torch.zeros(fed.n_clients, dtype=torch.bool)

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        clients = torch.as_tensor(updates.clients, dtype=torch.long)
        previous = _with_prior(self.reputation, self.seen)[clients]
        weights = simplex(previous).float()
        delta = updates.flat - state.global_flat
        u = delta / (delta.norm(dim=1, keepdim=True) + 1e-7)
        u_n = weights.to(u) @ u
        psi = F.cosine_similarity(u, u_n.unsqueeze(0), dim=1, eps=1e-10).double().cpu()
        r = self.alpha * previous + (1 - self.alpha) * psi
        self.reputation[clients] = r.clamp(min=1e-3)
        self.seen[clients] = True
        self.reputation /= self.reputation.sum()
        return weights

    def scores(self) -> np.ndarray:
        return self.reputation.numpy().copy()


@register
@dataclass
class ShapFed(Method):
    """ShapFed-WA: class-specific Shapley values from the classifier layer (Tastan et al., IJCAI 2024).

    Round t, selected clients S, contributions γ_{t-1} (the authors' code,
    github.com/tnurbek/shapfed, ``compute_cssv_cifar`` and its round loop):

        a_i^c   = [ΔW_i[c, :], Δb_i[c]]                    client i's head row for class c
        ω_i     = γ_{t-1,i} / Σ_{j∈S} γ_{t-1,j}            previous weights (uniform in round 1)
        a^c     = Σ_{i∈S} ω_i a_i^c                        the coalition's row
        σ_i^c   = cos(a_i^c, a^c)                          class-specific Shapley value (CSSV)
        γ̂_i     = (1/C) Σ_c σ_i^c
        γ_t,i   = μ γ_{t-1,i} + (1 - μ) γ̂_i              (γ̂_i on a client's first round)
        weights = γ_t,i / Σ_{j∈S} γ_t,j                    ShapFed-WA aggregation (this round)

    μ = 0.5 as in their CIFAR-10 script (their synthetic and Fed-ISIC2019 scripts use 0.95).
    Their normalisation is a plain sum (a softmax is commented out); here negative γ count as
    0 and all γ <= 0 gives uniform weights, so the weights are always on the simplex.
    ``class_values`` keeps the μ-smoothed σ [N, C]. Not implemented: the personalised
    broadcast w̄_i = (1 - γ_i) w_i + γ_i w_g and the adaptive local epochs (client side).
    """

    name = "shapfed"
    mu: float = 0.5

    def validate(self) -> None:
        if not 0 <= self.mu < 1:
            raise ValueError(f"method 'shapfed': mu must be in [0, 1) (got {self.mu})")

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.layout = ParamLayout(fed.model)
        self.head = fed.model.head_parameter_names()
        self.gamma = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.class_values = torch.zeros(fed.n_clients, fed.n_classes, dtype=torch.float64)
        self.seen = torch.zeros(fed.n_clients, dtype=torch.bool)

    def class_rows(self, delta: torch.Tensor) -> torch.Tensor:
        """Head parameters of ``delta`` [n, P] as one row per class: [n, C, D + 1] (weight, bias)."""
        params = self.layout.unflatten(delta)
        n, c = delta.shape[0], self.fed.n_classes
        return torch.cat([params[name].reshape(n, c, -1) for name in self.head], dim=-1)

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        clients = torch.as_tensor(updates.clients, dtype=torch.long)
        seen = self.seen[clients]
        omega = simplex(_with_prior(self.gamma, self.seen)[clients])
        rows = self.class_rows(updates.flat - state.global_flat)
        coalition = torch.einsum("n,ncd->cd", omega.to(rows), rows)
        sigma = F.cosine_similarity(rows, coalition.unsqueeze(0), dim=-1).double().cpu()  # [n, C]
        mu = seen.double() * self.mu  # a client's first value is not smoothed
        self.gamma[clients] = mu * self.gamma[clients] + (1 - mu) * sigma.mean(1)
        self.class_values[clients] = mu[:, None] * self.class_values[clients] + (1 - mu[:, None]) * sigma
        self.seen[clients] = True
        return simplex(self.gamma[clients]).float()

    def scores(self) -> np.ndarray:
        return self.gamma.numpy().copy()


@register
@dataclass
class FedFV(Method):
    """FedFV: federated learning with fair averaging (Wang et al., IJCAI 2021), Algorithm 1.

    Round t, selected clients with pseudo-gradients g_k = w^t - w_k and training losses l_k
    (the received global model's loss on k's data, sent by the client):
        order the clients by l_k (ascending); the ⌈α (K - 1)⌉ with the largest loss keep g_k
        for every other k, for j in that order (j ≠ k):  if g_k'·g_j < 0:
            g_k' <- g_k' - (g_k'·g_j / ||g_j||²) g_j                       (gradient projection)
        g = mean_k g_k';  for each of the last τ rounds' g_h (newest first):
            if g·g_h < 0:  g <- g - (g·g_h / ||g_h||²) g_h
        g <- g ||mean_k g_k|| / ||g||                               (the plain average's norm)
        w^(t+1) = w^t - g
    α = 0.1, τ = 1 (the paper's defaults for CIFAR-10). The projections of one step are
    batched over the clients; the sequence of steps is the algorithm's own order.
    Aggregation weights reported: uniform (the server step is not a weighted average)."""

    name = "fedfv"
    alpha: float = 0.1
    tau: int = 1

    def validate(self) -> None:
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"method 'fedfv': alpha must be in [0, 1] (got {self.alpha})")
        if self.tau < 0 or not float(self.tau).is_integer():
            raise ValueError(f"method 'fedfv': tau must be an integer >= 0 (got {self.tau})")

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.history: list[torch.Tensor] = []

    def client_uploads(self, state, clients, flat, buffers, data):
        from .fairness import global_model_on_clients

        loss, _ = global_model_on_clients(self.fed, state, data)
        return {"loss": loss}

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        self._updates = updates
        n = len(updates.clients)
        return torch.full((n,), 1.0 / n)

    def server_update(self, state, weights, flat, buffers):
        updates, self._updates = self._updates, None
        g = state.global_flat - updates.flat  # pseudo-gradients [K, P]
        return state.global_flat - fair_direction(g, updates.extras["loss"], self.alpha, self.history,
                                                  int(self.tau)), buffers


def fair_direction(g: torch.Tensor, loss: torch.Tensor, alpha: float, history: list, tau: int) -> torch.Tensor:
    """FedFV's server direction from pseudo-gradients g [K, P] and losses [K] (see :class:`FedFV`);
    appends the result to ``history`` (the last ``tau`` kept)."""
    k = g.shape[0]
    order = torch.argsort(loss.to(g.device), stable=True)
    keep = torch.zeros(k, dtype=torch.bool, device=g.device)
    if alpha > 0:
        keep[order[math.ceil((k - 1) * (1 - alpha)):]] = True
    projected = g.clone()
    norms = g.square().sum(1).clamp(min=1e-30)
    rows = torch.arange(k, device=g.device)
    for j in order.tolist():  # the algorithm's sequence; every step projects all clients at once
        dot = projected @ g[j]
        conflict = (dot < 0) & (rows != j) & ~keep
        projected -= (conflict * dot / norms[j]).unsqueeze(1) * g[j]
    direction = projected.mean(0)
    for past in reversed(history[-tau:] if tau else []):
        dot = direction @ past
        if dot < 0:
            direction = direction - dot / past.square().sum().clamp(min=1e-30) * past
    target = g.mean(0).norm()
    direction = direction * (target / direction.norm().clamp(min=1e-30))
    history.append(direction.detach().clone())
    del history[: max(0, len(history) - max(tau, 1))]
    return direction
