"""Federated domain-adaptation baselines of FedSCM's Tables 2–4: K3DA (KD3A), Co-MDA, FMDA-OT.

Each rule reads the K client models' predictive distributions on the server's n unlabeled
target samples, ``probs [K, n, C]`` (and, for FMDA-OT, the inputs), and returns client weights,
target pseudo-labels and a mask of the samples they cover; ``fedlib.scm_pipeline`` trains with
them. Everything is vectorized over clients (and permutations, and transport problems).

K3DA — KD3A, Feng et al., ICML 2021; followed: the authors' code, FengHZ/KD3A
``lib/utils/federated_utils.py`` (``federated_average`` l. 16–40, ``knowledge_vote`` l. 43–64,
``calculate_consensus_focus`` l. 67–94) and ``train/train.py`` (the vote l. 79, the consensus
focus l. 101, the re-weighting l. 103–121); the gate is ``confidence_gate_begin`` 0.9 of
``config/DigitFive.yaml`` (it rises to 0.95 during training there):

    knowledge vote (per target sample X): each source votes for its arg-max class c_k(X) with
    its confidence p_k(X) = max_c h_k(X)_c; only sources with p_k(X) > gate vote when any does;
    score_c(X) = Σ_{k votes} p_k(X) [c_k(X) = c];  label(X) = argmax_c score_c(X);
    conf(X) = max_c score_c(X);  mask(X) = [max_k p_k(X) > gate]
    consensus quality of a set S of sources: Q(S) = Σ_X conf_S(X) mask_S(X)
    consensus focus: CF_k = Shapley value of source k in the game Q (the code averages the
    marginal gain Q(π_{≤k}) − Q(π_{<k}) over every permutation π of the sources)
    weights: target α_T = (share of masked samples) / (K + 1); source α_k = (1 − α_T) CF_k / Σ CF
    aggregation: Σ α over the target model and the sources, BatchNorm statistics included
    ("BatchNorm MMD" in the code: ``federated_average(batchnorm_mmd=True)`` averages the whole
    state dict, running means and variances too)

Departures (listed on the chapter page): with K! permutations out of reach beyond K = 8, CF
is the Monte-Carlo Shapley estimate over ``permutations`` random permutations (exact for
small K); the weights are computed once from the trained clients instead of every epoch with
momentum 0.9; no mixup on the target samples.

Co-MDA — Liu et al., "Co-MDA: Federated multi-source domain adaptation on black-box models",
IEEE TCSVT 2023. The paper is not openly available and no public code was found; this is our
reading of its abstract and of FedSCM's Table 5 (black-box sources, sparse client selection):
the server sees only the sources' predictions, weights them by agreement with the weighted
consensus (iterated to a fixed point), keeps the ``m`` best, and trains a target model from
scratch on the consensus pseudo-labels, then refines the labels with the target model's own
predictions (co-learning) and trains again. No source parameters are aggregated.

    w⁽⁰⁾ = 1/K;  p̄ = Σ_k w_k h_k;  w_k ∝ exp(−mean_X CE(onehot(argmax p̄(X)), h_k(X)))

FMDA-OT — Ghannou & Bennani, arXiv 2404.06599 (v1, "FMDA-OT"; v3 "CMDA-OT"), §3: phase 1
adapts every source to the target by entropic optimal transport (Sinkhorn) between its samples
and the target samples, the source samples being moved to the target by the barycentric map
``x̂_i = n_s Σ_j T_ij x_j``; phase 2 is FedAvg of the sources on their transported samples,
the server weighting the sources by their accuracy on a small pseudo-labelled target
validation subset and fine-tuning on it. Our pseudo-labels for that subset are the sources'
labels carried through the same plans (``label transport``: the class mass each target sample
receives). Transport problems of all clients are solved together by one batched Sinkhorn
(:func:`sinkhorn_batch`: the scaling iterations of POT's ``ot.batch.solve_batch(method="sinkhorn")``,
POT 0.9.7 ``ot/batch/_utils.py`` ``bregman_projection_batch``, on the data's own device; POT is the
test oracle), each client's samples padded to a common size with zero mass.
"""

from __future__ import annotations

import math
from itertools import permutations as _all_permutations

import numpy as np
import torch

# ----------------------------------------------------------------------------- K3DA


