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
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..population import Evaluation, padded_indices, predict

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


# ----------------------------------------------------------------------------- the protocol as methods


def split_validation(indices: list[np.ndarray], fraction: float, seed: int):
    """Each client's samples -> (training lists, validation table [N, V], validity [N, V]).

    One shuffle of all clients (random keys, argsort); client i keeps the first
    ceil(fraction * n_i) of its shuffled samples for validation (at least 1, at most n_i - 1)."""
    table, sizes = padded_indices(indices)
    col = torch.arange(table.shape[1]).unsqueeze(0)
    real = col < sizes.unsqueeze(1)
    keys = torch.rand(table.shape, generator=torch.Generator().manual_seed(seed + 7))
    shuffled = torch.gather(table, 1, torch.argsort(keys.masked_fill(~real, 2.0), dim=1))
    n_val = torch.ceil(fraction * sizes).long().clamp(min=1).minimum((sizes - 1).clamp(min=0))
    width = max(int(n_val.max()), 1)
    val_valid = col[:, :width] < n_val.unsqueeze(1)
    train_keep = (col >= n_val.unsqueeze(1)) & real
    train = [row[keep].numpy() for row, keep in zip(shuffled, train_keep)]  # ragged lists for the batcher
    return train, shuffled[:, :width], val_valid


def weight_diagnostics(w: torch.Tensor, present: torch.Tensor, y: torch.Tensor, n_classes: int,
                       bins: int = 20) -> dict:
    """UWA weights on the public set: per client and true class mean weight, histograms of the
    largest weight and of the normalised entropy (1 = uniform over the clients present)."""
    onehot = F.one_hot(y, n_classes).to(w.dtype)  # [n, C]
    by_class = (w @ onehot) / onehot.sum(0).clamp(min=1)  # [N, C]
    n_present = int(present.sum())
    entropy = -(w * torch.log(w.clamp(min=1e-30))).sum(0) / max(math.log(n_present), 1e-12)
    top = w.max(0).values
    edges = torch.linspace(0, 1, bins + 1)
    return {
        "class_weight": by_class.tolist(),
        "max_weight_hist": torch.histc(top.float().cpu(), bins, 0, 1).tolist(),
        "entropy_hist": torch.histc(entropy.clamp(0, 1).float().cpu(), bins, 0, 1).tolist(),
        "hist_edges": edges.tolist(),
        "mean_max_weight": float(top.mean()),
        "mean_entropy": float(entropy.mean()) if n_present > 1 else 0.0,
        "uniform_weight": 1.0 / n_present,
    }


from .base import ClientState, DistillationProtocol, LocalPhase, Method, register  # noqa: E402  (the functions above need none of it)


