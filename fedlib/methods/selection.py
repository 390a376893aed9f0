"""Client-selection baselines of FedMS §5: Power-of-Choice (Cho et al. 2022) and FedEMD
(Huang et al. 2022). Both aggregate the selected clients with FedAvg weights; they differ
only in whom they select. Their client-side reports (local losses, label distributions)
come from ``Federation.client_data``: each client computes them on its own data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..population import flat_indices, predict
from .base import ClientUpdates, Federation, Method, RoundState, register
from .fedavg import sample_count_weights


def local_losses(model, flat: torch.Tensor, buffers: dict, data) -> torch.Tensor:
    """Mean cross-entropy of ONE model (``flat`` [P]) on each client's data: [n].

    All clients' samples go through one batched forward pass; per-client means come from
    one ``bincount`` over the owners."""
    index, owner, sizes = flat_indices(data.indices)
    if int(sizes.sum()) == 0:
        return torch.zeros(len(sizes))
    x, y = data.x[index.to(data.x.device)], data.y[index.to(data.y.device)]
    logits = predict(model, flat.unsqueeze(0), {k: v.unsqueeze(0) for k, v in buffers.items()}, x)[0]
    loss = F.cross_entropy(logits, y, reduction="none").cpu().double()
    return torch.bincount(owner, weights=loss, minlength=len(sizes)) / sizes.clamp(min=1)


def label_distributions(fed: Federation, n_classes: int) -> np.ndarray:
    """Each client's reported label distribution [N, C] (one bincount over all samples)."""
    data = fed.client_data(np.arange(fed.n_clients))
    index, owner, _ = (t.numpy() for t in flat_indices(data.indices))
    labels = data.y.cpu().numpy()[index]
    counts = np.bincount(owner * n_classes + labels, minlength=fed.n_clients * n_classes).reshape(-1, n_classes)
    return counts / np.maximum(counts.sum(1, keepdims=True), 1)


@register
@dataclass
class PowerOfChoice(Method):
    """PoC, the adaptive π_adapow-d of Cho et al. (2022).

    Round t: draw a candidate set A of d_t clients without replacement with probability
    ∝ n_i (their p_k); the candidates report their local loss F_k(w^t) on their own data;
    the K candidates with the highest loss take part. d_t = max(K, round(d_0 decay^t)),
    d_0 = ``d0_fraction`` N (default: every client is a candidate). FedMS §5.1: decay 1.0
    for Dir(10) and 0.9 for Dir(1) / Dir(0.1). Source: the paper (p_k ∝ n_k); the re-implementation
    in github.com/pringlesinghal/GreedyFed ``algorithms.py`` ``power_of_choice_run`` draws the
    candidates uniformly instead (book/reference/baselines.md).
    """

    name = "poc"
    decay: float = 0.9
    d0_fraction: float = 1.0

    def validate(self) -> None:
        self.check(("decay", 0 < self.decay <= 1, "in (0, 1]"), ("d0_fraction", 0 < self.d0_fraction <= 1, "in (0, 1]"))

    def candidates(self, t: int) -> int:
        n, k = self.fed.n_clients, self.fed.clients_per_round
        return int(min(n, max(k, round(self.d0_fraction * n * self.decay**t))))

    def select_clients(self, state: RoundState) -> np.ndarray:
        n, k = self.fed.n_clients, self.fed.clients_per_round
        if k >= n:
            return np.arange(n)
        d = self.candidates(state.round)
        p = np.asarray(self.fed.client_sizes, dtype=float)
        p = p / p.sum()
        pool = np.sort(state.rng.choice(n, size=d, replace=False, p=p))
        loss = local_losses(self.fed.model, state.global_flat, state.global_buffers,
                            self.fed.client_data(pool)).numpy()
        chosen = pool[np.argsort(-loss, kind="stable")[:k]]  # highest local loss
        state.round_data["diagnostics"] = {"candidates": int(d)}
        return np.sort(chosen)

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        return sample_count_weights(updates.sizes)


@register
@dataclass
class FedEMD(Method):
    """FedEMD (Huang et al. 2022): favour clients whose label distribution is far from the
    global one, less and less as training goes on.

    EMD_i = Σ_c |p_i^c - p^c| (the Wasserstein distance between label distributions with
    unit ground distance between classes, up to a factor 2), p = the size-weighted mean of
    the reported p_i. Round t draws K clients without replacement with
    P_i ∝ exp(EMD_i / (β (t + 1))): a sharp preference for far clients (Mavericks) early,
    flattening towards uniform. β is the "distance coefficient" of FedMS §5.1 (0.001 for
    Dir(10), 0.01 for Dir(1) / Dir(0.1)). This functional form is our reading; FedMS does
    not restate FedEMD's rule. Source: the paper (no public code found).
    """

    name = "fedemd"
    beta: float = 0.01

    def validate(self) -> None:
        self.check(("beta", self.beta > 0, "> 0"))

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        dist = label_distributions(fed, fed.n_classes)
        sizes = np.asarray(fed.client_sizes, dtype=float)
        overall = (sizes[:, None] * dist).sum(0) / max(sizes.sum(), 1)
        self.emd = np.abs(dist - overall).sum(1)

    def select_clients(self, state: RoundState) -> np.ndarray:
        n, k = self.fed.n_clients, self.fed.clients_per_round
        if k >= n:
            return np.arange(n)
        z = self.emd / (self.beta * (state.round + 1))
        p = np.exp(z - z.max())
        p = (p / p.sum() + 1e-12)
        return np.sort(state.rng.choice(n, size=k, replace=False, p=p / p.sum()))

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        return sample_count_weights(updates.sizes)

    def scores(self) -> np.ndarray:
        return self.emd.copy()
