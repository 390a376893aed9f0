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
import torch.nn.functional as F

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


# ----------------------------------------------------------------------------- FLCE's baselines

def global_model_on_clients(fed: Federation, state: RoundState, data) -> tuple[torch.Tensor, torch.Tensor]:
    """Client side, for q-FedAvg, FedFa and FedFV: the received global model's mean
    cross-entropy and accuracy on each selected client's own training data ([n] each),
    from one batched pass over the clients' samples."""
    from ..population import padded_indices, predict

    table, sizes = padded_indices(data.indices)
    flat_index = torch.cat([torch.as_tensor(ix, dtype=torch.long) for ix in data.indices]).to(data.x.device)
    owner = torch.repeat_interleave(torch.arange(len(data.indices)), sizes).to(data.x.device)
    logits = predict(fed.model, state.global_flat.unsqueeze(0),
                     {k: v.unsqueeze(0) for k, v in state.global_buffers.items()}, data.x[flat_index])[0]
    y = data.y[flat_index]
    n = len(data.indices)
    loss = torch.zeros(n, device=logits.device).index_add_(0, owner, F.cross_entropy(logits, y, reduction="none"))
    correct = torch.zeros(n, device=logits.device).index_add_(0, owner, (logits.argmax(-1) == y).float())
    count = sizes.to(logits.device).clamp(min=1).float()
    return loss / count, correct / count


@register
@dataclass
class QFedAvg(Method):
    """q-FedAvg (Li, Sanjabi, Beirami, Smith, ICLR 2020), Algorithm 2 with L = 1/lr:

        Δw_k = L (w^t - w_k)                                   (w_k: k's locally trained model)
        Δ_k  = F_k(w^t)^q Δw_k
        h_k  = q F_k(w^t)^(q-1) ||Δw_k||² + L F_k(w^t)^q
        w^(t+1) = w^t - Σ_k Δ_k / Σ_k h_k
    F_k(w^t) is the received global model's loss on k's own data (sent by the client). As a
    combination of the uploads: weights c_k = L F_k^q / Σ h, and the remaining 1 - Σ c_k stays
    on w^t (``server_update``). q = 1 (our choice; the paper tunes q per dataset)."""

    name = "qfedavg"
    q: float = 1.0

    def validate(self) -> None:
        if self.q < 0:
            raise ValueError(f"method 'qfedavg': q must be >= 0 (got {self.q})")

    def client_uploads(self, state, clients, flat, buffers, data):
        loss, _ = global_model_on_clients(self.fed, state, data)
        return {"loss": loss}

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        big_l = 1.0 / state.lr
        f = updates.extras["loss"].double().clamp(min=1e-10)
        delta_w = big_l * (state.global_flat - updates.flat).double()
        h = self.q * f.pow(self.q - 1) * delta_w.square().sum(1) + big_l * f.pow(self.q)
        return (big_l * f.pow(self.q) / h.sum()).float()

    def server_update(self, state, weights, flat, buffers):
        rest = 1.0 - weights.sum()  # w^(t+1) = Σ c_k w_k + (1 - Σ c_k) w^t
        flat = flat + rest * state.global_flat
        buffers = {k: (v + rest * state.global_buffers[k]) if v.is_floating_point() else v for k, v in buffers.items()}
        return flat, buffers


