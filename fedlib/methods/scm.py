"""FedSCM: federated sparse consensus matching (FedSCM paper, Def. 2–10, Prop. 7, Alg. 1).

The server holds the K client models' predictive distributions on its n unlabeled target
samples, ``probs [K, n, C]``, and picks client weights λ on the capped simplex
``{λ ≥ 0, Σλ = 1, λ_k ≤ s}`` with ``s = 1 − γ`` that minimise the mean entropy of the
mixed prediction (Def. 2), optionally plus the quantity-shift penalty ``κ Σ λ_k / n_k``
(Def. 10). Everything is vectorized over clients and samples: the objective is one
``einsum``, the gradient and Hessian of Proposition 7 are a KL/entropy reduction and one
``[K, nC] @ [nC, K]`` product.

Solvers (Algorithm 1): projected gradient descent from the uniform start — by default with
Algorithm 1's own step, ``max(λ − αg, 0)`` then at most ⌈1/(1−γ)⌉ clip-and-renormalise passes
``min(λ/Σλ, 1 − γ)`` (the exact Euclidean projection onto the capped simplex is the option
``projection="euclidean"``) — and scipy's SLSQP with the analytic gradient and the box + simplex
constraints. As the paper says (Def. 2, §6.3.1), the selected clients are those with a non-zero
weight in the solver's output: ``λ_k > SUPPORT_TOL`` (1e-6; the PGD step leaves exact zeros,
SLSQP leaves round-off of order 1e-10). By Theorem 3 the optimum is a vertex of the feasible
set — ⌊1/s⌋ weights equal to s, at most one equal to the remainder ``1 − ⌊1/s⌋ s``, the rest 0;
moving the output to the vertex its weights rank highest (:func:`to_vertex`) is the option
``rounding="vertex"``, never the default (it would hide whether the solver found Theorem 3's
structure). Note the count: γ = 0.67 gives s = 0.33, three clients at 0.33 leave 0.01 for a
fourth, so ⌈1/s⌉ = 4 non-zero weights at the vertex, where the paper's text says 3.

Algorithm 1's "SLSQP" line is ``q = argmin_q ½ qᵀ H q + qᵀ g`` with the Hessian of Eq. 5, then
``λ <- max(λ + α q, 0)`` and the renormalisation. The objective is concave, H is negative
semi-definite, so that unconstrained quadratic has no minimiser; scipy's SLSQP (used here)
solves the quadratic subproblem with a positive-definite quasi-Newton (BFGS) matrix in place
of H and the linearised constraints Σλ = 1, 0 ≤ λ ≤ 1 − γ, with a line search instead of α_t.

Also here: the Dirichlet expertise model of Def. 4 as a simulator of client predictions,
the expertise estimate η̂ of §6.3.5, exhaustive search over vertices (the test oracle for
small K), SDEA-style minimum-entropy selection and the selection-stability metrics of
Table 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import torch

EPS = 1e-12  # floor inside logarithms (predictions of trained models are never exactly 0)
TOL = 1e-9  # numerical tolerance of the vertex arithmetic
SUPPORT_TOL = 1e-6  # a solver weight above this counts as selected (the paper: non-zero weight)
ROUNDINGS = ("none", "vertex")
PROJECTIONS = ("paper", "euclidean")


# ----------------------------------------------------------------------------- Def. 2 / 10


def entropy(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """H(p) = Σ_i p_i log(1/p_i) (Def. 1), in nats."""
    return -(p * torch.log(p.clamp_min(EPS))).sum(dim)


def mixture(lam: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Σ_k λ_k h_k(X) for every sample: ``lam [..., K]``, ``probs [K, n, C]`` -> ``[..., n, C]``."""
    return torch.einsum("...k,knc->...nc", lam.to(probs.dtype), probs)


