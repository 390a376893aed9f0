"""Logit-based FL ("Who to trust?", arXiv 2509.15147): three server-side aggregators of
client logits on a shared public set, plus the distillation loss of local refinement.

Every function is pure and batched over clients ``N`` and samples ``n``:

- ``simple_average``   z̄_s = mean over the clients present of z_is                 (simple averaging)
- ``fit_gmm`` / ``gmm_log_likelihood``  each client's Gaussian mixture over its own logits on a
  local validation split (diagonal covariances, the paper's mean-field assumption), all clients
  fitted at once by batched EM; ``gmm_log_likelihood`` gives ℓ_is = log p_i(z_is)
- ``uwa_weights`` / ``weighted_average``  UWA: w_is = softmax over clients of ℓ_is, then
  z̄_s = Σ_i w_is z_is                                                           (UWA)
- ``meta_features`` / ``train_meta_model`` / ``meta_aggregate``  the meta-model: a small torch
  MLP from the concatenated client logits [z_1s, …, z_Ns] to the label, trained on a labelled
  subset of the public set                                                      (MM aggregator)
- ``distillation_loss`` the local refinement loss towards the aggregated soft targets.

The paper's summary gives no equation numbers; comments name the rule as the paper does.
A client that misses a round (dropout) is marked absent in ``present`` ([N] or [N, n] bool):
averages and UWA renormalise over the clients present; the meta-model's input keeps its
fixed size N·C + N — an absent client's standardised logits are imputed with 0 (the training
mean) and its presence indicator is 0; the meta-model is trained with random client dropout
so it has seen such inputs. ``fit_gmm_loop`` is the per-client reference (tests only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------- helpers


def _present(present: torch.Tensor | None, n_clients: int, n_samples: int, device) -> torch.Tensor:
    """Availability as a float mask [N, n] (all present when None)."""
    if present is None:
        return torch.ones(n_clients, n_samples, device=device)
    present = present.to(device)
    if present.dim() == 1:
        present = present.unsqueeze(1).expand(n_clients, n_samples)
    if not bool(present.any(0).all()):
        raise ValueError("present: every sample needs at least one client present")
    return present.float()


# ----------------------------------------------------------------------------- simple averaging


def simple_average(logits: torch.Tensor, present: torch.Tensor | None = None) -> torch.Tensor:
    """Simple averaging: z̄_s = (1/|A_s|) Σ_{i∈A_s} z_is over the clients present. [N, n, C] -> [n, C]."""
    n, s, _ = logits.shape
    mask = _present(present, n, s, logits.device)
    return (mask.unsqueeze(-1) * logits).sum(0) / mask.sum(0).unsqueeze(-1)


def weighted_average(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """z̄_s = Σ_i w_is z_is with per-sample client weights ``weights`` [N, n]. -> [n, C]."""
    return torch.einsum("is,isc->sc", weights, logits)


# ----------------------------------------------------------------------------- UWA: client GMMs


@dataclass
class GMM:
    """N diagonal Gaussian mixtures of K components in D dimensions, one per client."""

    log_pi: torch.Tensor  # [N, K] log mixing weights (-inf: an empty component)
    mean: torch.Tensor  # [N, K, D]
    var: torch.Tensor  # [N, K, D]

    def to_dict(self) -> dict:
        return {k: v.tolist() for k, v in (("log_pi", self.log_pi), ("mean", self.mean), ("var", self.var))}


def _component_log_density(z: torch.Tensor, gmm: GMM) -> torch.Tensor:
    """log π_k + log N(z | μ_k, diag σ²_k) for every client, sample and component: [N, m, K]."""
    diff = z.unsqueeze(2) - gmm.mean.unsqueeze(1)  # [N, m, K, D]
    var = gmm.var.unsqueeze(1)
    log_normal = -0.5 * (torch.log(2 * math.pi * var) + diff.square() / var).sum(-1)
    return gmm.log_pi.unsqueeze(1) + log_normal


def _m_step(z: torch.Tensor, resp: torch.Tensor, valid: torch.Tensor, reg_covar: float) -> GMM:
    """Maximum-likelihood mixture given responsibilities ``resp`` [N, m, K] (padding: valid = 0)."""
    r = resp * valid.unsqueeze(-1)
    nk = r.sum(1)  # [N, K]
    safe = nk.clamp(min=1e-12).unsqueeze(-1)
    mean = torch.einsum("nmk,nmd->nkd", r, z) / safe
    var = torch.einsum("nmk,nmd->nkd", r, z.square()) / safe - mean.square()
    log_pi = torch.log(nk / nk.sum(1, keepdim=True).clamp(min=1e-12))
    log_pi = log_pi.masked_fill(nk < 1e-6, float("-inf"))  # empty component: switched off
    return GMM(log_pi, mean, var.clamp(min=0) + reg_covar)


def fit_gmm(z: torch.Tensor, valid: torch.Tensor, init_resp: torch.Tensor, iters: int,
            reg_covar: float = 1e-2) -> GMM:
    """Fit N diagonal GMMs at once: client i's mixture to its logits ``z[i]`` [m, D].

    ``valid`` [N, m] marks real samples (clients have validation splits of unequal size);
    ``init_resp`` [N, m, K] are the initial responsibilities (one-hot class labels give a
    class-conditional mixture, one component per class the client holds). Then ``iters``
    EM steps (E: responsibilities ∝ π_k N(z | μ_k, σ²_k); M: weighted means, variances and
    weights); ``reg_covar`` is added to every variance, as in scikit-learn.
    """
    valid = valid.to(z.dtype)
    gmm = _m_step(z, init_resp.to(z.dtype), valid, reg_covar)
    for _ in range(iters):
        resp = torch.softmax(_component_log_density(z, gmm), dim=-1)  # E-step
        gmm = _m_step(z, resp, valid, reg_covar)  # M-step
    return gmm


def gmm_log_likelihood(gmm: GMM, z: torch.Tensor) -> torch.Tensor:
    """ℓ_is = log p_i(z_is) = logsumexp_k [log π_ik + log N(z_is | μ_ik, σ²_ik)]: [N, n, D] -> [N, n]."""
    return torch.logsumexp(_component_log_density(z, gmm), dim=-1)


def fit_gmm_loop(z, valid, init_resp, iters, reg_covar=1e-2) -> GMM:
    """Reference: the same EM one client after another in numpy (test oracle only)."""
    out = {"log_pi": [], "mean": [], "var": []}
    for i in range(z.shape[0]):
        keep = valid[i].bool().numpy()
        x = z[i].double().numpy()[keep]
        r = init_resp[i].double().numpy()[keep]
        for step in range(iters + 1):
            nk = r.sum(0)
            mean = (r.T @ x) / np.maximum(nk, 1e-12)[:, None]
            var = np.maximum((r.T @ x**2) / np.maximum(nk, 1e-12)[:, None] - mean**2, 0) + reg_covar
            with np.errstate(divide="ignore"):
                log_pi = np.where(nk < 1e-6, -np.inf, np.log(nk / nk.sum()))
            if step == iters:
                break
            dens = log_pi - 0.5 * (np.log(2 * np.pi * var)[None] + (x[:, None] - mean[None]) ** 2 / var[None]).sum(-1)
            dens -= dens.max(1, keepdims=True)
            r = np.exp(dens) / np.exp(dens).sum(1, keepdims=True)
        out["log_pi"].append(log_pi)
        out["mean"].append(mean)
        out["var"].append(var)
    return GMM(*(torch.tensor(np.stack(out[k]), dtype=z.dtype) for k in ("log_pi", "mean", "var")))


def standardize_scores(ll_val: torch.Tensor, valid: torch.Tensor, *scores: torch.Tensor):
    """Calibrated UWA score (our variant): ℓ̃_is = (ℓ_is − m_i) / s_i with m_i, s_i the mean and std
    of client i's log-likelihoods on its own validation split, so that a client's score says how
    typical a sample's logits are for that client rather than how peaked its density is."""
    v = valid.to(ll_val.dtype)
    count = v.sum(1).clamp(min=1)
    mean = (ll_val * v).sum(1) / count
    std = (((ll_val - mean.unsqueeze(1)).square() * v).sum(1) / count).sqrt().clamp(min=1e-6)
    out = tuple((s - mean.unsqueeze(1)) / std.unsqueeze(1) for s in scores)
    return out[0] if len(out) == 1 else out


