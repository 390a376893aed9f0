"""CFFL: Collaborative Fairness in Federated Learning (Lyu, Xu et al. 2020), as its authors' code runs it.

Source: github.com/XinyiYS/CollaborativeFairFederatedLearning, ``pytorch/utils/Federated_Learner.py``
(``train_locally`` lines 159-206, ``train`` 337-363, ``aggregate_gradients_and_update_federated_model``
440-479, ``assign_updates_with_filter`` 503-563, ``compute_reputations_sinh`` 741-776,
``clip_gradient_update`` 778-783, ``mask_grad_update_by_order`` 786-799,
``compute_reputation_threshold`` 856-860) and ``pytorch/utils/arguments.py`` lines 60-100
(their MNIST arguments: θ = 0.1, clip 0.01, α = 5 with ``alpha_decay``, 'sum' aggregation,
``reputation_fade = 1``, 'random' downloads, threshold coefficient 1/3).

The removal threshold's coefficient follows the split kind, as theirs does (snapshot 5c8f854):
``compute_reputation_threshold`` (``Federated_Learner.py`` lines 856-860) returns 1/(6 |R|) on
their 'classimbalance' split whatever the coefficient, and coef/|R| otherwise (coef = 1/3 by
default, ``arguments.py`` line 88; ``main.py`` lines 176-177 also set 1/6 for that split).
Their 'classimbalance' (``Data_Prepper.py`` lines 76-107) gives party k the classes
0..c_k - 1, c = linspace(1, C, N), and equal sizes: clients holding different numbers of
classes. Here ``split_kind = "label_imbalance"`` selects 1/6 (the chapter sets it for its
PLS and SLS splits, where clients hold different numbers of classes); ``"other"`` (default)
uses ``threshold``. ``threshold = 0`` switches removal off.

On that split their code also sizes by the classes a party holds, not its sample count (their parties
hold equal counts): the reward download is int(r_i / max r · c_i / C · P) entries
(``assign_updates_with_filter``, ``Federated_Learner.py`` at 5c8f854 lines 549-554, and 568-573 for their
pretrained twin), with c_i = class_sizes[i] from linspace(1, C, N) and C = 10; with 'mean' aggregation
the server step weighs an upload by c_i / C (``aggregate_gradients_and_update_federated_model`` lines
467-474, 489-497 for the twin) and a party takes back b_i = c_i / max c of its own upload (lines
509-514). Here ``split_kind = "label_imbalance"`` does the same with c_i the number of classes client i
holds (from its own labels, ``Federation.client_data``) and C the federation's classes; other splits
size by n_i / max n (downloads and b_i) and n_i / Σ n (the 'mean' step), as theirs does.

Every client keeps its own model θ_i (the engine's ``ClientState``); the server holds θ_g and
a labelled validation set V (``needs_validation``). Round t (T rounds), reputable set R:

    Δ_i   = w_i - θ_i;   c_i = clip(Δ_i, ±clip)          client i trains from θ_i; θ_i <- θ_i + c_i
    f_i   = c_i on its top-θ share of entries by |·|     the upload (largest_criterion 'all')
    vacc_i = accuracy on V of θ_g + f_i                  (of θ_i + c_i when θ = 1)
    r_i  <- fade r_i + (1 - fade) vacc_i / Σ_R vacc      fade = 0.8 (their reputation_fade = 1 branch)
    r    <- sinh(α_t r) / Σ sinh(α_t r),  α_t = α (1 + t/T)
    R    <- {i ∈ R : r_i >= r_th};  others r_i = 0 and removed for good;  if R shrank:
            r <- r / Σ r and r_th = coef / |R|           (r_th = coef / N at the start;
                                                          coef = 1/6 on a label-imbalance split)
    θ_g  <- θ_g + Σ_{i∈R} a_i f_i                         a_i = 1 ('sum'), r_i ('reputation_sum'),
                                                         n_i / Σ n ('mean'; c_i / C on label imbalance)
    θ_i  <- θ_i + D_i(θ_g^new - θ_g^old) - b_i f_i,  i ∈ R     reward download of
            int(r_i / max r · n_i / max n · P) entries (label imbalance: c_i / C for
            n_i / max n): a random subset ('random', one permutation per round) or the
            largest ('topk'); b_i = n_i / max n (c_i / max c) for 'mean', else 1

Clipping and sparsification DO change the reputations: the validation accuracy is that of
θ_g plus the clipped, sparsified upload, not of the client's full model. The engine evaluates
θ_g. The history's diagnostics list the clients removed each round (``removed``) and R.

Partial participation (their code has every client of R take part every round): clients are
sampled from R; with S the round's selection, vacc is normalised over S and the new
reputations of S are rescaled to the share of the unit total S held before the round (a
client not seen yet holds 1/|R|), so the others are unchanged. With full participation this
is exactly the update above.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from ..layers import sample_mask
from ..models import ProjectionHead
from ..population import Evaluation, ParamLayout, evaluate, flat_indices
from .base import (ClientState, ClientUpdates, Federation, LocalPhase, Method, RoundState, global_model_on_clients,
                   register)
from .fedavg import sample_count_weights


def top_share(update: torch.Tensor, share: float) -> torch.Tensor:
    """Each row of ``update`` [n, P] kept on the entries at least as large in magnitude as
    its k-th largest, k = int(P share) (0 keeps nothing); CFFL's ``mask_grad_update_by_order``
    with mode 'all'."""
    size = update.shape[1]
    k = int(size * share)
    if k <= 0:
        return torch.zeros_like(update)
    if k >= size:
        return update.clone()
    threshold = update.abs().topk(k, dim=1).values[:, -1:]
    return update * (update.abs() >= threshold)


SPLIT_KINDS = ("label_imbalance", "other")
LABEL_IMBALANCE_COEFFICIENT = 1.0 / 6.0  # compute_reputation_threshold's 'classimbalance' branch


@register
@dataclass
class CFFL(Method):
    """Validation-accuracy reputations, removal threshold and reputation-sized downloads (see the module)."""

    name = "cffl"
    rule_version = "4"  # 3: coefficient 1/6 on a label-imbalance split (split_kind); 4: there, sizes by classes held
    needs_validation = True
    alpha: float = 5.0
    alpha_growth: bool = True
    fade: float = 0.8
    threshold: float = 1.0 / 3.0  # the removal coefficient on other splits (0 = no removal)
    split_kind: str = "other"  # "label_imbalance": coefficient 1/6, as their 'classimbalance'
    clip: float = 0.01
    theta: float = 0.1
    aggregation: str = "sum"
    download: str = "random"

    def validate(self) -> None:
        self.check(("alpha", self.alpha > 0, "> 0"), ("fade", 0 <= self.fade < 1, "in [0, 1)"),
                   ("threshold", 0 <= self.threshold < 1, "in [0, 1)"), ("clip", self.clip >= 0, ">= 0, 0 = off"),
                   ("split_kind", self.split_kind in SPLIT_KINDS, "label_imbalance or other"),
                   ("theta", 0 < self.theta <= 1, "in (0, 1]"),
                   ("aggregation", self.aggregation in ("sum", "reputation_sum", "mean"),
                    "sum, reputation_sum or mean"),
                   ("download", self.download in ("random", "topk"), "random or topk"))

    def setup(self, fed: Federation) -> None:
        if fed.x_val is None or fed.y_val is None:
            raise ValueError("method 'cffl': needs the server's validation set (Federation.x_val, y_val)")
        super().setup(fed)
        self.reputation = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.seen = torch.zeros(fed.n_clients, dtype=torch.bool)
        self.reputable = torch.ones(fed.n_clients, dtype=torch.bool)
        self.removed_round = np.full(fed.n_clients, -1)
        self._classes_held = None

    @property
    def label_imbalance(self) -> bool:
        return self.split_kind == "label_imbalance"

    def classes_held(self) -> torch.Tensor:
        """c_i [N]: how many classes client i holds (float64), from the clients' own labels; computed once."""
        if self._classes_held is None:
            fed = self.fed
            if fed.client_data is None:
                raise ValueError("method 'cffl': split_kind 'label_imbalance' sizes by the classes each client "
                                 "holds and needs the clients' labels (Federation.client_data)")
            data = fed.client_data(np.arange(fed.n_clients))
            index, owner, _ = flat_indices(data.indices)
            labels = data.y[index.to(data.y.device)].cpu().long()
            cells = torch.zeros(fed.n_clients * fed.n_classes, dtype=torch.bool)
            cells[owner * fed.n_classes + labels] = True
            self._classes_held = cells.view(fed.n_clients, fed.n_classes).sum(1).double()
        return self._classes_held

    def download_share(self) -> torch.Tensor:
        """[N] the size factor of each client's reward download: c_i / C on a label-imbalance split (their
        lines 549-554), else n_i / max n."""
        if self.label_imbalance:
            return self.classes_held() / self.fed.n_classes
        sizes = torch.as_tensor(np.asarray(self.fed.client_sizes, dtype=float))
        return sizes / sizes.max() if sizes.max() > 0 else torch.ones_like(sizes)

    def own_share(self) -> torch.Tensor:
        """[N] b_i, the share of its own upload a client takes back under 'mean' aggregation: c_i / max c on a
        label-imbalance split (their lines 509-514), else n_i / max n."""
        held = self.classes_held() if self.label_imbalance else torch.as_tensor(
            np.asarray(self.fed.client_sizes, dtype=float))
        return held / held.max() if held.max() > 0 else torch.ones_like(held)

    @property
    def coefficient(self) -> float:
        """The removal threshold's coefficient: r_th = coefficient / |R| (compute_reputation_threshold)."""
        return LABEL_IMBALANCE_COEFFICIENT if self.split_kind == "label_imbalance" else self.threshold

    def init_client_state(self, fed, global_flat, global_buffers):
        return ClientState.replicate(fed.n_clients, global_flat, global_buffers)

    def select_clients(self, state: RoundState) -> np.ndarray:
        """Uniform sampling without replacement from the reputable set R (all of R if it is small)."""
        pool = np.flatnonzero(self.reputable.numpy())
        if self.fed.clients_per_round >= len(pool):
            return pool
        return np.sort(state.rng.choice(pool, size=self.fed.clients_per_round, replace=False))

    def uploads(self, state: RoundState, updates: ClientUpdates) -> tuple[torch.Tensor, torch.Tensor]:
        """(clipped updates c [n, P], uploads f [n, P]) of the round's clients."""
        delta = updates.deltas(state.global_flat)
        clipped = delta.clamp(-self.clip, self.clip) if self.clip > 0 else delta
        return clipped, top_share(clipped, self.theta)

    def step_weights(self, clients: torch.Tensor) -> torch.Tensor:
        """a_i of the server step for ``clients``: 0 outside R."""
        inside = self.reputable[clients].double()
        if self.aggregation == "sum":
            return inside
        if self.aggregation == "reputation_sum":
            return inside * self.reputation[clients]
        if self.label_imbalance:  # their lines 467-474: c_i / C
            return inside * self.classes_held()[clients] / self.fed.n_classes
        sizes = torch.as_tensor(np.asarray(self.fed.client_sizes, dtype=float))
        return inside * sizes[clients] / sizes.sum()

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        fed = self.fed
        clipped, upload = self.uploads(state, updates)
        if self.theta >= 1:  # their theta = 1 path: the participant's own model
            start = state.global_flat if updates.start is None else updates.start
            models = start + clipped
        else:
            models = state.global_flat + upload
        vacc = evaluate(fed.model, models, updates.buffers, fed.x_val, fed.y_val, fed.n_classes).accuracy
        clients = torch.as_tensor(updates.clients, dtype=torch.long)
        alpha = self.alpha * (1 + state.round / fed.rounds) if self.alpha_growth else self.alpha
        before = self.reputable.clone()
        self.update_reputation(clients, vacc.double().cpu(), alpha)
        removed = torch.nonzero(before & ~self.reputable).squeeze(1).numpy()
        self.removed_round[removed] = state.round
        state.round_data["diagnostics"] = {
            "removed": removed.tolist(), "reputable": torch.nonzero(self.reputable).squeeze(1).tolist(),
            "alpha": alpha, "threshold": self.coefficient / max(int(self.reputable.sum()), 1)}
        a = self.step_weights(clients)
        return (a / a.sum() if a.sum() > 0 else a).float()

    def server_update(self, state, weights, flat, buffers):
        _, upload = self.uploads(state, state.updates)
        a = self.step_weights(torch.as_tensor(state.updates.clients, dtype=torch.long))
        return state.global_flat + a.to(upload) @ upload, buffers  # θ_g + Σ_R a_i f_i

    def update_reputation(self, clients: torch.Tensor, vacc: torch.Tensor, alpha: float | None = None) -> None:
        """One reputation step for ``clients`` (members of R, as ``select_clients`` returns them)
        whose uploads have validation accuracies ``vacc``, with sinh factor ``alpha``."""
        alpha = self.alpha if alpha is None else alpha
        r, seen, reputable = self.reputation, self.seen, self.reputable
        held = torch.where(seen, r, 1.0 / reputable.sum())[clients].sum()
        relative = vacc / vacc.sum() if vacc.sum() > 0 else torch.full_like(vacc, 1.0 / len(vacc))
        sharpened = torch.sinh(alpha * (self.fade * r[clients] + (1 - self.fade) * relative))
        r[clients] = held * sharpened / sharpened.sum()
        seen[clients] = True
        drop = reputable & seen & (r < self.coefficient / reputable.sum())
        if drop.any():
            reputable &= ~drop
            r[drop] = 0.0
            kept = reputable & seen
            unseen_share = (reputable & ~seen).sum() / reputable.sum()
            r[kept] *= (1 - unseen_share) / r[kept].sum()

    def download_masks(self, state: RoundState, aggregate: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """[m, P] booleans: which entries of the server's aggregate each of m clients downloads
        (``counts`` [m] entries each)."""
        counts = counts.to(aggregate.device)
        if self.download == "random":
            g = torch.Generator().manual_seed(int(state.rng.integers(2**62)))
            perm = torch.randperm(aggregate.numel(), generator=g).to(aggregate.device)
            position = torch.empty_like(perm)
            position[perm] = torch.arange(aggregate.numel(), device=aggregate.device)
            return position.unsqueeze(0) < counts.unsqueeze(1)
        ordered = aggregate.abs().sort(descending=True).values
        threshold = ordered[(counts - 1).clamp(min=0)]
        return (aggregate.abs().unsqueeze(0) >= threshold.unsqueeze(1)) & (counts > 0).unsqueeze(1)

    def update_client_state(self, state, weights, global_flat, global_buffers):
        cs, updates = state.client_state, state.updates
        n_params = global_flat.numel()
        clipped, upload = self.uploads(state, updates)
        share = self.download_share()
        own = self.own_share()[updates.clients] if self.aggregation == "mean" else torch.ones(len(updates.clients))
        inside = self.reputable[updates.clients].to(clipped)
        start = state.global_flat if updates.start is None else updates.start
        flat = cs.flat.clone()
        index = torch.as_tensor(updates.clients, dtype=torch.long, device=flat.device)
        flat[index] = start + clipped - (inside * own.to(clipped)).unsqueeze(1) * upload
        members = torch.nonzero(self.reputable).squeeze(1)
        r = self.reputation
        if len(members) and r.max() > 0:
            counts = (r[members] / r.max() * share[members] * n_params).long()
            aggregate = global_flat - state.global_flat
            masks = self.download_masks(state, aggregate, counts)
            flat[members.to(flat.device)] += masks * aggregate
        buffers = cs.buffers
        if updates.buffers:
            buffers = cs.with_rows(updates.clients, buffers=updates.buffers).buffers
        return ClientState(flat, buffers, cs.tensors)

    def scores(self) -> np.ndarray:
        return self.reputation.numpy().copy()


# ----------------------------------------------------------------------------- FLCE's baselines

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
    on w^t (``server_update``). q = 1 (our choice; the paper tunes q per dataset). Source: the
    paper's Algorithm 2 and github.com/litian96/fair_flearn (``run.sh`` passes q per experiment);
    see book/reference/baselines.md."""

    name = "qfedavg"
    q: float = 1.0

    def validate(self) -> None:
        self.check(("q", self.q >= 0, ">= 0"))

    def client_uploads(self, state, clients, flat, buffers, data):
        loss, _ = global_model_on_clients(self.fed, state, data)
        return {"loss": loss}

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
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
    contribution (FLCE §4.1.3: 'aggregation weight (e.g., FedFa)'). Dual momentum: the clients'
    local SGD also uses momentum γ (``client_momentum``, their ``c.momentum = self.gamma``).
    Source: github.com/WwZzz/easyFL ``flgo/algorithm/fedfa.py`` (``Server.initialize``, ``iterate``,
    ``Client.reply``/``pack``)."""

    name = "fedfa"
    rule_version = "2"
    beta: float = 0.5
    gamma: float = 0.9
    client_momentum: bool = True

    def validate(self) -> None:
        self.check(("beta", 0 <= self.beta <= 1, "in [0, 1]"), ("gamma", 0 <= self.gamma < 1, "in [0, 1)"))

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.frequency = torch.zeros(fed.n_clients, dtype=torch.float64)
        self.momentum = None
        self.total = torch.zeros(fed.n_clients, dtype=torch.float64)

    def local_training(self, state, base, clients):
        return replace(base, momentum=self.gamma) if self.client_momentum else base

    def client_uploads(self, state, clients, flat, buffers, data):
        _, acc = global_model_on_clients(self.fed, state, data)
        return {"accuracy": acc}

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
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


PERSONAL, PERSONAL_BUFFER = "personal", "personal_buffer:"


@register
@dataclass
class Ditto(Method):
    """Ditto (Li, Hu, Beirami, Smith, ICML 2021), Algorithm 1, as ``flearn/trainers_MTL/ditto.py``
    ``Server.train`` (github.com/litian96/ditto) runs it. The global model is trained as in FedAvg;
    each selected client also updates its personal model v_k on the same batches:

        v_k <- v_k - η (∇F_k(v_k) + λ (v_k - w^t))          (Alg. 1, line 6; λ/2 ||v - w^t||²)

    Every v_k starts as the initial global model (their ``local_models``) and is kept by the engine
    (``ClientState.tensors["personal"]``); the pass is a local phase of the engine.
    ``scored``: "personal" (their ``test(local_models)``: every client's v_k on its own test
    split, Σ correct / Σ test) or "global" (the global model on the test set). fedlib has one test
    set, so a client's test split is the test set reweighted to the client's label shares, and
    clients weigh by their sample counts: the expected confusion matrix of their test routine.
    λ = 0.1 (our choice; their grid is {0.01 ... 2}). Sampling: uniform with sample-count weights,
    theirs ∝ n_k with a simple average (the same expectation; book/reference/baselines.md)."""

    name = "ditto"
    rule_version = "2"  # 2: personal pass as a local phase on the round's batches, v_k from w^0, scored personal
    lam: float = 0.1
    scored: str = "personal"

    def validate(self) -> None:
        self.check(("lam", self.lam >= 0, ">= 0"),
                   ("scored", self.scored in ("personal", "global"), "'personal' or 'global'"))

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.layout = ParamLayout(fed.model)
        data = fed.client_data(np.arange(fed.n_clients))
        flat_index, owner, sizes = flat_indices(data.indices)
        counts = torch.zeros(fed.n_clients * fed.n_classes).index_add_(
            0, owner * fed.n_classes + data.y[flat_index.to(data.y.device)].cpu(), torch.ones(len(owner)))
        self.label_share = counts.view(fed.n_clients, fed.n_classes) / sizes.clamp(min=1).unsqueeze(1)
        self.client_weight = sizes.float() / sizes.sum().clamp(min=1)

    def init_client_state(self, fed, global_flat, global_buffers):
        initial = ClientState.replicate(fed.n_clients, global_flat, global_buffers)
        return ClientState(tensors={PERSONAL: initial.flat,
                                    **{PERSONAL_BUFFER + k: v for k, v in initial.buffers.items()}})

    def _personal(self, cs: ClientState, rows=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pick = (lambda t: t) if rows is None else (lambda t: t[rows.to(t.device)])
        return pick(cs.tensors[PERSONAL]), {k[len(PERSONAL_BUFFER):]: pick(v) for k, v in cs.tensors.items()
                                             if k.startswith(PERSONAL_BUFFER)}

    def local_phases(self, state, clients, base):
        start, buffers = self._personal(state.client_state, torch.as_tensor(clients, dtype=torch.long))
        personal = replace(base, extra_loss=_prox_loss(self.layout, self.lam), prox_mu=0.0,
                           client_context=state.global_flat.unsqueeze(0).expand(len(clients), -1))
        return [LocalPhase(PERSONAL, start, buffers, personal)]

    def phase_done(self, state, phase, clients, flat, buffers):
        return state.client_state.with_rows(clients, **{PERSONAL: flat},
                                            **{PERSONAL_BUFFER + k: v for k, v in buffers.items()})

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        return sample_count_weights(updates.sizes)

    def evaluate(self, state, global_flat, global_buffers, test):
        if self.scored == "global":
            return None
        ev = test.score(*self._personal(state.client_state))  # every v_k on the whole test set
        confusion = ev.confusion
        given_class = confusion / confusion.sum(2, keepdim=True).clamp(min=1)  # P(pred | true c) per client
        share = (self.client_weight.unsqueeze(1) * self.label_share).to(confusion)  # [N, C], sums to 1
        expected = (share.unsqueeze(2) * given_class).sum(0) * confusion[0].sum()  # test set's size
        loss = (self.client_weight.to(ev.loss) * ev.loss).sum()  # size-weighted, on the whole test set
        return Evaluation(expected.unsqueeze(0), loss.unsqueeze(0))


PREVIOUS, PREVIOUS_BUFFER, SEEN = "previous", "previous_buffer:", "seen"


def model_contrastive_term(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """MOON's ℓ_con per sample (Eq. 3): -log(e^{cos(z, z_glob)/τ} / (e^{cos(z, z_glob)/τ} + e^{cos(z, z_prev)/τ}))."""
    pos = F.cosine_similarity(z, z_glob, dim=-1) / tau
    neg = F.cosine_similarity(z, z_prev, dim=-1) / tau
    return -pos + torch.logaddexp(pos, neg)


@register
@dataclass
class MOON(Method):
    """MOON (Li, He, Song, CVPR 2021), as github.com/QinbinLi/MOON runs it (``main.py``
    ``train_net_fedcon``, arguments mu 1, temperature 0.5, out_dim 256; ``model.py``
    ``ModelFedCon``). Local loss  ℓ_CE + μ ℓ_con  with the model-contrastive term (Eq. 3)

        ℓ_con = -log( e^{cos(z, z_glob)/τ} / (e^{cos(z, z_glob)/τ} + e^{cos(z, z_prev)/τ}) )

    z, z_glob, z_prev: the projection (``out_dim`` wide, their projection MLP; 0 = the model's own
    features) of the same batch under the model being trained, the received global model and the
    client's previous local model, kept by the engine (``ClientState.tensors["previous"]``).
    Sample-count aggregation. A client never trained before compares with the global model
    (theirs: with its own random initial model)."""

    name = "moon"
    rule_version = "2"  # 2: projection head (out_dim) as in their ModelFedCon
    mu: float = 1.0
    tau: float = 0.5
    out_dim: int = 256

    def validate(self) -> None:
        self.check(("mu", self.mu >= 0, ">= 0"), ("tau", self.tau > 0, "> 0"),
                   ("out_dim", self.out_dim >= 0 and self.out_dim == int(self.out_dim), "a whole number >= 0"))

    def adapt_model(self, model):
        return ProjectionHead(model, int(self.out_dim)) if self.out_dim else model

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.layout = ParamLayout(fed.model)

    def init_client_state(self, fed, global_flat, global_buffers):
        initial = ClientState.replicate(fed.n_clients, global_flat, global_buffers)
        return ClientState(tensors={PREVIOUS: initial.flat, SEEN: torch.zeros(fed.n_clients, dtype=torch.bool),
                                    **{PREVIOUS_BUFFER + k: v for k, v in initial.buffers.items()}})

    def local_training(self, state, base, clients):
        fed, layout, mu, tau, cs = self.fed, self.layout, self.mu, self.tau, state.client_state
        index = torch.as_tensor(clients, dtype=torch.long)
        seen = cs.tensors[SEEN][index].to(state.global_flat.device)
        previous = cs.tensors[PREVIOUS][index.to(cs.tensors[PREVIOUS].device)]
        context = {
            "global": state.global_flat.unsqueeze(0).expand(len(clients), -1),
            "prev": torch.where(seen.unsqueeze(1), previous, state.global_flat.unsqueeze(0)),
            "global_buffers": {k: v.unsqueeze(0).expand(len(clients), *v.shape).clone()
                               for k, v in state.global_buffers.items()},
            "prev_buffers": {k[len(PREVIOUS_BUFFER):]: v[index.to(v.device)].clone() for k, v in cs.tensors.items()
                             if k.startswith(PREVIOUS_BUFFER)},
        }

        def represent(flat, buffers, xb, mask):
            with sample_mask(mask):
                _, z = functional_call(fed.model, (layout.unflatten(flat), {k: v.clone() for k, v in buffers.items()}),
                                       (xb,), {"return_features": True})
            return z.detach()

        def model_contrastive(params, logits, features, y, mask, ctx, inputs):
            z_glob = represent(ctx["global"], ctx["global_buffers"], inputs, mask)
            z_prev = represent(ctx["prev"], ctx["prev_buffers"], inputs, mask)
            term = model_contrastive_term(features, z_glob, z_prev, tau)
            return mu * (term * mask).sum() / mask.sum().clamp(min=1.0)

        return replace(base, extra_loss=model_contrastive, extra_loss_inputs=True, client_context=context)

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        return sample_count_weights(updates.sizes)

    def update_client_state(self, state, weights, global_flat, global_buffers):
        u = state.updates  # this round's local models become the clients' previous models
        return state.client_state.with_rows(u.clients, **{PREVIOUS: u.flat, SEEN: torch.ones(len(u.clients), dtype=torch.bool)},
                                            **{PREVIOUS_BUFFER + k: v for k, v in u.buffers.items()})