def objective(lam: torch.Tensor, probs: torch.Tensor, kappa: float = 0.0,
              sizes: torch.Tensor | None = None) -> torch.Tensor:
    """(1/n) Σ_X H(Σ_k λ_k h_k(X))  (Eq. 1)  +  κ Σ_k λ_k / n_k  (Eq. 7).

    ``lam`` may carry leading batch dimensions (many candidate weightings at once)."""
    value = entropy(mixture(lam, probs)).mean(-1)  # Eq. 1
    if kappa:
        value = value + kappa * (lam.to(probs.dtype) / sizes.to(probs.dtype)).sum(-1)  # Eq. 7
    return value


def gradient(lam: torch.Tensor, probs: torch.Tensor, kappa: float = 0.0,
             sizes: torch.Tensor | None = None) -> torch.Tensor:
    """g_k = (1/n) Σ_X [KL(h_k(X) ‖ Σ_i λ_i h_i(X)) + H(h_k(X))] − 1  (Eq. 4), plus κ / n_k.

    KL + H is the cross-entropy −Σ_c h_k log m, so g = −mean_X Σ_c h_k,c log m_c − 1."""
    m = mixture(lam, probs).clamp_min(EPS)  # [n, C]
    g = -torch.einsum("knc,nc->k", probs, torch.log(m)) / probs.shape[1] - 1.0  # Eq. 4
    if kappa:
        g = g + kappa / sizes.to(probs.dtype)
    return g


