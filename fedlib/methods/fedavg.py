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

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        return sample_count_weights(updates.sizes)


@register
@dataclass
class FedAvgUniform(Method):
    """w_g = 1/|S| sum_i w_i: no client-reported metadata (CELM's FedAvg baseline)."""

    name = "fedavg_uniform"

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        n = len(updates.clients)
        return torch.full((n,), 1.0 / n)


@register
@dataclass
class FedProx(Method):
    """Local objective F_i(w) + mu/2 ||w - w_g||^2; sample-count aggregation."""

    name = "fedprox"
    mu: float = 0.01

    def validate(self) -> None:
        if self.mu < 0:
            raise ValueError(f"method 'fedprox': mu must be >= 0 (got {self.mu})")

    def local_training(self, state, base, clients):
        return replace(base, prox_mu=self.mu)

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        return sample_count_weights(updates.sizes)
