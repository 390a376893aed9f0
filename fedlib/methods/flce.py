"""FLCE: contribution evaluation by class contribution momentum (Guo, Yao et al., PVLDB).

Client side (Algorithm 1, LocalTraining): local SGD on  L = L_CE + λ L_CL  (Eq. 2-4, a
supervised contrastive loss on the representations z = features(x)), then one class
prototype per class: the mean representation of the client's correctly classified
samples of that class (Eq. 5), uploaded with the model.

Server side, round t, selected clients k = 1..K, prototypes p[k, c]:
    mass      M[k, c]  cos(p_kc, p̂_c) normalised over k, p̂_c a cosine-weighted mean   (Eq. 6)
    velocity  V[k, c]  ||p_kc - g_c^(t-1)||² normalised over k                       (Eq. 7)
    momentum  Q[k, c]  M V normalised over k                                          (Eq. 8)
    g_c^t = Σ_k Q[k, c] p_kc                                                          (Eq. 9)
    w^(t+1) = Σ_k (Σ_c Q[k, c] / Σ_k Σ_c Q[k, c]) w_k                                (Eq. 10)
and the round's slice of the contribution tensor X[t, k, c] = b_c Q[k, c] (unobserved for
clients not selected). After the last round X, unfolded to rounds x (clients·classes), is
completed by low-rank factorisation X ≈ U V fitted by gradient descent on the observed
entries (Eq. 11: the client x class structure, ``completion_over="client_class"``), and
CE_k = Σ_t a_t Σ_c X̂[t, k, c] normalised (Eq. 12-14), with A and B uniform (the paper's
"typical" case). ``completion_over="summed"`` (our earlier simplification) sums the class
dimension out first and completes X[t, k] = Σ_c b_c Q[k, c].

Every step is batched over clients and classes; ``fedlib.testing.class_prototypes_loop``
and ``supcon_loss_loop`` are the plain references used by the tests.

L_CL follows Eq. 4 as printed (``contrastive="paper"``): the positives of anchor i are all
j with y_j = y_i, the self-pair j = i included (its similarity is 1/τ), N_yi counts them, and
the denominator runs over k ≠ i. ``contrastive="simplified"`` (our earlier reading, SupCon
style) drops the self-pair; an anchor without another positive then adds 0.

Where the paper is silent (stated on the chapter page): cosine similarity in L_CL with
τ = 0.5 and λ = 1 (the paper gives neither value); 1/N over the batch; prototypes use the model in eval mode (BatchNorm running statistics); negative
cosines count as 0 in Eq. 6 and a class nobody holds gets no weight; the first round a
class is seen (no g_c yet) its velocity is uniform over the clients holding it; completion
rank 1 (a round's scale times a client-class share), 2,000 Adam steps (lr 0.05) on X scaled
to mean 1, completed entries clamped at 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from ..population import ParamLayout, padded_indices
from .base import ClientData, ClientUpdates, Federation, Method, RoundState, register

# ----------------------------------------------------------------------------- client side


def supcon_loss(z: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, tau: float,
                self_pair: bool = True) -> torch.Tensor:
    """Eq. 4 on one batch: z [B, D] representations, y [B] labels, mask [B] (1 = real sample).

    L_CL = -1/N Σ_i 1/N_yi Σ_{j: y_j = y_i} log( e^{s_ij/τ} / Σ_{k≠i} e^{s_ik/τ} ),  s = cosine,
    the self-pair j = i included as printed (``self_pair=False``: j ≠ i, the simplified form).
    No data-dependent branches, so it runs inside vmap (padding is masked, not removed)."""
    zn = F.normalize(z, dim=-1)
    s = zn @ zn.T / tau
    b = z.shape[0]
    eye = torch.eye(b, dtype=z.dtype, device=z.device)
    other = (1.0 - eye) * mask.unsqueeze(0)  # k ≠ i, k real
    log_denominator = torch.logsumexp(s.masked_fill(other == 0, -1e9), dim=1, keepdim=True)
    pairs = (other + eye * mask.unsqueeze(0)) if self_pair else other  # j real (j = i too if self_pair)
    positive = (y.unsqueeze(0) == y.unsqueeze(1)).to(z.dtype) * pairs * mask.unsqueeze(1)
    n_pos = positive.sum(1)
    per_anchor = -(positive * (s - log_denominator)).sum(1) / n_pos.clamp(min=1.0)
    return (per_anchor * mask).sum() / mask.sum().clamp(min=1.0)


def class_prototypes(model, flat: torch.Tensor, buffers: dict[str, torch.Tensor], x: torch.Tensor,
                     y: torch.Tensor, indices: list[np.ndarray], n_classes: int,
                     batch_size: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5 for n clients at once: client i's model ``flat[i]`` on its samples ``indices[i]``.

    Returns prototypes [n, C, D] (mean representation of the correctly classified samples of
    each class; 0 where there are none) and their counts [n, C]."""
    layout = ParamLayout(model)
    table, sizes = padded_indices(indices)
    table, sizes = table.to(x.device), sizes.to(x.device)

    def one(f, b, xb):
        return functional_call(model, (layout.unflatten(f), b), (xb,), {"return_features": True})

    forward = vmap(one)
    sums = counts = None
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for lo in range(0, table.shape[1], batch_size):  # sample chunks, all clients together
                cols = table[:, lo:lo + batch_size]
                valid = (torch.arange(lo, lo + cols.shape[1], device=x.device).unsqueeze(0) < sizes.unsqueeze(1))
                yb = y[cols]
                logits, z = forward(flat, buffers, x[cols])
                correct = ((logits.argmax(-1) == yb) & valid).to(z.dtype)
                onehot = F.one_hot(yb, n_classes).to(z.dtype) * correct.unsqueeze(-1)  # [n, b, C]
                part_sums = torch.einsum("nbc,nbd->ncd", onehot, z)
                sums = part_sums if sums is None else sums + part_sums
                counts = onehot.sum(1) if counts is None else counts + onehot.sum(1)
    finally:
        model.train(was_training)
    return sums / counts.clamp(min=1).unsqueeze(-1), counts