def hessian(lam: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """H_jk = −(1/n) Σ_X Σ_i h_j^(i)(X) h_k^(i)(X) / (Σ_l λ_l h_l^(i)(X))  (Eq. 5); the
    penalty of Eq. 7 is linear and adds nothing."""
    m = mixture(lam, probs).clamp_min(EPS)  # [n, C]
    k = probs.shape[0]
    scaled = (probs / m.sqrt()).reshape(k, -1)  # [K, nC]
    return -(scaled @ scaled.T) / probs.shape[1]  # Eq. 5


# ----------------------------------------------------------------------------- Theorem 3


def vertex_counts(gamma: float) -> tuple[int, float, int]:
    """(clients at s = 1 − γ, the remainder weight, ⌈1/s⌉ clients selected) for γ in [0, 1)."""
    s = 1.0 - gamma
    full = math.floor(1.0 / s + TOL)
    rest = 1.0 - full * s
    rest = rest if rest > TOL else 0.0
    return full, rest, full + (rest > 0)


def check_gamma(gamma: float) -> None:
    if not (0.0 <= gamma < 1.0):
        raise ValueError(f"gamma: must be in [0, 1) (got {gamma})")


def to_vertex(lam: torch.Tensor, gamma: float) -> torch.Tensor:
    """The vertex of the feasible set on the support ``lam`` ranks highest (Theorem 3):
    the ⌊1/s⌋ largest weights become s, the next one the remainder, the rest 0."""
    full, rest, _ = vertex_counts(gamma)
    order = torch.argsort(lam, descending=True, stable=True)
    out = torch.zeros_like(lam)
    out[order[:full]] = 1.0 - gamma
    if rest:
        out[order[full]] = rest
    return out


def is_sparse_vertex(lam, gamma: float, atol: float = 1e-6) -> bool:
    """Theorem 3's structure: feasible, ⌊1/s⌋ weights at s, at most one in (0, s), the rest 0."""
    lam = torch.as_tensor(lam, dtype=torch.float64)
    s = 1.0 - gamma
    full, rest, count = vertex_counts(gamma)
    at_cap = (lam - s).abs() <= atol
    at_zero = lam.abs() <= atol
    middle = ~(at_cap | at_zero)
    return (abs(float(lam.sum()) - 1.0) <= atol and bool((lam >= -atol).all()) and bool((lam <= s + atol).all())
            and int(at_cap.sum()) == full and int(middle.sum()) == (1 if rest > atol else 0)
            and int((~at_zero).sum()) == count)


def project_capped_simplex(v: torch.Tensor, cap: float, iters: int = 60) -> torch.Tensor:
    """Euclidean projection onto {0 ≤ λ ≤ cap, Σλ = 1}: λ = clip(v − τ, 0, cap) with the
    shift τ found by bisection (vectorized over the last dimension)."""
    lo = (v.min(-1, keepdim=True).values - cap)
    hi = v.max(-1, keepdim=True).values
    for _ in range(iters):
        mid = (lo + hi) / 2
        total = (v - mid).clamp(0.0, cap).sum(-1, keepdim=True)
        lo = torch.where(total > 1.0, mid, lo)
        hi = torch.where(total > 1.0, hi, mid)
    return (v - (lo + hi) / 2).clamp(0.0, cap)


def paper_normalization(lam: torch.Tensor, cap: float, times: int) -> torch.Tensor:
    """Algorithm 1's projection step: at most ⌈1/(1−γ)⌉ times, ``λ <- min(λ / Σλ, 1 − γ)``
    (stops early once a pass changes nothing). Not the Euclidean projection: the result can
    sum to less than 1 — with γ = 0.67, three weights at 0.33 are a fixed point (Σλ = 0.99)."""
    cap_t = torch.tensor(cap, dtype=lam.dtype)
    for _ in range(times):
        total = lam.sum()
        if total <= 0:
            break
        new = torch.minimum(lam / total, cap_t)
        if torch.equal(new, lam):
            break
        lam = new
    return lam


# ----------------------------------------------------------------------------- Algorithm 1


@dataclass
class Selection:
    """A solver's output: the weights, the selected clients and how it got there."""

    weights: torch.Tensor  # [K] the weights used: the solver's output, or its vertex with rounding="vertex"
    raw: torch.Tensor  # [K] the solver's output
    objective: float  # at ``weights``
    iterations: int
    solver: str
    info: dict = field(default_factory=dict)
    rounding: str = "none"

    @property
    def selected(self) -> np.ndarray:
        """The clients with a non-zero weight (> SUPPORT_TOL), as the paper selects."""
        return support(self.weights)

    @property
    def raw_selected(self) -> np.ndarray:
        return support(self.raw)

    def to_dict(self) -> dict:
        gamma = self.info.get("gamma")
        vertex = to_vertex(self.raw, gamma) if gamma is not None else self.weights
        return {"weights": self.weights.tolist(), "selected": self.selected.tolist(), "objective": self.objective,
                "iterations": self.iterations, "solver": self.solver, "rounding": self.rounding,
                "raw_weights": self.raw.tolist(), "raw_selected": self.raw_selected.tolist(),
                "vertex_selected": support(vertex).tolist(),
                "raw_distance_to_vertex": float((vertex - self.raw).abs().sum()), **self.info}


def support(lam) -> np.ndarray:
    """Indices of the non-zero weights, ``λ_k > SUPPORT_TOL`` (Def. 2: selected = non-zero)."""
    return np.flatnonzero(torch.as_tensor(lam).detach().cpu().numpy() > SUPPORT_TOL)


def _finish(raw: torch.Tensor, gamma: float, rounding: str, probs, kappa, sizes, iterations: int, solver: str,
            info: dict) -> Selection:
    weights = to_vertex(raw, gamma) if rounding == "vertex" else raw
    return Selection(weights, raw, float(objective(weights, probs, kappa, sizes)), iterations, solver,
                     {**info, "gamma": gamma}, rounding)


def _check(probs: torch.Tensor, gamma: float, kappa: float, sizes, rounding: str = "none"):
    """Validate a selection's arguments; return ``probs`` and ``sizes`` (None stays None) as float64."""
    check_gamma(gamma)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding: must be one of {', '.join(ROUNDINGS)} (got {rounding!r})")
    if probs.dim() != 3:
        raise ValueError(f"probs: must be [K, n, C] (got shape {tuple(probs.shape)})")
    if vertex_counts(gamma)[2] > probs.shape[0]:
        raise ValueError(f"gamma: selects ⌈1/(1−γ)⌉ = {vertex_counts(gamma)[2]} clients, more than K = "
                         f"{probs.shape[0]} (got {gamma})")
    if kappa < 0:
        raise ValueError(f"kappa: must be >= 0 (got {kappa})")
    if kappa and (sizes is None or len(sizes) != probs.shape[0] or (torch.as_tensor(sizes) <= 0).any()):
        raise ValueError("sizes: kappa > 0 needs the K positive client sample sizes n_k")
    # the solver works on the CPU in float64 ([K, n, C] is small): the same numbers whatever device trained
    return probs.detach().double().cpu(), None if sizes is None else torch.as_tensor(sizes, dtype=torch.float64)


def pgd(probs: torch.Tensor, gamma: float, *, kappa: float = 0.0, sizes=None, steps: int = 500,
        lr: float | None = None, init: torch.Tensor | None = None, projection: str = "paper",
        tol: float = 1e-10, rounding: str = "none") -> Selection:
    """Projected gradient descent (Algorithm 1) from λ⁽⁰⁾ = 1/K (or ``init``).

    Each step ``λ <- Π(λ − α g(λ))``. ``projection="paper"`` (default) is Algorithm 1's
    ``max(·, 0)`` followed by at most ⌈1/(1−γ)⌉ clip-and-renormalise passes
    ``min(λ/Σλ, 1 − γ)``; ``"euclidean"`` is the exact projection onto the capped simplex
    (an option). The selection is the support of the output (``rounding="vertex"`` moves it
    to Theorem 3's vertex first, an option). The paper leaves α_t open; our default
    is constant: ``s / (4 spread)`` (euclidean; ``spread`` = range of the first gradient, so
    the first step moves the best client by s/4) or ``1 / (2 K max|g|)`` (paper: no weight
    leaves the simplex in the first step, so the renormalisation acts as a multiplicative
    update). Stops when λ no longer changes."""
    probs, sizes = _check(probs, gamma, kappa, sizes, rounding)
    if projection not in PROJECTIONS:
        raise ValueError(f"projection: must be 'paper' or 'euclidean' (got {projection!r})")
    if steps < 1:
        raise ValueError(f"steps: must be >= 1 (got {steps})")
    if lr is not None and lr <= 0:
        raise ValueError(f"lr: must be > 0 (got {lr})")
    k, cap = probs.shape[0], 1.0 - gamma
    lam = torch.full((k,), 1.0 / k, dtype=torch.float64) if init is None else torch.as_tensor(init).double()
    times = vertex_counts(gamma)[2]
    step = lr
    it = 0
    for it in range(1, steps + 1):
        g = gradient(lam, probs, kappa, sizes)
        if step is None:
            step = (cap / (4.0 * max(float(g.max() - g.min()), 1e-12)) if projection == "euclidean"
                    else 0.5 / (k * max(float(g.abs().max()), 1e-12)))
        if projection == "euclidean":
            new = project_capped_simplex(lam - step * g, cap)
        else:
            new = (lam - step * g).clamp_min(0.0)  # Algorithm 1, PGD line
            if float(new.sum()) <= 0:  # every weight hit 0: keep the best-ranked ones
                new = (g.min() - g + 1e-12).clamp_min(0.0)
            new = paper_normalization(new, cap, times)
        moved = float((new - lam).abs().max())
        lam = new
        if moved < tol:
            break
    return _finish(lam, gamma, rounding, probs, kappa, sizes, it, "pgd", {"step": step, "projection": projection})


def slsqp(probs: torch.Tensor, gamma: float, *, kappa: float = 0.0, sizes=None, init: torch.Tensor | None = None,
          maxiter: int = 200, ftol: float = 1e-10, rounding: str = "none") -> Selection:
    """SLSQP (scipy) with the analytic objective and gradient (Eq. 1, 4, 7), bounds
    0 ≤ λ_k ≤ 1 − γ and the equality Σλ = 1, from λ⁽⁰⁾ = 1/K (or ``init``). Where scipy's
    step differs from Algorithm 1's: see the module docstring (a BFGS matrix replaces the
    negative semi-definite Hessian of Eq. 5, whose quadratic has no minimiser)."""
    # lazy: scipy.optimize (~0.4 s) stays out of `import fedlib`; only the SLSQP solver needs it
    from scipy.optimize import minimize

    probs, sizes_t = _check(probs, gamma, kappa, sizes, rounding)
    k, cap = probs.shape[0], 1.0 - gamma
    x0 = np.full(k, 1.0 / k) if init is None else np.asarray(init, dtype=float)

    def fun(x):
        return float(objective(torch.from_numpy(x), probs, kappa, sizes_t))

    def jac(x):
        return gradient(torch.from_numpy(x), probs, kappa, sizes_t).numpy()

    res = minimize(fun, x0, jac=jac, method="SLSQP", bounds=[(0.0, cap)] * k,
                   constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0, "jac": lambda x: np.ones_like(x)}],
                   options={"maxiter": maxiter, "ftol": ftol})
    raw = torch.from_numpy(np.clip(res.x, 0.0, cap))
    return _finish(raw, gamma, rounding, probs, kappa, sizes_t, int(res.nit), "slsqp",
                   {"converged": bool(res.success), "message": str(res.message)})