def uwa_weights(log_likelihood: torch.Tensor, present: torch.Tensor | None = None,
                tau: float = 1.0) -> torch.Tensor:
    """UWA: w_is = exp(ℓ_is/τ) / Σ_{j∈A_s} exp(ℓ_js/τ), the softmax over the clients present
    (the paper: τ = 1; τ → ∞ is simple averaging). [N, n] -> [N, n]."""
    n, s = log_likelihood.shape
    mask = _present(present, n, s, log_likelihood.device)
    return torch.softmax((log_likelihood / tau).masked_fill(mask == 0, float("-inf")), dim=0)


def uwa_aggregate(logits: torch.Tensor, log_likelihood: torch.Tensor, present: torch.Tensor | None = None,
                  tau: float = 1.0):
    """UWA aggregation: (z̄ [n, C], w [N, n])."""
    w = uwa_weights(log_likelihood, present, tau)
    return weighted_average(logits, w), w


# ----------------------------------------------------------------------------- meta-model


@dataclass
class MetaModel:
    """The trained aggregator: input standardisation plus a torch MLP (N·C + N -> H -> C)."""

    net: nn.Module
    mean: torch.Tensor  # [N, C] per-feature means of the training logits
    std: torch.Tensor  # [N, C]


def meta_features(logits: torch.Tensor, present: torch.Tensor | None, mean: torch.Tensor,
                  std: torch.Tensor) -> torch.Tensor:
    """Fixed-size input [n, N·C + N]: standardised logits of every client (0 = the training
    mean for an absent client: imputation) and the N presence indicators (masking)."""
    n, s, _ = logits.shape
    mask = _present(present, n, s, logits.device)
    standard = (logits - mean.unsqueeze(1)) / std.unsqueeze(1) * mask.unsqueeze(-1)
    return torch.cat([standard.permute(1, 0, 2).reshape(s, -1), mask.T], dim=1)