@dataclass
class LogitFL(DistillationProtocol, Method):
    """The logit-based protocol ("Who to trust?", arXiv 2509.15147) on the engine. Each client
    keeps its own model (the engine's client state); per round:

    1. the present clients train on their private data (minus a ``val_fraction`` validation split);
    2. they upload their logits on the public set (the server's held-out set, ``server_val``
       samples) and on their own validation split;
    3. the server aggregates the public logits (``aggregate_logits``: simple averaging, UWA or the
       meta-model); the same rule on the test logits is the global prediction the run reports;
    4. the clients refine on the soft targets softmax(z̄) with  T² KL(softmax(z̄/T) ‖ softmax(z/T))
       (``distillation_loss``), ``distill_epochs`` over the public set (not after the last round).

    ``public_logits``: ``after_local`` is that order; ``after_refine`` refines on the previous
    round's aggregate right after step 1, so uploads come from refined models. ``dropout``: each
    client misses a round with this probability (every client is asked each round, whatever
    ``clients_per_round`` says; batches are drawn for the present clients, the
    engine's convention). No shared model: the uploads are never clipped. The protocol's own
    loop is ``fedlib.testing.logit_protocol_loop`` (the tests' oracle: same numbers).

    Server state (on the method): ``targets``, softmax of the last aggregate on the public set
    (the soft targets of this round's refinement, or of the next round's with ``after_refine``).
    Round data (``state.round_data``, from ``weigh`` to ``evaluate``): ``present`` [N] bool,
    ``validation`` [N, m, C] the clients' logits on their validation splits, the aggregator fitted
    on the public logits and reused on the test logits (UWA's ``gmm``, the ``meta_model``),
    ``weight_summary`` (UWA's entries for the round's diagnostics) and ``diagnostics`` (the
    round's, ``evaluate`` adds the clients' test accuracies)."""

    needs_validation = True  # the public set
    parameter_uploads = False
    distill_epochs: int = 1
    distill_lr: float | None = None  # None: the config's lr
    temperature: float = 2.0
    public_logits: str = "after_local"
    val_fraction: float = 0.1
    dropout: float = 0.0

    def validate(self) -> None:
        lr = self.distill_lr
        self.check(("distill_epochs", self.distill_epochs >= 0 and self.distill_epochs == int(self.distill_epochs),
                    "a whole number >= 0"),
                   ("distill_lr", lr is None or (isinstance(lr, (int, float)) and lr > 0), "> 0 or null"),
                   ("temperature", self.temperature > 0, "> 0"),
                   ("public_logits", self.public_logits in ("after_local", "after_refine"),
                    "'after_local' or 'after_refine'"),
                   ("val_fraction", 0 < self.val_fraction < 1, "in (0, 1)"),
                   ("dropout", 0 <= self.dropout < 1, "in [0, 1)"))

    def setup(self, fed) -> None:
        super().setup(fed)
        data = fed.client_data(np.arange(fed.n_clients))
        self.train, val_table, val_valid = split_validation(data.indices, self.val_fraction, fed.seed)
        device = fed.x_val.device
        self.val_table, self.val_valid = val_table.to(device), val_valid.to(device)
        self.x_upload = torch.cat([fed.x_val, data.x[self.val_table.flatten()]])  # public set, validation splits
        self.targets = None  # softmax of the last aggregate on the public set
        # outlives its round: the last round's diagnostics, which the run's final block reports
        self.final_round_diagnostics: dict = {}

    def training_indices(self, indices):
        return self.train

    def init_client_state(self, fed, global_flat, global_buffers):
        return ClientState.replicate(fed.n_clients, global_flat, global_buffers)  # a common initialisation

    def select_clients(self, state) -> np.ndarray:
        present = state.rng.random(self.fed.n_clients) >= self.dropout  # drawn every round, as the protocol
        if not present.any():
            present[state.rng.integers(self.fed.n_clients)] = True
        return np.flatnonzero(present)

    # -- local ---------------------------------------------------------------------------
    def _distill(self, base, clients, start=None, start_buffers=None) -> LocalPhase:
        temperature = self.temperature
        training = replace(base, epochs=self.distill_epochs, lr=self.distill_lr or base.lr, prox_mu=0.0,
                           extra_loss=lambda params, out, feats, yb, mb, ctx: distillation_loss(out, yb, mb, temperature))
        public = np.arange(len(self.fed.y_val))
        return LocalPhase("distill", start, start_buffers, training, x=self.fed.x_val, y=self.targets,
                          indices=[public] * len(clients), replaces_upload=start is None)

    def local_phases(self, state, clients, base):
        if self.public_logits == "after_refine" and self.targets is not None and self.distill_epochs:
            return [self._distill(base, clients)]  # on the previous round's aggregate, before the upload
        return []

    def round_end_phases(self, state, clients, base):
        if self.public_logits == "after_local" and state.round + 1 < self.fed.rounds and self.distill_epochs:
            cs, rows = state.client_state, torch.as_tensor(clients, dtype=torch.long)
            return [self._distill(base, clients, cs.flat[rows.to(cs.flat.device)],
                                  {k: v[rows.to(v.device)] for k, v in cs.buffers.items()})]
        return []

    def phase_done(self, state, phase, clients, flat, buffers):
        if phase.replaces_upload:  # the uploads become the clients' models after the server step
            return state.client_state
        return state.client_state.with_rows(clients, flat, buffers)

    def client_uploads(self, state, clients, flat, buffers, data):
        logits = predict(self.fed.model, flat, buffers, self.x_upload, batch_size=512)
        n_pub, n, width = len(self.fed.y_val), self.fed.n_clients, self.val_table.shape[1]
        own = logits[:, n_pub:].reshape(len(clients), n, width, -1)[torch.arange(len(clients)),
                                                                       torch.as_tensor(clients)]
        return {"public": logits[:, :n_pub], "validation": own}

    # -- server --------------------------------------------------------------------------
    def _full(self, rows: torch.Tensor, clients: np.ndarray) -> torch.Tensor:
        """[n, ...] rows of the present clients -> [N, ...] (zeros for absent clients, masked)."""
        out = rows.new_zeros((self.fed.n_clients, *rows.shape[1:]))
        out[torch.as_tensor(clients, device=rows.device)] = rows
        return out

    def weigh(self, state, updates):
        public = self._full(updates.extras["public"], updates.clients)
        present = torch.zeros(self.fed.n_clients, dtype=torch.bool, device=public.device)
        present[torch.as_tensor(updates.clients, device=public.device)] = True
        state.round_data["present"] = present
        state.round_data["validation"] = self._full(updates.extras["validation"], updates.clients)
        aggregated = self.aggregate_logits(state, public, "public")
        self.targets = torch.softmax(aggregated, dim=-1).detach()
        n_present, n_pub, c = int(present.sum()), len(self.fed.y_val), self.fed.n_classes
        diagnostics = {"public_accuracy": float((aggregated.argmax(-1) == self.fed.y_val).float().mean()),
                       "present": present.cpu().tolist(), **state.round_data.get("weight_summary", {}),
                       "floats_up": n_present * n_pub * c + (n_present * n_pub if self.name == "logit_uwa" else 0),
                       "floats_down": n_present * n_pub * c, "fedavg_floats": 2 * n_present * updates.flat.shape[1]}
        state.round_data["diagnostics"] = self.final_round_diagnostics = diagnostics  # evaluate adds to it
        return torch.full((len(updates.clients),), 1.0 / len(updates.clients))

    def server_update(self, state, weights, flat, buffers):
        return state.global_flat, state.global_buffers  # no shared model

    def update_client_state(self, state, weights, global_flat, global_buffers):
        u = state.updates
        return state.client_state.with_rows(u.clients, u.flat, u.buffers)

    def aggregate_logits(self, state, logits: torch.Tensor, which: str) -> torch.Tensor:
        """The server's rule on [N, n, C] client logits (``which``: 'public' fits it and keeps it in
        ``state.round_data``, 'test' reuses it)."""
        raise NotImplementedError

    # -- evaluation: the aggregated ensemble ------------------------------------------------------
    def evaluate(self, state, global_flat, global_buffers, test):
        u = state.updates
        logits = test.predict(u.flat, u.buffers)
        aggregated = self.aggregate_logits(state, self._full(logits, u.clients), "test")
        c = self.fed.n_classes
        confusion = torch.zeros(c * c, device=aggregated.device).index_add_(
            0, test.y * c + aggregated.argmax(-1), torch.ones(len(test.y), device=aggregated.device))
        accuracy = torch.full((self.fed.n_clients,), float("nan"))
        accuracy[torch.as_tensor(u.clients)] = (logits.argmax(-1) == test.y).float().mean(1).cpu()
        state.round_data["diagnostics"]["client_accuracy"] = [None if math.isnan(a) else a
                                                              for a in accuracy.tolist()]  # absent: null
        return Evaluation(confusion.view(1, c, c), F.cross_entropy(aggregated, test.y).view(1))

    def final_extras(self):
        last = self.final_round_diagnostics
        accs = [a for a in last.get("client_accuracy", []) if a is not None]
        return {"public_accuracy": last.get("public_accuracy"),
                "mean_client_accuracy": float(np.mean(accs)) if accs else None}


