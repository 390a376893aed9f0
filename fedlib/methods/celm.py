"""CELM: data-free client contribution estimation by logit maximization (Ukaye et al. 2026).

During the first T_w rounds (warm-up) the server probes every client model and the previous
global model class by class: starting from noise (or last round's images) it runs L Adam
steps on an input image to maximize the class logit minus an l2 penalty (Eq. 6). The final
logits, debiased by the global model's mean probed logit (Eq. 8-9), form the evidence
matrix Q [N, K]; class-wise shares of Q (Eq. 10) averaged over classes (Eq. 11), put on
the simplex (Eq. 12) and EMA-smoothed (Eq. 13) are the aggregation weights, frozen after
warm-up (Eq. 14). During warm-up clients keep their own classifier head (only the
backbone is broadcast; the heads are the engine's per-client state). The steps follow
Algorithm 1 (appendix A).

All probes of a round (every model x every class) run as one batched optimisation;
``fedlib.testing.probe_loop`` is the plain per-model, per-class reference (tests and benchmark only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from ..population import ParamLayout
from .base import ClientState, ClientUpdates, Federation, Method, RoundState, register


def probe(model: nn.Module, flats: torch.Tensor, buffers: dict[str, torch.Tensor], images: torch.Tensor,
          steps: int, lr: float, l2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """LMProbe of Algorithm 1 for M models and C classes at once.

    ``flats`` [M, P] and ``buffers`` {name: [M, ...]} are the models, ``images`` [M, C, *shape]
    the starting images (model m's probe for class c is ``images[m, c]``). Each image takes
    ``steps`` Adam steps (lr, betas 0.9/0.999) on  -(s_c(x; w_m) - l2 ||x||_2^2)  with the model
    in eval mode. The summed loss decouples over probes and Adam is elementwise, so one Adam
    over the whole tensor is M x C independent Adams. Returns the final logits
    u[m, c] = s_c(x_final[m, c]; w_m) [M, C] and the final images.
    """
    layout = ParamLayout(model)

    def class_logits(flat, bufs, x):  # one model, its C images -> [s_c(x_c; w)]_c
        return functional_call(model, (layout.unflatten(flat), bufs), (x,)).diagonal()

    logits = vmap(class_logits)
    flats = flats.detach()
    x = images.detach().clone().requires_grad_(True)
    optimizer = torch.optim.Adam([x], lr=lr)
    was_training = model.training
    model.eval()
    try:
        for _ in range(steps):
            optimizer.zero_grad()
            objective = logits(flats, buffers, x) - l2 * x.square().flatten(2).sum(-1)  # Eq. 6
            (-objective.sum()).backward()
            optimizer.step()
        with torch.no_grad():
            u = logits(flats, buffers, x)  # Eq. 7
    finally:
        model.train(was_training)
    return u, x.detach()


def class_evidence(u_global: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Evidence matrix Q [n, K] from the probed logits of the clients ``u`` (q~, [n, K]) and
    of the previous global model ``u_global`` ([K])."""
    b = u_global.mean()  # Eq. 8: b^(t-1) = 1/K sum_c s_c(x*_g,c; w_g^(t-1))
    return (u - b).clamp(min=0)  # Eq. 9: q_ic = max(0, q~_ic - b)


def instant_scores(q: torch.Tensor, eps: float) -> torch.Tensor | None:
    """Instantaneous scores c_bar [n] on the simplex; None when Q is all zero."""
    r = q / (q.sum(0, keepdim=True) + eps)  # Eq. 10: client i's share of the evidence for class c
    c_hat = r.mean(1)  # Eq. 11: average share over the K classes
    total = c_hat.sum()
    return c_hat / total if total > 0 else None  # Eq. 12


@register
@dataclass
class CELM(Method):
    """Warm-up probing with head retention, then frozen contribution weights.

    After ``setup``: ``warmup_rounds`` (T_w), ``evidence`` (last Q, [N, K] numpy; NaN rows
    for clients never probed), ``probe_images`` (last images, [N+1, K, *shape] on CPU; row 0
    is the global model), ``score_history`` (c after every round) and ``scores()`` (c now);
    ``diagnostics(state)`` puts each warm-up round's probed logits and evidence in the history.
    With ``head_retention`` the clients' heads are the engine's per-client state
    (``ClientState.tensors``: ``head`` [N, H], a client's head from its last warm-up upload, and
    ``has_head`` [N] bool, whether it has one yet).
    """

    name = "celm"
    warmup_fraction: float = 0.05  # T_w = max(1, round(warmup_fraction * rounds))
    lm_steps: int = 200  # L
    lm_lr: float = 0.01  # eta (Adam)
    l2: float = 0.001  # lambda
    ema: float = 0.5  # beta
    eps: float = 1e-8  # epsilon of Eq. 10
    head_retention: bool = True  # warm-up: broadcast the backbone only
    probe_seed: int = 0  # the N(0, 1) images of the first probing round
    keep_probe_images: bool = False  # put the last warm-up round's images in the history

    def validate(self) -> None:
        self.check(
            ("warmup_fraction", 0 < self.warmup_fraction < 1, "in (0, 1)"),
            ("lm_steps", self.lm_steps >= 1 and float(self.lm_steps).is_integer(), "an integer >= 1"),
            ("lm_lr", self.lm_lr > 0, "> 0"),
            ("l2", self.l2 >= 0, ">= 0"),
            ("ema", 0 <= self.ema < 1, "in [0, 1)"),
            ("eps", self.eps > 0, "> 0"),
            ("probe_seed", float(self.probe_seed).is_integer(), "an integer"),
        )

    def warmup_rounds_for(self, rounds: int) -> int:
        return max(1, round(self.warmup_fraction * rounds))

    def check_run(self, rounds: int, n_clients: int) -> None:
        t_w = self.warmup_rounds_for(rounds)
        if t_w >= rounds:
            raise ValueError(f"method 'celm': warmup_fraction must leave rounds after warm-up: "
                             f"T_w = max(1, round({self.warmup_fraction} * {rounds})) = {t_w} >= rounds = {rounds}")

    def setup(self, fed: Federation) -> None:
        super().setup(fed)
        self.check_run(fed.rounds, fed.n_clients)
        self.warmup_rounds = self.warmup_rounds_for(fed.rounds)
        layout = ParamLayout(fed.model)
        offsets = np.cumsum([0] + layout.numels)
        head = set(fed.model.head_parameter_names())
        self._head_index = torch.cat([torch.arange(offsets[i], offsets[i + 1])
                                      for i, name in enumerate(layout.names) if name in head]).to(fed.device)
        self.contributions = torch.full((fed.n_clients,), 1.0 / fed.n_clients, dtype=torch.float64)  # c^(0)
        self.evidence = np.full((fed.n_clients, fed.n_classes), np.nan)
        self.score_history: list[np.ndarray] = []
        self._images: torch.Tensor | None = None
        self.input_shape: tuple[int, ...] | None = fed.input_shape

    @property
    def probe_images(self) -> torch.Tensor | None:
        return None if self._images is None else self._images.cpu()

    def _in_warmup(self, state: RoundState) -> bool:
        return state.round < self.warmup_rounds  # t <= T_w with 1-based t

    def init_client_state(self, fed, global_flat, global_buffers) -> ClientState | None:
        """With head retention: no client holds a head of its own yet."""
        if not self.head_retention:
            return None
        return ClientState(tensors={"head": global_flat.new_zeros(fed.n_clients, len(self._head_index)),
                                    "has_head": torch.zeros(fed.n_clients, dtype=torch.bool)})

    def start_models(self, state: RoundState, clients: np.ndarray) -> torch.Tensor | None:
        """Warm-up: the global backbone with each client's own head from its last update
        (the global head for a client not seen yet); None (the full global model) otherwise."""
        if not (self.head_retention and self._in_warmup(state)):
            return None
        heads = state.client_state.tensors
        own = heads["has_head"][torch.as_tensor(clients)].numpy()
        if not own.any():
            return None
        start = state.global_flat.repeat(len(clients), 1)
        rows = torch.as_tensor(np.flatnonzero(own), device=start.device)
        start[rows.unsqueeze(1), self._head_index] = heads["head"][torch.as_tensor(clients[own])]
        return start

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        if self._in_warmup(state):
            self._estimate(state, updates)
            if self.keep_probe_images and state.round == self.warmup_rounds - 1:
                state.round_data["diagnostics"]["probe_images"] = self.probe_images.tolist()
        # after warm-up c is never touched again: c^(t) = c^(T_w)  (Eq. 14)
        self.score_history.append(self.scores())
        w = self.contributions[torch.as_tensor(updates.clients)]
        return w / w.sum() if w.sum() > 0 else torch.full_like(w, 1.0 / len(w))

    def update_client_state(self, state, weights, global_flat, global_buffers) -> ClientState:
        """Warm-up: each aggregated client keeps the head of its upload (called with head retention only)."""
        if not self._in_warmup(state):
            return state.client_state
        updates = state.updates
        return state.client_state.with_rows(updates.clients, head=updates.flat[:, self._head_index],
                                            has_head=torch.ones(len(updates.clients), dtype=torch.bool))

    def scores(self) -> np.ndarray:
        return self.contributions.numpy().copy()

    def diagnostics(self, state: RoundState) -> dict | None:
        """Warm-up rounds: the probed logits of the global model (b is their mean) and, in the
        order of the aggregated clients, their probed logits q~ and evidence rows of Q; with
        ``keep_probe_images``, the last warm-up round adds ``probe_images`` [N+1, K, *shape]."""
        return super().diagnostics(state)  # what ``weigh`` put in ``state.round_data``

    def _estimate(self, state: RoundState, updates: ClientUpdates) -> None:
        """One warm-up round of Algorithm 1 (lines 23-34) for the clients present."""
        u_global, u = self._probe_round(state, updates)
        q = class_evidence(u_global, u)
        self.evidence[updates.clients] = q.numpy()
        state.round_data["diagnostics"] = {"global_logits": u_global.tolist(), "probed_logits": u.tolist(),
                                           "evidence": q.tolist()}
        index = torch.as_tensor(updates.clients)
        previous = self.contributions[index]
        mass = previous.sum()  # 1 with full participation
        c_bar = instant_scores(q, self.eps)
        if c_bar is not None:  # (no client shows any evidence: c stays as it is)
            # Eq. 13, with the present clients' share of the simplex kept fixed
            self.contributions[index] = self.ema * previous + (1 - self.ema) * c_bar * mass

    def _probe_round(self, state: RoundState, updates: ClientUpdates) -> tuple[torch.Tensor, torch.Tensor]:
        """Probe w_g^(t-1) and the client models in one batch, warm-started from the last
        round's images; returns (u_g [K], q~ [n, K]) as float64 on the CPU."""
        fed = self.fed
        if self.input_shape is None:
            raise RuntimeError("celm: no forward pass of the model seen yet, so the input shape is unknown")
        if self._images is None:  # Algorithm 1, line 14
            noise = torch.Generator().manual_seed(int(self.probe_seed))
            self._images = torch.randn(fed.n_clients + 1, fed.n_classes, *self.input_shape,
                                       generator=noise).to(fed.device)
        rows = torch.as_tensor(np.concatenate([[0], updates.clients + 1]), device=fed.device)
        flats = torch.cat([state.global_flat.unsqueeze(0), updates.flat])
        buffers = {k: torch.cat([state.global_buffers[k].unsqueeze(0), v]) for k, v in updates.buffers.items()}
        u, final = probe(fed.model, flats, buffers, self._images[rows], int(self.lm_steps), self.lm_lr, self.l2)
        self._images[rows] = final  # warm start of the next round (Algorithm 1, line 26)
        u = u.double().cpu()
        return u[0], u[1:]