def vote_contributions(probs: torch.Tensor, gate: float) -> torch.Tensor:
    """Each source's vote on each sample, ``[K, n, C]``: p_k(X) on its arg-max class when
    p_k(X) > gate, else 0 (KD3A ``knowledge_vote``)."""
    conf, cls = probs.max(-1)  # [K, n]
    passed = (conf > gate).to(probs.dtype)
    return torch.nn.functional.one_hot(cls, probs.shape[-1]).to(probs.dtype) * (conf * passed).unsqueeze(-1)


def knowledge_vote(probs: torch.Tensor, gate: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(conf [n], label [n], mask [n]) of the knowledge vote over all K sources. Where no source
    passes the gate every source votes with its confidence (the code's "[0,0,0] situation"),
    and the sample is masked out."""
    conf, cls = probs.max(-1)  # [K, n]
    passed = conf > gate
    any_passed = passed.any(0)  # [n]
    weight = torch.where(any_passed.unsqueeze(0), conf * passed.to(conf.dtype), conf)  # [K, n]
    scores = (torch.nn.functional.one_hot(cls, probs.shape[-1]).to(probs.dtype) * weight.unsqueeze(-1)).sum(0)
    top, label = scores.max(-1)
    return top, label, any_passed


def consensus_focus(probs: torch.Tensor, gate: float, permutations: int = 32, seed: int = 0,
                    chunk: int = 256) -> torch.Tensor:
    """Shapley value of each source in the game Q (KD3A ``calculate_consensus_focus``), ``[K]``.

    Exact (every permutation) when K! ≤ ``permutations``; otherwise the mean marginal gain over
    ``permutations`` random permutations. All permutations at once: the votes in permutation
    order, a cumulative sum over sources gives every prefix's scores, and Q is additive over
    samples, so samples are processed in chunks."""
    votes = vote_contributions(probs.double(), gate)  # [K, n, C]
    k, n, _ = votes.shape
    if math.factorial(k) <= permutations:
        perms = torch.tensor(list(_all_permutations(range(k))), dtype=torch.long)
    else:
        gen = torch.Generator().manual_seed(seed)
        perms = torch.argsort(torch.rand(permutations, k, generator=gen), dim=1)
    gains = torch.zeros(perms.shape[0], k, dtype=torch.float64)
    for s in range(0, n, chunk):  # chunks of samples (memory), not clients
        prefix = votes[perms, s:s + chunk].cumsum(1)  # [P, K, n_chunk, C]: scores of every prefix
        q = prefix.max(-1).values.sum(-1)  # [P, K]: Q of every prefix
        gains += torch.diff(q, dim=1, prepend=torch.zeros(perms.shape[0], 1, dtype=q.dtype))
    cf = torch.zeros(perms.shape[0], k, dtype=torch.float64).scatter_(1, perms, gains)  # back to source order
    return cf.mean(0)


def kd3a_weights(probs: torch.Tensor, gate: float, permutations: int = 32, seed: int = 0) -> dict:
    """KD3A's aggregation weights (train.py l. 96–113): the target model's α_T and the sources'
    α_k ∝ CF_k, with the knowledge-vote pseudo-labels and mask on the server set."""
    _, label, mask = knowledge_vote(probs, gate)
    k = probs.shape[0]
    target = float(mask.double().mean()) / (k + 1)
    cf = consensus_focus(probs, gate, permutations, seed)
    if float(cf.sum()) == 0:
        cf = cf + 1e-3
    return {"sources": (1 - target) * cf / cf.sum(), "target": target, "labels": label, "mask": mask,
            "consensus_focus": cf}


# ----------------------------------------------------------------------------- Co-MDA (our reading)


def comda_weights(probs: torch.Tensor, keep: int, iterations: int = 10) -> dict:
    """Agreement weights iterated to a fixed point, the ``keep`` best sources, and the
    consensus pseudo-labels of those (their weighted mixture)."""
    k, n, c = probs.shape
    if not 1 <= keep <= k:
        raise ValueError(f"keep: must be in [1, K = {k}] (got {keep})")
    logp = probs.double().clamp_min(1e-12).log()
    w = torch.full((k,), 1.0 / k, dtype=torch.float64)
    for _ in range(iterations):  # fixed-point iterations, not clients
        label = torch.einsum("k,knc->nc", w, probs.double()).argmax(-1)  # [n]
        ce = -logp.gather(-1, label.view(1, n, 1).expand(k, n, 1)).squeeze(-1).mean(-1)  # [K]
        w = torch.softmax(-ce, 0)
    chosen = torch.argsort(w, descending=True, stable=True)[:keep]
    kept = torch.zeros(k, dtype=torch.float64)
    kept[chosen] = w[chosen] / w[chosen].sum()
    mix = torch.einsum("k,knc->nc", kept, probs.double())
    return {"weights": kept, "selected": np.sort(chosen.numpy()), "labels": mix.argmax(-1), "mixture": mix}


# ----------------------------------------------------------------------------- FMDA-OT


def sinkhorn_batch(cost: torch.Tensor, a: torch.Tensor, b: torch.Tensor, reg: float, max_iter: int = 1000,
                   tol: float = 1e-9) -> torch.Tensor:
    """Entropic OT plans of B problems at once: ``cost [B, m, n]``, marginals ``a [B, m]``, ``b [B, n]``.

        K = exp(−C / ε);  f ← a / (K g);  g ← b / (Kᵀ f);  T = diag(f) K diag(g)     (Sinkhorn scaling)

    from f = g = 1, stopping (checked every 10 iterations, as POT does) once the largest row-marginal
    error ‖T 1 − a‖₂ over the batch is below ``tol``."""
    kernel = torch.exp(-cost / reg)
    f, g = torch.ones_like(a), torch.ones_like(b)
    for it in range(max_iter):  # fixed-point iterations, not clients: the batch is one tensor
        f = a / (kernel * g[:, None, :]).sum(2)
        g = b / (kernel * f[:, :, None]).sum(1)
        if it % 10 == 0:
            error = ((kernel * f[:, :, None] * g[:, None, :]).sum(2) - a).pow(2).sum(1).sqrt().max()
            if error < tol:
                break
    return kernel * f[:, :, None] * g[:, None, :]


def transport_plans(source_x: torch.Tensor, source_mass: torch.Tensor, target_x: torch.Tensor, reg: float,
                    max_iter: int = 1000, tol: float = 1e-9) -> torch.Tensor:
    """Entropic OT plans between every client's samples and the target samples, one batched
    solve (:func:`sinkhorn_batch`): ``source_x [K, m, d]`` (padded), ``source_mass [K, m]`` (each
    row sums to 1, zero on padding), ``target_x [n, d]`` with uniform mass -> plans ``[K, m, n]``. The
    squared Euclidean cost is divided by its maximum over the client's real samples, so ``reg`` is relative."""
    cost = torch.cdist(source_x.double(), target_x.double().unsqueeze(0).expand(source_x.shape[0], -1, -1)) ** 2
    real = (source_mass > 0).unsqueeze(-1)
    cost = cost / torch.where(real, cost, 0.0).amax(dim=(1, 2), keepdim=True).clamp_min(1e-12)
    b = torch.full((source_x.shape[0], target_x.shape[0]), 1.0 / target_x.shape[0], dtype=torch.float64,
                   device=cost.device)
    return sinkhorn_batch(cost, source_mass.double().to(cost.device), b, reg, max_iter, tol)


def barycentric_map(plans: torch.Tensor, source_mass: torch.Tensor, target_x: torch.Tensor) -> torch.Tensor:
    """x̂_i = Σ_j T_ij x_j / Σ_j T_ij: each source sample moved to the target (``[K, m, d]``)."""
    rows = plans.sum(-1, keepdim=True).clamp_min(1e-300)
    return torch.einsum("kmn,nd->kmd", plans, target_x.double()) / rows


def label_transport(plans: torch.Tensor, source_y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class mass each target sample receives from each client's labelled samples through its
    plan, normalised per target sample: ``[K, n, C]`` (rows of zeros where nothing arrives)."""
    onehot = torch.nn.functional.one_hot(source_y.long(), num_classes).double()  # [K, m, C]
    mass = torch.einsum("kmn,kmc->knc", plans, onehot)
    return mass / mass.sum(-1, keepdim=True).clamp_min(1e-300)


def fmda_ot_weights(probs_val: torch.Tensor, pseudo_val: torch.Tensor) -> torch.Tensor:
    """Phase 2's source weights: each source model's accuracy on the pseudo-labelled target
    validation subset, normalised (uniform when every accuracy is 0)."""
    acc = (probs_val.argmax(-1) == pseudo_val.view(1, -1)).double().mean(-1)
    if float(acc.sum()) == 0:
        return torch.full_like(acc, 1.0 / len(acc))
    return acc / acc.sum()
