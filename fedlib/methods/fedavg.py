"""FedAvg (McMahan et al. 2017) with sample-count or uniform weights, and FedProx (Li et al. 2020)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .base import ClientUpdates, Method, RoundState, register


def sample_count_weights(sizes) -> torch.Tensor:
    """c_i = n_i / sum_j n_j  (FedAvg)."""
    sizes = torch.as_tensor(sizes, dtype=torch.float32)
    return sizes / sizes.sum().clamp(min=1.0)


@register
@dataclass
class FedAvg(Method):
    """w_g = sum_i n_i / n * w_i over the selected clients."""

    name = "fedavg"

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        return sample_count_weights(updates.sizes)


@register
@dataclass
class FedAvgUniform(Method):
    """w_g = 1/|S| sum_i w_i: no client-reported metadata (CELM's FedAvg baseline)."""

    name = "fedavg_uniform"

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        n = len(updates.clients)
        return torch.full((n,), 1.0 / n)


@register
@dataclass
class FedProx(Method):
    """Local objective F_i(w) + mu/2 ||w - w_g||^2; sample-count aggregation."""

    name = "fedprox"
    mu: float = 0.01

    def validate(self) -> None:
        self.check(("mu", self.mu >= 0, ">= 0"))

    def local_training(self, state, base, clients):
        return replace(base, prox_mu=self.mu)

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        return sample_count_weights(updates.sizes)


@register
@dataclass
class Cohort(Method):
    """A fixed cohort trained with fixed aggregation weights: w_g = Σ_k λ_k w_k / Σ_k λ_k over the
    round's clients, FedProx locally (μ ≥ 0), at most ``max_steps`` SGD steps per client and round.
    FedSCM's post-selection training (Algorithm 2, steps 4-5): the federation is the selected
    clients, λ the selection's weights, the start their λ-average (``Prepared.init``)."""

    name = "cohort"
    weights: list[float] | None = None  # λ, one per client (None: sample counts, FedAvg)
    mu: float = 0.0
    max_steps: int | None = None

    def validate(self) -> None:
        self.check(("mu", self.mu >= 0, ">= 0"),
                   ("max_steps", self.max_steps is None or self.max_steps >= 1, ">= 1 or None"),
                   ("weights", self.weights is None or (all(w >= 0 for w in self.weights) and sum(self.weights) > 0),
                    ">= 0 with a positive sum"))

    def check_run(self, rounds: int, n_clients: int) -> None:
        if self.weights is not None and len(self.weights) != n_clients:
            raise ValueError(f"method 'cohort': weights must have one entry per client ({n_clients}), "
                             f"got {len(self.weights)}")

    def local_training(self, state, base, clients):
        return replace(base, prox_mu=self.mu, max_steps=self.max_steps)

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        if self.weights is None:
            return sample_count_weights(updates.sizes)
        lam = torch.as_tensor(self.weights, dtype=torch.float64)[torch.as_tensor(updates.clients)]
        return (lam / lam.sum()).float()  # λ renormalised over the round's clients (all of them, or a draw)