# ----------------------------------------------------------------------------- server side


def share(values: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Normalise [K, C] over the clients (dim 0) among ``present``, negatives as 0; a class
    whose values are all 0 is uniform over its present clients (all 0 if none holds it)."""
    v = values.clamp(min=0) * present
    total = v.sum(0, keepdim=True)
    uniform = present / present.sum(0, keepdim=True).clamp(min=1)
    return torch.where(total > 0, v / total.clamp(min=1e-30), uniform)


def class_mass(p: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Eq. 6: M[k, c] = cos(p_kc, p̂_c) / Σ_k cos(p_kc, p̂_c), p̂_c = Σ_k f_kc p_kc, f the
    normalised cos(p_kc, mean_k p_kc)."""
    mean = (p * present.unsqueeze(-1)).sum(0) / present.sum(0).clamp(min=1).unsqueeze(-1)  # [C, D]
    f = share(F.cosine_similarity(p, mean.unsqueeze(0), dim=-1), present)
    p_hat = torch.einsum("kc,kcd->cd", f, p)
    return share(F.cosine_similarity(p, p_hat.unsqueeze(0), dim=-1), present)


def class_velocity(p: torch.Tensor, present: torch.Tensor, g: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Eq. 7: V[k, c] = ||p_kc - g_c^(t-1)||² / Σ_k ||p_kc - g_c^(t-1)||² (uniform where g_c is unknown)."""
    distance = (p - g.unsqueeze(0)).square().sum(-1) * known.unsqueeze(0)
    return share(distance, present)


def class_momentum(mass: torch.Tensor, velocity: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Eq. 8: Q[k, c] = M V / Σ_k M V."""
    return share(mass * velocity, present)


def global_prototypes(q: torch.Tensor, p: torch.Tensor, present: torch.Tensor, g: torch.Tensor,
                      known: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 9: g_c^t = Σ_k Q[k, c] p_kc for the classes someone holds; the others keep g_c^(t-1)."""
    held = present.sum(0) > 0
    new = torch.einsum("kc,kcd->cd", q, p)
    return torch.where(held.unsqueeze(-1), new, g), known | held


def aggregation_weights(q: torch.Tensor) -> torch.Tensor:
    """Eq. 10: client k's weight Σ_c Q[k, c] / Σ_k Σ_c Q[k, c] (uniform if Q is all 0)."""
    per_client = q.sum(1)
    total = per_client.sum()
    return per_client / total if total > 0 else torch.full_like(per_client, 1.0 / len(per_client))


def complete_matrix(x: torch.Tensor, observed: torch.Tensor, rank: int = 1, steps: int = 2000,
                    lr: float = 0.05, seed: int = 0) -> torch.Tensor:
    """Eq. 11: min_{U,V} Σ_observed (X - U V)², U [m, rank], V [rank, n], by gradient descent
    (Adam steps) from a seeded small random start. Returns U V with the observed entries
    kept; X is scaled to mean 1 on the observed entries while fitting."""
    x = x.double()
    obs = observed.to(torch.bool)
    scale = x[obs].abs().mean() if obs.any() else x.new_tensor(1.0)
    if not scale > 0:
        return torch.where(obs, x, torch.zeros_like(x))
    target = torch.where(obs, x / scale, torch.zeros_like(x))
    weight = obs.double()
    g = torch.Generator().manual_seed(seed)
    m, n = x.shape
    u = torch.rand(m, rank, generator=g, dtype=torch.float64) / rank ** 0.5
    v = torch.rand(rank, n, generator=g, dtype=torch.float64) / rank ** 0.5
    count = weight.sum().clamp(min=1)
    # Adam (betas 0.9 / 0.999) on E = Σ_observed (X - U V)² / |observed|, gradients in closed form
    state = [torch.zeros_like(u), torch.zeros_like(u), torch.zeros_like(v), torch.zeros_like(v)]
    b1, b2, eps = 0.9, 0.999, 1e-8
    for step in range(1, steps + 1):
        residual = (u @ v - target) * weight * (2.0 / count)
        grads = (residual @ v.T, u.T @ residual)  # dE/dU, dE/dV
        for param, grad, m1, m2 in ((u, grads[0], state[0], state[1]), (v, grads[1], state[2], state[3])):
            m1.mul_(b1).add_(grad, alpha=1 - b1)
            m2.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            denom = (m2 / (1 - b2 ** step)).sqrt_().add_(eps)
            param.addcdiv_(m1, denom, value=-lr / (1 - b1 ** step))
    return torch.where(obs, x, (u @ v) * scale)


CONTRASTIVE = ("paper", "simplified")
COMPLETION_OVER = ("client_class", "summed")


def complete_contributions(x: torch.Tensor, over: str = "client_class", rank: int = 1, steps: int = 2000,
                           lr: float = 0.05, seed: int = 0) -> torch.Tensor:
    """Eq. 11 on the contribution tensor X [T, N, C] (NaN = client not selected that round),
    returning the completed Σ_c X̂[t, k, c] [T, N], clamped at 0.

    ``over="client_class"``: X unfolded to [T, N·C] (a client's classes observed together) is
    completed as U V with U [T, rank], V [rank, N·C]; ``"summed"``: the class dimension is
    summed out first and [T, N] is completed."""
    if over not in COMPLETION_OVER:
        raise ValueError(f"completion_over must be one of {', '.join(COMPLETION_OVER)} (got {over!r})")
    t, n, c = x.shape
    observed = ~torch.isnan(x)
    filled = torch.nan_to_num(x.double(), nan=0.0)
    if over == "summed":
        summed, seen = filled.sum(-1), observed.all(-1)
        return complete_matrix(summed, seen, rank, steps, lr, seed).clamp(min=0)
    flat = complete_matrix(filled.reshape(t, n * c), observed.reshape(t, n * c), rank, steps, lr, seed)
    return flat.clamp(min=0).reshape(t, n, c).sum(-1)


def final_contributions(x: torch.Tensor, a: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 14 from the (completed) matrix X̂ [T, N] whose entries already carry B:
    CE_k = Σ_t a_t X̂[t, k], normalised over the clients (a uniform: 1/T, Eq. 12)."""
    x = x.clamp(min=0)
    a = torch.full((x.shape[0],), 1.0 / x.shape[0], dtype=x.dtype) if a is None else a.to(x.dtype)
    ce = a @ x
    total = ce.sum()
    return ce / total if total > 0 else torch.full_like(ce, 1.0 / len(ce))


# ----------------------------------------------------------------------------- the method


@register
@dataclass
class FLCE(Method):
    """Class contribution momentum; the five ablations of §4.4 are switches:
    −M ``mass=False``, −V ``velocity=False``, −Q ``momentum=False`` (Q uniform over the
    clients holding a class), −CL ``lam=0``, −CMC ``completion=False`` (missing entries 0).

    Options for our earlier simplifications: ``contrastive="simplified"`` (Eq. 4 without the
    self-pair) and ``completion_over="summed"`` (Eq. 11 on the class-summed matrix).

    After ``setup``: ``class_matrix`` X [rounds, N, C] and ``matrix`` Σ_c X [rounds, N] (NaN =
    not observed), ``class_momentum_sum`` [N, C] (Σ_t Q[k, c]), ``global_protos`` [C, D].
    ``scores()`` is Eq. 14 on X with missing entries 0, and on the completed X̂ after the last
    round (Algorithm 1, line 13)."""

    name = "flce"
    rule_version = "2"  # 2: Eq. 4 with the self-pair, Eq. 11 over the client x class structure
    lam: float = 1.0  # λ of Eq. 2 (the paper gives no value)
    tau: float = 0.5  # τ of Eq. 4 (the paper gives no value)
    contrastive: str = "paper"  # Eq. 4 as printed | "simplified": no self-pair
    completion_over: str = "client_class"  # Eq. 11 on X[t, (k, c)] | "summed": on Σ_c X[t, k, c]
    mass: bool = True
    velocity: bool = True
    momentum: bool = True
    completion: bool = True
    rank: int = 1  # k of Eq. 11
    completion_steps: int = 2000
    completion_lr: float = 0.05

    def validate(self) -> None:
        self.check(
            ("lam", self.lam >= 0, ">= 0"),
            ("tau", self.tau > 0, "> 0"),
            ("rank", self.rank >= 1 and float(self.rank).is_integer(), "an integer >= 1"),
            ("completion_steps", self.completion_steps >= 1 and float(self.completion_steps).is_integer(),
             "an integer >= 1"),
            ("completion_lr", self.completion_lr > 0, "> 0"),
            ("contrastive", self.contrastive in CONTRASTIVE, " or ".join(CONTRASTIVE)),
            ("completion_over", self.completion_over in COMPLETION_OVER, " or ".join(COMPLETION_OVER)),
        )

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        dim = fed.model.feature_dim
        self.global_protos = torch.zeros(fed.n_classes, dim, dtype=torch.float64)
        self.known = torch.zeros(fed.n_classes, dtype=torch.bool)
        self.matrix = torch.full((fed.rounds, fed.n_clients), float("nan"), dtype=torch.float64)
        self.class_matrix = torch.full((fed.rounds, fed.n_clients, fed.n_classes), float("nan"), dtype=torch.float64)
        self.class_momentum_sum = torch.zeros(fed.n_clients, fed.n_classes, dtype=torch.float64)
        self.contributions = torch.full((fed.n_clients,), 1.0 / fed.n_clients, dtype=torch.float64)
        self._rounds_done = 0

    # -- 2. local: L = L_CE + λ L_CL (Eq. 2-4), then prototypes (Eq. 5) ---------------------
    def local_training(self, state, base, clients):
        if self.lam == 0:
            return base
        lam, tau, self_pair = self.lam, self.tau, self.contrastive == "paper"

        def contrastive(params, logits, features, y, mask, context):
            return lam * supcon_loss(features, y, mask, tau, self_pair)  # λ L_CL, Eq. 2

        return replace(base, extra_loss=contrastive)

    def client_uploads(self, state: RoundState, clients, flat, buffers, data: ClientData):
        protos, counts = class_prototypes(self.fed.model, flat, buffers, data.x, data.y, data.indices,
                                          self.fed.n_classes)
        return {"prototypes": protos, "prototype_counts": counts}

    # -- 3. server: Eq. 6-10 ------------------------------------------------------------------
    def round_momentum(self, p: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """Q [K, C] of one round from the prototypes [K, C, D] (with the ablation switches)."""
        if not self.momentum:  # −Q
            return share(torch.ones_like(present), present)
        m = class_mass(p, present) if self.mass else torch.ones_like(present)  # Eq. 6
        v = class_velocity(p, present, self.global_protos, self.known) if self.velocity else torch.ones_like(present)
        return class_momentum(m, v, present)  # Eq. 8

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        p = updates.extras["prototypes"].double().cpu()
        present = (updates.extras["prototype_counts"].cpu() > 0).double()
        q = self.round_momentum(p, present)
        self.global_protos, self.known = global_prototypes(q, p, present, self.global_protos, self.known)  # Eq. 9
        clients = torch.as_tensor(updates.clients, dtype=torch.long)
        b = 1.0 / self.fed.n_classes  # B uniform (Eq. 13)
        cells = b * q  # X[t, k, c] = b_c Q[k, c]
        row = cells.sum(1)
        self.matrix[state.round, clients] = row
        self.class_matrix[state.round, clients] = cells
        self.class_momentum_sum[clients] += q
        self._rounds_done = state.round + 1
        last = state.round == self.fed.rounds - 1
        self.contributions = self.evaluate_contributions(complete=last and self.completion)
        diagnostics = state.round_data["diagnostics"] = {"x": row.tolist(), "x_class": cells.tolist()}
        if last:
            diagnostics["class_momentum_sum"] = self.class_momentum_sum.tolist()
        return aggregation_weights(q).float()  # Eq. 10

    def evaluate_contributions(self, complete: bool) -> torch.Tensor:
        """Eq. 11-14 on the rounds so far (``complete``: fill the missing entries, else 0)."""
        x = self.class_matrix[: self._rounds_done]
        if complete:
            return final_contributions(complete_contributions(
                x, self.completion_over, int(self.rank), int(self.completion_steps), self.completion_lr))
        return final_contributions(torch.nan_to_num(x, nan=0.0).sum(-1))

    def scores(self) -> np.ndarray:
        return self.contributions.numpy().copy()

    def diagnostics(self, state: RoundState) -> dict | None:
        """Every round: ``x`` (this round's row Σ_c X[t, k, c] for the aggregated clients) and
        ``x_class`` (X[t, k, c], [K, C]); the last round adds ``class_momentum_sum`` [N, C]."""
        return super().diagnostics(state)  # what ``weigh`` put in ``state.round_data``
