"""CFFL: Collaborative Fairness in Federated Learning (Lyu, Xu et al. 2020), its reputation mechanism.

The server holds a labelled validation set V (``needs_validation``). Each round it scores
every upload by its accuracy on V (all uploads in one batched evaluation), turns the scores
into reputations, removes clients whose reputation falls below a threshold from the
reputable set R for the rest of the run, and aggregates R's uploads in proportion to
reputation. Formulas and defaults follow the authors' implementation of the reputation
update (``compute_reputations_sinh`` and its caller in ``pytorch/utils/Federated_Learner.py``
of github.com/XinyiYS/CollaborativeFairFederatedLearning); a round's reputations come from
that round's uploads and weigh that round's aggregation:

    vacc_j  = accuracy of client j's upload on V            (upload rate θ = 1: the full model)
    r̃_j     = vacc_j / Σ_{k∈S} vacc_k                        (uniform if every vacc is 0)
    r_j     <- sinh(α (fade · r_j + (1 - fade) · r̃_j))      r_j = 0 before a client's first round
    r       <- r / Σ_{j∈R} r_j
    R       <- R \\ {j : r_j < r_th},  r_th = threshold / |R|,  removed clients get r_j = 0,
               the others are renormalised and r_th follows the new |R|
    weights = r_j / Σ_{k∈S} r_k                              ('reputation-sum' aggregation)

Defaults: α = 5 (their default sinh factor), fade = 0.5 (their ``reputation_fade != 1`` branch,
an equal mix of old and new reputation; the ``reputation_fade = 1`` default uses 0.8),
threshold = 1/3 (their default ``reputation_threshold_coef``). threshold < 1 keeps the best
client in R. Not implemented: the gradient clipping and top-θ upload sparsification, and the
reward step in which client j downloads the largest entries of the aggregate in proportion to
r_j / max r (clients receiving different models); they do not change the reputations or the
aggregation weights.

Partial participation (the paper has every client of R take part every round): clients are
sampled from R only; with S the round's selection, r̃ is normalised over S and the new
reputations of S are rescaled to the share of the unit total that S held before the round
(a client not seen yet holds 1/|R|), so the reputations of the other clients are unchanged.
With full participation this is exactly the update above.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..population import evaluate
from .base import ClientUpdates, Federation, Method, RoundState, register
from .gradient import simplex


@register
@dataclass
class CFFL(Method):
    """Validation-accuracy reputations with a sinh sharpening and a removal threshold."""

    name = "cffl"
    needs_validation = True
    alpha: float = 5.0
    fade: float = 0.5
    threshold: float = 1.0 / 3.0

    def validate(self) -> None:
        if not self.alpha > 0:
            raise ValueError(f"method 'cffl': alpha must be > 0 (got {self.alpha})")
        if not 0 <= self.fade < 1:
            raise ValueError(f"method 'cffl': fade must be in [0, 1) (got {self.fade})")
        if not 0 <= self.threshold < 1:
            raise ValueError(f"method 'cffl': threshold must be in [0, 1) (got {self.threshold})")

    def setup(self, fed: Federation) -> None:
        if fed.x_val is None or fed.y_val is None:
            raise ValueError("method 'cffl': needs the server's validation set (Federation.x_val, y_val)")
        super().setup(fed)
        self.reputation = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.seen = torch.zeros(fed.n_clients, dtype=torch.bool)
        self.reputable = torch.ones(fed.n_clients, dtype=torch.bool)

    def select_clients(self, state: RoundState) -> np.ndarray:
        """Uniform sampling without replacement from the reputable set R (all of R if it is small)."""
        pool = np.flatnonzero(self.reputable.numpy())
        if self.fed.clients_per_round >= len(pool):
            return pool
        return np.sort(state.rng.choice(pool, size=self.fed.clients_per_round, replace=False))

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        fed = self.fed
        vacc = evaluate(fed.model, updates.flat, updates.buffers, fed.x_val, fed.y_val, fed.n_classes).accuracy
        clients = torch.as_tensor(updates.clients, dtype=torch.long)
        self.update_reputation(clients, vacc.double().cpu())
        return simplex(self.reputation[clients]).float()

    def update_reputation(self, clients: torch.Tensor, vacc: torch.Tensor) -> None:
        """One reputation step for ``clients`` (members of R, as ``select_clients`` returns them)
        whose uploads have validation accuracies ``vacc``."""
        r, seen, reputable = self.reputation, self.seen, self.reputable
        held = torch.where(seen, r, 1.0 / reputable.sum())[clients].sum()
        relative = vacc / vacc.sum() if vacc.sum() > 0 else torch.full_like(vacc, 1.0 / len(vacc))
        sharpened = torch.sinh(self.alpha * (self.fade * r[clients] + (1 - self.fade) * relative))
        r[clients] = held * sharpened / sharpened.sum()
        seen[clients] = True
        drop = reputable & seen & (r < self.threshold / reputable.sum())
        if drop.any():
            reputable &= ~drop
            r[drop] = 0.0
            kept = reputable & seen
            unseen_share = (reputable & ~seen).sum() / reputable.sum()
            r[kept] *= (1 - unseen_share) / r[kept].sum()

    def scores(self) -> np.ndarray:
        return self.reputation.numpy().copy()