SOLVERS = {"pgd": pgd, "slsqp": slsqp}


def select(probs: torch.Tensor, gamma: float, solver: str = "pgd", **kwargs) -> Selection:
    """FedSCM selection with the named solver (``pgd`` or ``slsqp``)."""
    if solver not in SOLVERS:
        raise ValueError(f"solver: must be one of {', '.join(SOLVERS)} (got {solver!r})")
    return SOLVERS[solver](probs, gamma, **kwargs)


def all_vertices(k: int, gamma: float) -> torch.Tensor:
    """Every vertex of the feasible set for K clients: ``[V, K]`` (small K only)."""
    full, rest, _ = vertex_counts(gamma)
    rows = []
    for top in combinations(range(k), full):
        others = [j for j in range(k) if j not in top] if rest else [None]
        for extra in others:
            row = np.zeros(k)
            row[list(top)] = 1.0 - gamma
            if extra is not None:
                row[extra] = rest
            rows.append(row)
    return torch.tensor(np.array(rows))


def exhaustive(probs: torch.Tensor, gamma: float, kappa: float = 0.0, sizes=None, chunk: int = 4096) -> Selection:
    """The global optimum by evaluating the objective at every vertex (Theorem 3 puts it
    at one); vertices are scored in batched chunks. The oracle for small K."""
    probs, sizes_t = _check(probs, gamma, kappa, sizes)
    vertices = all_vertices(probs.shape[0], gamma)
    values = torch.cat([objective(vertices[i:i + chunk], probs, kappa, sizes_t)
                        for i in range(0, len(vertices), chunk)])
    best = int(values.argmin())
    return Selection(vertices[best], vertices[best], float(values[best]), len(vertices), "exhaustive",
                     {"gamma": gamma})