@register
@dataclass
class LogitSimple(LogitFL):
    """Simple averaging of the client logits: z̄_s = (1/|A_s|) Σ_{i∈A_s} z_is."""

    name = "logit_simple"

    def aggregate_logits(self, state, logits, which):
        return simple_average(logits, state.round_data["present"])


@register
@dataclass
class LogitUWA(LogitFL):
    """UWA: each client fits a GMM to its logits on its validation split; per sample the weights
    are w_is = softmax_i(ℓ_is / τ) over the clients present, ℓ_is = log p_i(z_is); z̄_s = Σ_i w_is z_is.
    ``uwa_score: standardized`` (our variant) z-scores ℓ by the client's own validation scores."""

    name = "logit_uwa"
    gmm_components: int | None = None  # None: one per class the client holds
    gmm_iters: int = 10
    uwa_tau: float = 1.0
    uwa_score: str = "loglik"
    reg_covar: float = 0.01

    def validate(self) -> None:
        super().validate()
        self.check(("uwa_score", self.uwa_score in ("loglik", "standardized"), "'loglik' or 'standardized'"),
                   ("uwa_tau", self.uwa_tau > 0, "> 0"), ("reg_covar", self.reg_covar > 0, "> 0"),
                   ("gmm_components", self.gmm_components is None or self.gmm_components >= 1, ">= 1 or null"))

    def setup(self, fed) -> None:
        super().setup(fed)
        if self.gmm_components is None:  # class-conditional start: one component per class held
            self.init_resp = F.one_hot(fed.client_data(np.arange(fed.n_clients)).y[self.val_table], fed.n_classes).float()
        else:
            draw = torch.randint(self.gmm_components, self.val_table.shape, generator=torch.Generator().manual_seed(fed.seed))
            self.init_resp = F.one_hot(draw, self.gmm_components).float().to(self.val_table.device)
        self.uwa_weights = None  # the last round's weight diagnostics (the run's final block)

    def aggregate_logits(self, state, logits, which):
        data = state.round_data
        present, validation = data["present"], data["validation"]
        if which == "public":  # fit on the clients' validation logits (client side), then score
            data["gmm"] = fit_gmm(validation, self.val_valid, self.init_resp, self.gmm_iters, self.reg_covar)
        gmm = data["gmm"]
        ll = gmm_log_likelihood(gmm, logits)
        if self.uwa_score == "standardized":
            ll = standardize_scores(gmm_log_likelihood(gmm, validation), self.val_valid, ll)
        aggregated, w = uwa_aggregate(logits, ll, present, self.uwa_tau)
        if which == "public":
            self.uwa_weights = weight_diagnostics(w, present, self.fed.y_val, self.fed.n_classes)
            data["weight_summary"] = {k: self.uwa_weights[k] for k in ("mean_max_weight", "mean_entropy")}
        return aggregated

    def final_extras(self):
        return {**super().final_extras(), "uwa_weights": self.uwa_weights}


