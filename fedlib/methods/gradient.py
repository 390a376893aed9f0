"""Gradient-alignment contribution baselines: CGSV (Xu et al. 2021) and ShapFed (Tastan et al. 2024).

Both value client i by cosine similarities between what it sent and a weighted aggregate of
the round's uploads, without data. Each follows its authors' public code (repository, file,
lines in the class docstrings; the book's ``reference/baselines.md`` lists them side by side),
including the per-client models their clients keep between rounds (ShapFed's personalised
broadcast, CGSV's sparsified reward downloads), held by the engine as ``ClientState``.

Partial participation (both codes have every client take part every round): values are
kept for all clients and only the selected ones are updated. A client not seen yet counts as
holding the mean value of the clients seen so far, and 0 before anyone has been seen, so with
full participation everything reduces to the authors' updates. ``scores()`` is 0 for clients
never seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..population import ParamLayout
from .base import ClientState, ClientUpdates, Federation, Method, RoundState, global_model_on_clients, register


def sum_normalised(values: torch.Tensor) -> torch.Tensor:
    """``v / Σ v`` as the authors normalise (signs kept); uniform when ``Σ v <= 0``."""
    total = values.sum()
    if not total > 0:
        return torch.full_like(values, 1.0 / len(values))
    return values / total


def _with_prior(values: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """``values`` [N] with never-seen entries set to the mean of the seen ones (0 when none is seen)."""
    prior = values[seen].mean() if seen.any() else values.new_tensor(0.0)
    return torch.where(seen, values, prior)


def layerwise_top_share(update: torch.Tensor, share: torch.Tensor, numels: list[int]) -> torch.Tensor:
    """CGSV's reward download: per layer (parameter tensor) of ONE update [P], client i keeps
    the entries at least as large in magnitude as the layer's k_i-th largest,
    k_i = min(ceil(L share_i), L - 1) (0 keeps nothing); returns [N, P].

    Follows ``mask_grad_update_by_order(..., mode='layer')`` of their ``utils/utils.py``
    (lines 139-168), including its ``L - 1`` cap. One sort per layer, not per client."""
    share = share.to(update.device, torch.float64).clamp(min=0)
    out = []
    for layer in torch.split(update, numels):  # loop over layers (a handful), clients batched
        size = layer.numel()
        k = torch.clamp(torch.ceil(size * share).long(), max=max(size - 1, 1))
        ordered = layer.abs().sort(descending=True).values
        threshold = ordered[(k - 1).clamp(min=0)]
        keep = (layer.abs().unsqueeze(0) >= threshold.unsqueeze(1)) & (k > 0).unsqueeze(1)
        out.append(layer.unsqueeze(0) * keep)
    return torch.cat(out, dim=1)


@register
@dataclass
class CGSV(Method):
    """CGSV: cosine gradient Shapley value with reputations and fair reward downloads (Xu et al., NeurIPS 2021).

    Source: github.com/XinyiYS/Gradient-Driven-Rewards-to-Guarantee-Fairness-in-Collaborative-Machine-Learning,
    ``main.py`` lines 209-281 (round loop), ``utils/arguments.py`` lines 7-29 / 94-113 (α, Γ),
    ``utils/utils.py`` lines 139-168 (layer-wise download mask). Round t, clients S:

        Δ_i   = w_i - θ_i                           client i's update from ITS model θ_i
        u_i   = Γ Δ_i / (||Δ_i|| + 1e-7)            normalised update (main.py 233-236)
        c_i   = n_i / Σ n_j  (t = 0),  r_{t-1,i}    aggregation weights (main.py 246-250)
        u_N   = Σ_i c_i u_i;   θ_g <- θ_g + u_N     server step (main.py 252-255)
        ψ_i   = cos(u_i, u_N)                       CGSV approximation (paper Eq. 3; main.py 261)
        r_t   = max(α r_{t-1} + (1 - α) ψ, 1e-3),  r_t <- r_t / Σ r_t        (main.py 264-267; r_0 = 0)
        q_i   = tanh(β r_t,i) / max_j tanh(β r_t,j)                          (main.py 270-271)
        θ_i  <- θ_i + top-q_i share of u_N per layer   (every client; its own Δ_i is not kept, 228-229)

    α = 0.95 and Γ = 0.5 (their MNIST arguments; Γ = 0.15 for CIFAR-10); β = 1 (their
    ``main.py`` sweeps β over {0.5, 1, 1.2, 1.5, 2, 1e7}). The engine evaluates the server
    model θ_g. ``download_reward = False``: every client starts from θ_g (no per-client
    models; the β -> ∞ limit). Partial participation (not in their code): weights are the
    reputations of S renormalised over S; only S's reputations move.
    """

    name = "cgsv"
    rule_version = "2"
    alpha: float = 0.95
    gamma: float = 0.5
    beta: float = 1.0
    download_reward: bool = True

    def validate(self) -> None:
        self.check(("alpha", 0 <= self.alpha < 1, "in [0, 1)"), ("gamma", self.gamma > 0, "> 0"),
                   ("beta", self.beta > 0, "> 0"))

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.layout = ParamLayout(fed.model)
        self.reputation = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.seen = torch.zeros(fed.n_clients, dtype=torch.bool)

    def init_client_state(self, fed, global_flat, global_buffers):
        if not self.download_reward:
            return None
        return ClientState.replicate(fed.n_clients, global_flat, global_buffers)

    def normalised_updates(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        delta = updates.deltas(state.global_flat)
        return self.gamma * delta / (delta.norm(dim=1, keepdim=True) + 1e-7)

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        clients = torch.as_tensor(updates.clients, dtype=torch.long)
        if not self.seen.any():  # first round: data-size (FedAvg) weights
            sizes = torch.as_tensor(np.asarray(updates.sizes, dtype=float))
            weights = sizes / sizes.sum() if sizes.sum() > 0 else torch.full_like(sizes, 1.0 / len(sizes))
        else:
            weights = sum_normalised(_with_prior(self.reputation, self.seen)[clients])
        u = self.normalised_updates(state, updates)
        u_n = weights.to(u) @ u
        psi = F.cosine_similarity(u, u_n.unsqueeze(0), dim=1, eps=1e-10).double().cpu()
        previous = self.reputation[clients]  # r_0 = 0 as in their code
        self.reputation[clients] = (self.alpha * previous + (1 - self.alpha) * psi).clamp(min=1e-3)
        self.seen[clients] = True
        self.reputation /= self.reputation.sum()
        return weights.float()

    def server_update(self, state, weights, flat, buffers):
        u = self.normalised_updates(state, state.updates)
        return state.global_flat + weights.to(u) @ u, buffers  # θ_g + Σ c_i u_i

    def download_shares(self) -> torch.Tensor:
        """q_i = tanh(β r_i) / max_j tanh(β r_j) over every client [N]."""
        q = torch.tanh(self.beta * self.reputation)
        return q / q.max() if q.max() > 0 else torch.ones_like(q)

    def update_client_state(self, state, weights, global_flat, global_buffers):
        q = self.download_shares()
        state.round_data["diagnostics"] = {"download_share": q.tolist()}
        reward = layerwise_top_share(global_flat - state.global_flat, q, self.layout.numels)
        cs = state.client_state
        return ClientState(cs.flat + reward.to(cs.flat), cs.buffers, cs.tensors)

    def scores(self) -> np.ndarray:
        return self.reputation.numpy().copy()


@register
@dataclass
class ShapFed(Method):
    """ShapFed-WA: class-specific Shapley values from the classifier layer (Tastan et al., IJCAI 2024).

    Source: github.com/tnurbek/shapfed. ``signal = "params"`` (default): the script the README
    runs, ``main_synthetic.py`` (``compute_cssv`` lines 71-111, round loop 204-269);
    ``signal = "updates"``: ``main_cifar10.py`` (``compute_cssv_cifar`` lines 74-114, round
    loop 233-311). Round t, clients S, values γ_{t-1}:

        a_i^c   = [W_i[c, :], b_i[c]]                   client i's head row for class c: its
                                                        parameters ('params') or update w_i - θ_i
                                                        ('updates'; their (θ_i - w_i)/lr, same cosine)
        ω_i     = γ_{t-1,i} / Σ_{j∈S} γ_{t-1,j}         previous weights (uniform in round 1)
        a^c     = Σ_{i∈S} ω_i a_i^c                     the coalition's row
        σ_i^c   = cos(a_i^c, a^c)                       class-specific Shapley value (CSSV)
        γ_t,i   = μ γ_{t-1,i} + (1 - μ) mean_c σ_i^c     (the plain mean on a client's first round)
        w_i     = γ_t,i / Σ_{j∈S} γ_t,j                 ShapFed-WA weights: θ_g = Σ w_i w_i
        θ_i    <- (1 - κ_i) w_i + κ_i θ_g              personalised broadcast (``broadcast``)

    μ = 0.9 (both scripts). κ_i = γ_t,i for 'params' (synthetic line 269) and w_i for
    'updates' (CIFAR line 311). Their normalisation is a plain sum, kept here (uniform only
    when Σ γ <= 0, where theirs would divide by a non-positive number). ``class_values``
    keeps the μ-smoothed σ [N, C] (in the history's diagnostics). Not implemented: their
    CIFAR script's extra local epochs in round 1 (a client-side schedule). Every client
    starts from the same global model (their synthetic script draws a separate
    initialisation per client).
    """

    name = "shapfed"
    rule_version = "2"
    mu: float = 0.9
    signal: str = "params"
    broadcast: bool = True

    def validate(self) -> None:
        self.check(("mu", 0 <= self.mu < 1, "in [0, 1)"),
                   ("signal", self.signal in ("params", "updates"), "'params' or 'updates'"))

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.layout = ParamLayout(fed.model)
        self.head = fed.model.head_parameter_names()
        self.gamma = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.class_values = torch.zeros(fed.n_clients, fed.n_classes, dtype=torch.float64)
        self.seen = torch.zeros(fed.n_clients, dtype=torch.bool)

    def init_client_state(self, fed, global_flat, global_buffers):
        return ClientState.replicate(fed.n_clients, global_flat, global_buffers) if self.broadcast else None

    def class_rows(self, flat: torch.Tensor) -> torch.Tensor:
        """Head parameters of ``flat`` [n, P] as one row per class: [n, C, D + 1] (weight, bias)."""
        params = self.layout.unflatten(flat)
        n, c = flat.shape[0], self.fed.n_classes
        return torch.cat([params[name].reshape(n, c, -1) for name in self.head], dim=-1)

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        clients = torch.as_tensor(updates.clients, dtype=torch.long)
        seen = self.seen[clients]
        omega = sum_normalised(_with_prior(self.gamma, self.seen)[clients]) if self.seen.any() else \
            torch.full((len(clients),), 1.0 / len(clients), dtype=torch.float64)
        signal = updates.flat if self.signal == "params" else updates.deltas(state.global_flat)
        rows = self.class_rows(signal)
        coalition = torch.einsum("n,ncd->cd", omega.to(rows), rows)
        sigma = F.cosine_similarity(rows, coalition.unsqueeze(0), dim=-1).double().cpu()  # [n, C]
        mu = seen.double() * self.mu  # a client's first value is not smoothed
        self.gamma[clients] = mu * self.gamma[clients] + (1 - mu) * sigma.mean(1)
        self.class_values[clients] = mu[:, None] * self.class_values[clients] + (1 - mu[:, None]) * sigma
        self.seen[clients] = True
        return sum_normalised(self.gamma[clients]).float()

    def update_client_state(self, state, weights, global_flat, global_buffers):
        updates = state.updates
        clients = torch.as_tensor(updates.clients, dtype=torch.long)
        kappa = (self.gamma[clients] if self.signal == "params" else weights.double().cpu()).to(updates.flat)
        mixed = (1 - kappa).unsqueeze(1) * updates.flat + kappa.unsqueeze(1) * global_flat
        return state.client_state.with_rows(updates.clients, flat=mixed, buffers=updates.buffers)

    def scores(self) -> np.ndarray:
        return self.gamma.numpy().copy()

    def diagnostics(self, state):
        return {"class_values": self.class_values.tolist()}  # server state: the μ-smoothed σ so far


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
        self.check(("alpha", 0 <= self.alpha <= 1, "in [0, 1]"),
                   ("tau", self.tau >= 0 and float(self.tau).is_integer(), "an integer >= 0"))

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.history: list[torch.Tensor] = []  # the server's last τ directions g_h (server state)

    def client_uploads(self, state, clients, flat, buffers, data):
        loss, _ = global_model_on_clients(self.fed, state, data)
        return {"loss": loss}

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        n = len(updates.clients)
        return torch.full((n,), 1.0 / n)

    def server_update(self, state, weights, flat, buffers):
        updates = state.updates  # the round's uploads, with their losses l_k
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