@register
@dataclass
class FedFa(Method):
    """FedFa (Huang et al., Information Sciences 2022): weights from accuracy and participation
    frequency, and a server momentum (as in the FLGo/easyFL implementation of the paper):

        ACC_k  = accuracy of the received global model on k's data; F_k = k's participation count
        a_k    = -log2(ACC_k / Σ ACC + 1e-6),  f_k = -log2(1 - F_k / Σ F + 1e-5), each normalised
        p_k    = α a_k + β f_k,  α = 1 - β                                   (aggregation weights)
        w'     = Σ p_k w_k;  m <- γ m + (1 - γ)(w' - w^t);  w^(t+1) = w' - η m
    β = 0.5, γ = 0.9, η = the round's learning rate (their defaults). The weights p are FedFa's
    contribution (FLCE §4.1.3: 'aggregation weight (e.g., FedFa)')."""

    name = "fedfa"
    beta: float = 0.5
    gamma: float = 0.9

    def validate(self) -> None:
        if not 0 <= self.beta <= 1:
            raise ValueError(f"method 'fedfa': beta must be in [0, 1] (got {self.beta})")
        if not 0 <= self.gamma < 1:
            raise ValueError(f"method 'fedfa': gamma must be in [0, 1) (got {self.gamma})")

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.frequency = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.momentum = None
        self.total = torch.zeros(fed.n_clients, dtype=torch.float64)

    def client_uploads(self, state, clients, flat, buffers, data):
        _, acc = global_model_on_clients(self.fed, state, data)
        return {"accuracy": acc}

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        clients = torch.as_tensor(updates.clients, dtype=torch.long)
        self.frequency[clients] += 1
        acc = updates.extras["accuracy"].double().cpu()
        freq = self.frequency[clients]
        a = -torch.log2(acc / acc.sum().clamp(min=1e-12) + 1e-6)
        f = -torch.log2(1 - freq / freq.sum() + 1e-5)
        a, f = a / a.sum().clamp(min=1e-12), f / f.sum().clamp(min=1e-12)
        p = (1 - self.beta) * a + self.beta * f
        p = p / p.sum()
        self.total[clients] += p
        return p.float()

    def server_update(self, state, weights, flat, buffers):
        dw = flat - state.global_flat
        self.momentum = (1 - self.gamma) * dw if self.momentum is None else self.gamma * self.momentum + (1 - self.gamma) * dw
        return flat - state.lr * self.momentum, buffers

    def scores(self) -> np.ndarray:
        """Σ over rounds of each client's aggregation weight p_k, normalised."""
        t = self.total
        return (t / t.sum()).numpy() if t.sum() > 0 else t.numpy().copy()


def _prox_loss(layout, lam):
    def loss(params, logits, features, y, mask, anchor):  # λ/2 ||v - w^t||², Ditto's personal objective
        target = layout.unflatten(anchor)
        return 0.5 * lam * sum((params[k] - target[k]).square().sum() for k in params)

    return loss


@register
@dataclass
class Ditto(Method):
    """Ditto (Li, Hu, Beirami, Smith, ICML 2021), Algorithm 1: the global model is trained as in
    FedAvg (sample-count weights); every selected client also updates its personal model v_k
    with the same local SGD on  F_k(v) + λ/2 ||v - w^t||²,  starting from its last v_k (w^t for
    a client never selected). The engine evaluates the global model; ``personal`` [N, P] holds
    the v_k. λ = 0.1 (our choice; their grid is {0.01 ... 2})."""

    name = "ditto"
    lam: float = 0.1

    def validate(self) -> None:
        if self.lam < 0:
            raise ValueError(f"method 'ditto': lam must be >= 0 (got {self.lam})")

    def setup(self, fed: Federation) -> None:
        from ..population import ParamLayout

        super().setup(fed)
        self.layout = ParamLayout(fed.model)
        self.personal = None
        self.personal_buffers = None
        self.has_personal = torch.zeros(fed.n_clients, dtype=torch.bool)

    def local_training(self, state, base, clients):
        self._base = base
        return base

    def client_uploads(self, state, clients, flat, buffers, data):
        from dataclasses import replace

        from ..population import make_client_batches, train_clients

        n = len(clients)
        if self.personal is None:
            self.personal = state.global_flat.unsqueeze(0).repeat(self.fed.n_clients, 1)
            self.personal_buffers = {k: v.unsqueeze(0).repeat(self.fed.n_clients, *([1] * v.dim()))
                                     for k, v in state.global_buffers.items()}
        index = torch.as_tensor(clients, dtype=torch.long, device=self.personal.device)
        start = torch.where(self.has_personal[clients].to(self.personal.device).unsqueeze(1),
                            self.personal[index], state.global_flat.unsqueeze(0))
        cfg = replace(self._base, extra_loss=_prox_loss(self.layout, self.lam), prox_mu=0.0,
                      client_context=state.global_flat.unsqueeze(0).expand(n, -1))
        batches = make_client_batches(data.indices, cfg.batch_size, cfg.epochs, data.generator)
        batches.index, batches.mask = batches.index.to(data.x.device), batches.mask.to(data.x.device)
        bufs = {k: v[index] for k, v in self.personal_buffers.items()}
        v_new, b_new = train_clients(self.fed.model, start, bufs, data.x, data.y, batches, cfg)
        self.personal[index] = v_new
        for k in b_new:
            self.personal_buffers[k][index] = b_new[k]
        self.has_personal[clients] = True
        return None

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        from .fedavg import sample_count_weights

        return sample_count_weights(updates.sizes)