# ----------------------------------------------------------------------------- Def. 4


@dataclass
class ExpertiseSample:
    """Simulated client predictions under the Dirichlet expertise model (Def. 4)."""

    probs: torch.Tensor  # [K, n, C] h_k(X)
    truth: torch.Tensor  # [n, C] P(.|X)
    labels: torch.Tensor  # [n] argmax of P(.|X)
    eta: torch.Tensor  # [K] expertise levels
    experts: np.ndarray  # indices of the relevant clients


def simulate_expertise(k: int, n: int, c: int, eta, *, noise_alpha: float = 1.0, label_smoothing: float = 0.05,
                       seed: int = 0, noise: str = "per_sample") -> ExpertiseSample:
    """h_k(X) = η_k P(·|X) + (1 − η_k) Q_{k,X}, Q_{k,X} ~ Dirichlet(α, …, α)  (Eq. 2).

    P(·|X) puts 1 − ``label_smoothing`` on a uniformly drawn true class and spreads the rest
    evenly (its entropy bounds the Bayes error, Assumption 5). Experts are the clients with
    η ≥ 0.5. All K × n noise draws come from one Gamma sample.

    ``noise="per_sample"`` is Def. 4 (a fresh Q for every client and input). ``"per_client"``
    is not the paper's model: one Q_k per client for all inputs — a constant predictor, what a
    client trained on one or two classes becomes under strong label shift; clients whose Q_k
    share an arg-max agree on every input (the failure measured in the chapter, issue 22)."""
    eta = torch.as_tensor(eta, dtype=torch.float64)
    if eta.shape != (k,) or bool(((eta < 0) | (eta > 1)).any()):
        raise ValueError(f"eta: must be K = {k} values in [0, 1]")
    if noise_alpha <= 0:
        raise ValueError(f"noise_alpha: must be > 0 (got {noise_alpha})")
    if not 0 <= label_smoothing < 1:
        raise ValueError(f"label_smoothing: must be in [0, 1) (got {label_smoothing})")
    if noise not in ("per_sample", "per_client"):
        raise ValueError(f"noise: must be 'per_sample' or 'per_client' (got {noise!r})")
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(c, (n,), generator=gen)
    truth = torch.full((n, c), label_smoothing / c, dtype=torch.float64)
    truth[torch.arange(n), labels] += 1.0 - label_smoothing
    draws = n if noise == "per_sample" else 1
    gamma_draw = torch._standard_gamma(torch.full((k, draws, c), float(noise_alpha), dtype=torch.float64),
                                       generator=gen).clamp_min(1e-300).expand(k, n, c)
    noise = gamma_draw / gamma_draw.sum(-1, keepdim=True)  # Q_{k,X} ~ Dir(α)
    probs = eta.view(k, 1, 1) * truth + (1 - eta.view(k, 1, 1)) * noise  # Eq. 2
    return ExpertiseSample(probs, truth, labels, eta, np.flatnonzero(eta.numpy() >= 0.5))


