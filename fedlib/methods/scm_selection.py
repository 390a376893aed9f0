"""FedSCM's weights used as a selection inside the round-based engine (the leaderboard's row).

FedSCM (``fedlib.methods.scm``) is a one-shot rule: given the K client models' predictive
distributions on n unlabeled target inputs, pick weights λ on the capped simplex that minimise
the mean entropy of the mixed prediction. Here it runs every round of ordinary federated
training, with the server's validation inputs as the unlabeled target set (their labels are
never read):

    h_k(X) = softmax(f(X; w_k)),  X ∈ V, k ∈ K^t            every trained client, one batched pass
    λ^t = argmin_{λ ≥ 0, Σλ = 1, λ_k ≤ 1 − γ} (1/n) Σ_X H(Σ_k λ_k h_k(X))     (FedSCM Eq. 1, Alg. 1)
    w^{t+1} = Σ_k λ_k^t w_k                                  the selection is the aggregation
    s_k = (1/t) Σ_τ λ_k^τ                                    contribution: mean weight so far

The selected clients are those with a non-zero weight (λ_k > ``scm.SUPPORT_TOL``), as the paper
selects; the solver's weights are used as they come (``rounding="vertex"`` moves them to
Theorem 3's vertex first, an option) and renormalised to sum 1 for the aggregation (Algorithm 1's
clip-and-renormalise step can leave Σλ < 1, e.g. 3 × 0.33 at γ = 0.67). A client that was not
trained this round gets λ = 0.

Rule version 2: selection by support (was: the vertex's clients), Algorithm 1's clip-and-renormalise
PGD step by default (was: the Euclidean projection).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..population import predict
from . import scm
from .base import ClientUpdates, Federation, Method, RoundState, register


def client_probabilities(fed: Federation, updates: ClientUpdates, batch_size: int = 1024) -> torch.Tensor:
    """h_k(X) for every trained client k and validation input X: ``[K, n, C]`` (one batched pass)."""
    logits = predict(fed.model, updates.flat, updates.buffers, fed.x_val, batch_size=batch_size)
    return torch.softmax(logits.double(), dim=-1)


@register
@dataclass
class FedSCMSelection(Method):
    name = "fedscm_select"
    rule_version = "2"  # support selection + Algorithm 1's projection by default
    needs_validation = True  # the inputs only: FedSCM's target set is unlabeled

    gamma: float = 0.5  # sparsity: at most 1 − γ weight per client, ⌈1/(1 − γ)⌉ clients selected
    solver: str = "pgd"
    kappa: float = 0.0  # quantity-shift penalty κ Σ λ_k / n_k (FedSCM Def. 10); 0 = off
    projection: str = "paper"  # PGD step: Algorithm 1's clip-and-renormalise, or "euclidean"
    rounding: str = "none"  # "vertex": move the solver's output to Theorem 3's vertex first

    def validate(self) -> None:
        scm.check_gamma(self.gamma)
        self.check(("solver", self.solver in scm.SOLVERS, f"one of {', '.join(scm.SOLVERS)}"),
                   ("kappa", self.kappa >= 0, ">= 0"),
                   ("projection", self.projection in scm.PROJECTIONS, f"one of {', '.join(scm.PROJECTIONS)}"),
                   ("rounding", self.rounding in scm.ROUNDINGS, f"one of {', '.join(scm.ROUNDINGS)}"))

    def check_run(self, rounds: int, n_clients: int) -> None:
        selected = scm.vertex_counts(self.gamma)[2]
        if selected > n_clients:
            raise ValueError(f"method 'fedscm_select': gamma = {self.gamma} selects {selected} clients per round, "
                             f"more than the {n_clients} clients")

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.total = np.zeros(fed.n_clients)
        self.rounds_seen = 0

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        probs = client_probabilities(self.fed, updates).cpu()  # h_k(X), [K, n, C]; the solver runs on the CPU
        k = probs.shape[0]
        if scm.vertex_counts(self.gamma)[2] > k:  # fewer trained clients than the vertex needs: plain average
            lam = torch.full((k,), 1.0 / k, dtype=torch.float64)
            objective = float(scm.objective(lam, probs))
        else:
            sizes = torch.as_tensor(np.maximum(updates.sizes, 1), dtype=torch.float64)
            extra = {"projection": self.projection} if self.solver == "pgd" else {}
            chosen = scm.select(probs, self.gamma, self.solver, kappa=self.kappa, rounding=self.rounding,
                                sizes=sizes if self.kappa else None, **extra)  # Eq. 1 (+ Eq. 7), Alg. 1
            lam = torch.where(chosen.weights > scm.SUPPORT_TOL, chosen.weights, torch.zeros_like(chosen.weights))
            lam, objective = lam / lam.sum(), chosen.objective
        self.rounds_seen += 1
        self.total[updates.clients] += lam.cpu().numpy()  # s_k: mean λ_k over the rounds so far
        state.round_data["diagnostics"] = {"lambda": lam.tolist(), "objective": objective}
        return lam.float()

    def scores(self) -> np.ndarray:
        return self.total / max(self.rounds_seen, 1)