@register
@dataclass
class MOON(Method):
    """MOON (Li, He, Song, CVPR 2021): local loss  ℓ_CE + μ ℓ_con  with the model-contrastive term

        ℓ_con = -log( e^{cos(z, z_glob)/τ} / (e^{cos(z, z_glob)/τ} + e^{cos(z, z_prev)/τ}) )

    z, z_glob, z_prev: the representation of the same batch under the model being trained, the
    received global model and the client's previous local model (the global model for a client
    never selected). Sample-count aggregation. μ = 1, τ = 0.5 (their CIFAR-10 τ; μ our choice);
    representation = the model's features (no extra projection head)."""

    name = "moon"
    mu: float = 1.0
    tau: float = 0.5

    def validate(self) -> None:
        if self.mu < 0:
            raise ValueError(f"method 'moon': mu must be >= 0 (got {self.mu})")
        if not self.tau > 0:
            raise ValueError(f"method 'moon': tau must be > 0 (got {self.tau})")

    def setup(self, fed: Federation) -> None:
        from ..population import ParamLayout

        super().setup(fed)
        self.layout = ParamLayout(fed.model)
        self.previous = None
        self.previous_buffers = None
        self.has_previous = torch.zeros(fed.n_clients, dtype=torch.bool)

    def local_training(self, state, base, clients):
        from dataclasses import replace

        from torch.func import functional_call

        from ..layers import sample_mask

        fed, layout, mu, tau = self.fed, self.layout, self.mu, self.tau
        if self.previous is None:
            self.previous = state.global_flat.unsqueeze(0).repeat(fed.n_clients, 1)
            self.previous_buffers = {k: v.unsqueeze(0).repeat(fed.n_clients, *([1] * v.dim()))
                                     for k, v in state.global_buffers.items()}
        index = torch.as_tensor(clients, dtype=torch.long, device=self.previous.device)
        seen = self.has_previous[clients].to(self.previous.device)
        context = {
            "global": state.global_flat.unsqueeze(0).expand(len(clients), -1),
            "prev": torch.where(seen.unsqueeze(1), self.previous[index], state.global_flat.unsqueeze(0)),
            "global_buffers": {k: v.unsqueeze(0).expand(len(clients), *v.shape).clone()
                               for k, v in state.global_buffers.items()},
            "prev_buffers": {k: v[index].clone() for k, v in self.previous_buffers.items()},
        }

        def represent(flat, buffers, xb, mask):
            with sample_mask(mask):
                _, z = functional_call(fed.model, (layout.unflatten(flat), {k: v.clone() for k, v in buffers.items()}),
                                       (xb,), {"return_features": True})
            return z.detach()

        def model_contrastive(params, logits, features, y, mask, ctx, inputs):
            z_glob = represent(ctx["global"], ctx["global_buffers"], inputs, mask)
            z_prev = represent(ctx["prev"], ctx["prev_buffers"], inputs, mask)
            pos = F.cosine_similarity(features, z_glob, dim=-1) / tau
            neg = F.cosine_similarity(features, z_prev, dim=-1) / tau
            term = -pos + torch.logaddexp(pos, neg)  # ℓ_con per sample
            return mu * (term * mask).sum() / mask.sum().clamp(min=1.0)

        return replace(base, extra_loss=model_contrastive, extra_loss_inputs=True, client_context=context)

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        from .fedavg import sample_count_weights

        index = torch.as_tensor(updates.clients, dtype=torch.long, device=self.previous.device)
        self.previous[index] = updates.flat
        for k, v in updates.buffers.items():
            self.previous_buffers[k][index] = v
        self.has_previous[updates.clients] = True
        return sample_count_weights(updates.sizes)


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
    normalised. Uses ``fedlib.methods.shapley`` (coalition utility, estimators)."""

    name = "fedsv"
    needs_validation = True
    permutations: int = 20
    exact: bool = False
    seed: int = 0

    def validate(self) -> None:
        if self.permutations < 1 or not float(self.permutations).is_integer():
            raise ValueError(f"method 'fedsv': permutations must be an integer >= 1 (got {self.permutations})")

    def setup(self, fed: Federation) -> None:
        if fed.x_val is None or fed.y_val is None:
            raise ValueError("method 'fedsv': needs the server's validation set (Federation.x_val, y_val)")
        super().setup(fed)
        self.total = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.rng = np.random.default_rng(self.seed)

    def aggregate(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        from .fedavg import sample_count_weights
        from .shapley import coalition_utility, exact_shapley, monte_carlo_shapley

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