def expertise_levels(k: int, n_experts: int, *, expert_range=(0.9, 1.0), other_range=(0.0, 0.1),
                     seed: int = 0) -> torch.Tensor:
    """η for K clients: ``n_experts`` random clients drawn uniformly in ``expert_range``, the
    others in ``other_range``."""
    rng = np.random.default_rng(seed)
    eta = rng.uniform(*other_range, size=k)
    experts = rng.choice(k, n_experts, replace=False)
    eta[experts] = rng.uniform(*expert_range, size=n_experts)
    return torch.from_numpy(eta)


def estimate_expertise(probs: torch.Tensor, labels: torch.Tensor, *, noise_alpha: float = 1.0, repeats: int = 5,
                       grid: int = 101, seed: int = 0) -> torch.Tensor:
    """η̂_k = argmin_η (1/n) Σ_X KL(h_k(X) ‖ η P(·|X) + (1 − η) Q_X)  (§6.3.5), averaged over
    ``repeats`` draws of Q_X ~ Dir(α). P(·|X) is the one-hot true label. The minimum is
    taken on a grid of η values, all clients at once (a loop over grid points only)."""
    _, n, c = probs.shape
    probs = probs.double().clamp_min(EPS)
    onehot = torch.nn.functional.one_hot(labels.long(), c).double()  # [n, C]
    gen = torch.Generator().manual_seed(seed)
    etas = torch.linspace(0.0, 1.0, grid, dtype=torch.float64)
    estimates = []
    self_term = (probs * probs.log()).sum(-1).mean(-1)  # [K]
    for _ in range(repeats):
        draw = torch._standard_gamma(torch.full((n, c), float(noise_alpha), dtype=torch.float64), generator=gen)
        q = draw.clamp_min(1e-300) / draw.clamp_min(1e-300).sum(-1, keepdim=True)  # Q_X, shared by clients
        kl = torch.stack([self_term - torch.einsum("knc,nc->k", probs, (e * onehot + (1 - e) * q)
                                                   .clamp_min(EPS).log()) / n for e in etas])  # [G, K]
        estimates.append(etas[kl.argmin(0)])
    return torch.stack(estimates).mean(0)


# ----------------------------------------------------------------------------- issue 22