@register
@dataclass
class LogitMeta(LogitFL):
    """The meta-model: an MLP g([z_1s, …, z_Ns]) -> label trained each round on ``meta_labeled``
    labelled public samples (client-dropout augmentation ``meta_drop``); z̄_s = g(...)."""

    name = "logit_meta"
    meta_labeled: int = 1000
    meta_hidden: int = 64
    meta_steps: int = 300
    meta_lr: float = 0.01
    meta_drop: float = 0.2

    def validate(self) -> None:
        super().validate()
        if self.meta_labeled < 10 or self.meta_hidden < 1 or self.meta_steps < 1 or not self.meta_lr > 0:
            raise ValueError("method 'logit_meta': meta_labeled >= 10, meta_hidden >= 1, meta_steps >= 1 and "
                             f"meta_lr > 0 (got {self.meta_labeled}, {self.meta_hidden}, {self.meta_steps}, {self.meta_lr})")
        self.check(("meta_drop", 0 <= self.meta_drop < 1, "in [0, 1)"))

    def setup(self, fed) -> None:
        super().setup(fed)
        if self.meta_labeled > len(fed.y_val):
            raise ValueError(f"method 'logit_meta': meta_labeled must be <= the {len(fed.y_val)} public samples "
                             "(server_val)")

    def aggregate_logits(self, state, logits, which):
        present = state.round_data["present"]
        if which == "public":
            labelled = slice(0, self.meta_labeled)
            state.round_data["meta_model"] = train_meta_model(
                logits[:, labelled], self.fed.y_val[labelled], self.fed.n_classes, hidden=self.meta_hidden,
                steps=self.meta_steps, lr=self.meta_lr, drop=self.meta_drop, present=present,
                seed=self.fed.seed * 1000 + state.round)
        return meta_aggregate(state.round_data["meta_model"], logits, present)