def train_meta_model(logits: torch.Tensor, labels: torch.Tensor, n_classes: int, *, hidden: int = 64,
                     steps: int = 300, lr: float = 0.01, weight_decay: float = 1e-4, drop: float = 0.2,
                     present: torch.Tensor | None = None, seed: int = 0) -> MetaModel:
    """Fit the MM aggregator  y ≈ g([z_1s, …, z_Ns])  on a labelled subset of the public set.

    ``logits`` [N, m, C] are the clients' logits on the m labelled public samples, ``labels`` [m].
    Full-batch Adam for ``steps`` steps with cross-entropy. At every step each present client
    is dropped from each sample with probability ``drop`` (at least one client stays), so the
    model learns to aggregate with clients missing (client-dropout augmentation).
    """
    n, m, c = logits.shape
    generator = torch.Generator().manual_seed(seed)
    base = _present(present, n, m, logits.device)
    mean = (base.unsqueeze(-1) * logits).sum(1) / base.sum(1).clamp(min=1).unsqueeze(-1)
    var = (base.unsqueeze(-1) * (logits - mean.unsqueeze(1)).square()).sum(1) / base.sum(1).clamp(min=1).unsqueeze(-1)
    std = var.sqrt().clamp(min=1e-3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(n * c + n, hidden), nn.ReLU(), nn.Linear(hidden, n_classes)).to(logits.device)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    first = torch.argmax(base, dim=0)
    for _ in range(steps):
        keep = (torch.rand(n, m, generator=generator) >= drop).to(base) * base
        none = keep.sum(0) == 0  # a sample left without clients keeps its first present one
        keep[first[none], torch.nonzero(none).squeeze(1)] = 1.0
        optimizer.zero_grad()
        loss = F.cross_entropy(net(meta_features(logits, keep, mean, std)), labels)
        loss.backward()
        optimizer.step()
    net.eval()
    return MetaModel(net, mean.detach(), std.detach())


def meta_aggregate(meta: MetaModel, logits: torch.Tensor, present: torch.Tensor | None = None) -> torch.Tensor:
    """MM aggregator: the meta-model's output logits for each sample. [N, n, C] -> [n, C]."""
    with torch.no_grad():
        return meta.net(meta_features(logits, present, meta.mean, meta.std))


# ----------------------------------------------------------------------------- local refinement


def distillation_loss(logits: torch.Tensor, teacher_probs: torch.Tensor, mask: torch.Tensor,
                      temperature: float) -> torch.Tensor:
    """T² · KL(softmax(z̄/T) ‖ softmax(z/T)) averaged over the real samples of a batch.

    ``teacher_probs`` = softmax(z̄) of the aggregated logits (the population engine's targets);
    log softmax(z̄)/T differs from z̄/T by a constant per sample, so softmax of it is softmax(z̄/T).
    """
    teacher = torch.softmax(torch.log(teacher_probs.clamp(min=1e-12)) / temperature, dim=-1)
    student = torch.log_softmax(logits / temperature, dim=-1)
    kl = (teacher * (torch.log(teacher.clamp(min=1e-12)) - student)).sum(-1)
    return temperature**2 * (kl * mask).sum() / mask.sum().clamp(min=1.0)