def prediction_structure(probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """How the clients' hard predictions on the server set are organised (all clients at once):

    modal_class [K]   the class a client predicts most often
    mode_share  [K]   the share of inputs on which it predicts that class (1 = a constant
                      predictor; under Def. 4 a non-expert's arg-max is fresh noise per input)
    agreement [K, K]  the share of inputs on which two clients predict the same class"""
    k, n, c = probs.shape
    onehot = torch.nn.functional.one_hot(probs.argmax(-1), c).double()  # [K, n, C]
    per_class = onehot.sum(1)  # [K, C]
    share, modal = per_class.max(1)
    return {"modal_class": modal, "mode_share": share / n,
            "agreement": torch.einsum("knc,jnc->kj", onehot, onehot) / n}


def agreeing_pairs(agreement: torch.Tensor, members, threshold: float = 0.9) -> float:
    """Share of the pairs of ``members`` whose predictions agree on at least ``threshold`` of the
    inputs (NaN for fewer than 2 members)."""
    members = torch.as_tensor(np.asarray(members), dtype=torch.long)
    if len(members) < 2:
        return float("nan")
    sub = agreement[members][:, members]
    iu = torch.triu_indices(len(members), len(members), 1)
    return float((sub[iu[0], iu[1]] >= threshold).double().mean())


def tempered(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(log h / T): the client predictions at temperature T (= softmax(logits / T))."""
    if temperature <= 0:
        raise ValueError(f"temperature: must be > 0 (got {temperature})")
    return torch.softmax(torch.log(probs.clamp_min(EPS)) / temperature, -1)


# ----------------------------------------------------------------------------- baselines


def mean_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Each client's mean prediction entropy on the server set, ``[K]``."""
    return entropy(probs).mean(-1)


def sdea_select(probs: torch.Tensor, m: int) -> np.ndarray:
    """SDEA-style selection: the ``m`` clients whose predictions have the lowest mean entropy
    (individual confidence only, no consensus term)."""
    if not 1 <= m <= probs.shape[0]:
        raise ValueError(f"m: must be in [1, K = {probs.shape[0]}] (got {m})")
    return np.sort(torch.argsort(mean_entropy(probs), stable=True)[:m].cpu().numpy())


# ----------------------------------------------------------------------------- Table 1


STABILITY_METRICS = ("D.R.", "Hamming", "Entropy", "Cosine", "F1", "Jaccard")


def stability(selections) -> dict[str, float]:
    """Pairwise stability of R binary selection vectors ``[R, K]`` (Table 1), averaged over
    all pairs of runs (our reading; the paper names the metrics without formulas):

    D.R.     disagreement ratio |a △ b| / |a ∪ b|: clients picked in one run but not the other
    Hamming  |a △ b| / (|a| + |b|): differing bits, normalised by the bits that are set
    Entropy  mean over clients of the binary entropy (bits) of their selection frequency
    Cosine   1 − a·b / (‖a‖ ‖b‖)
    F1       1 − 2|a ∩ b| / (|a| + |b|)   (1 − F1 of one run's selection against the other's)
    Jaccard  |a ∩ b| / |a ∪ b|  — a similarity: in the paper's Table 1 D.R. + Jaccard ≈ 1
    """
    s = torch.as_tensor(np.asarray(selections), dtype=torch.float64)
    r = s.shape[0]
    if r < 2:
        raise ValueError(f"selections: need at least 2 runs (got {r})")
    inter = s @ s.T  # [R, R]
    size = s.sum(1)
    union = size[:, None] + size[None, :] - inter
    xor = union - inter
    iu = torch.triu_indices(r, r, 1)

    def pick(m):
        return m[iu[0], iu[1]]

    freq = s.mean(0).clamp(1e-12, 1 - 1e-12)
    ent = -(freq * freq.log2() + (1 - freq) * (1 - freq).log2())
    ent = torch.where((s.mean(0) == 0) | (s.mean(0) == 1), torch.zeros_like(ent), ent)
    norms = size.sqrt()
    return {
        "D.R.": float(pick(xor / union.clamp_min(1)).mean()),
        "Hamming": float(pick(xor / (size[:, None] + size[None, :]).clamp_min(1)).mean()),
        "Entropy": float(ent.mean()),
        "Cosine": float(pick(1 - inter / (norms[:, None] * norms[None, :]).clamp_min(1e-12)).mean()),
        "F1": float(pick(1 - 2 * inter / (size[:, None] + size[None, :]).clamp_min(1)).mean()),
        "Jaccard": float(pick(inter / union.clamp_min(1)).mean()),
    }
