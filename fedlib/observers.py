"""Round observers: the work a run does besides its method's round, switched on per run.

The engine's round loop (``fedlib.engine.rounds``) is the method's protocol. Around it, a run carries the
observers :func:`observers_for` switches on for it:

- :class:`Adversaries`, when the split gives clients a hostile role that changes what they upload
  (free-riders, noise, NaN, scaled or sign-flipped updates, ALIE): they play those clients;
- :class:`UpdateSimilarity`, always: cos(w_k, w_g) of every aggregated upload with the new global model,
  the contribution rule FLCE §4.1.3 gives methods without scores of their own (its chapter reads it from
  any method's runs);
- :class:`ReferenceValues`, with ``RunConfig.reference_values``: exact Shapley and leave-one-out values of
  the last round's clients;
- :class:`Monitor`, always: the poisoning monitor (``fedlib.screening.PoisoningMonitor``).

An observer never changes the federation's numbers, except :class:`Adversaries`, whose clients are
hostile by the split's declaration. Each hook is called at one point of the round, in list order:
``uploads`` (the clients' trained models, before screening), ``after_server`` (entries for the round's
record), ``after_round`` (the finished record) and ``finish`` (the run's ``final`` block).
"""

from __future__ import annotations

import time
from statistics import NormalDist
from typing import Any

import numpy as np
import torch

from .screening import PoisoningMonitor
from .valuation import coalition_utility, exact_shapley, leave_one_out

__all__ = ["ATTACK_SCALE", "UPLOAD_ROLES", "Adversaries", "Monitor", "ReferenceValues", "RoundObserver",
           "UpdateSimilarity", "alie_z", "apply_roles", "observers_for", "reference_values"]

ATTACK_SCALE = 10.0  # scaled_update: the update times the default clip factor (issue 43)
# roles that change a client's upload (label_flip and random_data change its data, in the split)
UPLOAD_ROLES = frozenset({"free_rider", "random_update", "alie", "scaled_update", "nan_update", "huge_update",
                          "sign_flip"})


class RoundObserver:
    """A run's extra work at fixed points of each round (the module docstring); every hook optional."""

    def uploads(self, flat: torch.Tensor, clients: np.ndarray, global_flat: torch.Tensor,
                generator: torch.Generator) -> torch.Tensor:
        return flat

    def after_server(self, round_index: int, state, updates, global_flat: torch.Tensor) -> dict[str, Any] | None:
        return None

    def after_round(self, record: dict, screened) -> None:
        pass

    def finish(self, final: dict, label: str) -> None:
        pass


def alie_z(n: int, f: int) -> float:
    """ALIE's z_max (Baruch et al. 2019, §3, Eq. 1 ff.): s = floor(n/2 + 1) - f supporters are needed;
    z = Phi^-1((n - s) / n), clamped to [0, 3] (f >= n/2 + 1 would need no disguise)."""
    share = (n - (n // 2 + 1 - f)) / n
    return float(min(max(NormalDist().inv_cdf(min(max(share, 0.5), 0.99865)), 0.0), 3.0))


def apply_roles(flat: torch.Tensor, clients: np.ndarray, roles: np.ndarray, global_flat: torch.Tensor,
                generator: torch.Generator) -> torch.Tensor:
    """Behavioural roles: free-riders return the received model; random-update clients
    send the global model plus Gaussian noise with the global parameters' std; the fault
    roles send NaN (``nan_update``) or an update scaled by 1e6 (``huge_update``); sign-flippers
    send ``2 w_g - w``, their update negated (``sign_flip``, issue 33); ``scaled_update`` sends
    ``w_g + 10 (w - w_g)``; ``alie`` clients all send ``w_g + mean - z std`` of the round's trained
    updates, per coordinate (:func:`alie_z`; issue 43)."""
    selected_roles = roles[clients]

    def rows(role):
        return torch.from_numpy(selected_roles == role).to(flat.device)

    free, noisy, alie = rows("free_rider"), rows("random_update"), rows("alie")
    if alie.any():  # from the updates as trained, before any other role changes them
        delta = flat - global_flat
        z = alie_z(len(clients), int(alie.sum()))
        flat[alie] = global_flat + delta.mean(0) - z * delta.std(0, unbiased=False)
    scaled = rows("scaled_update")
    if scaled.any():
        flat[scaled] = global_flat + ATTACK_SCALE * (flat[scaled] - global_flat)
    flat[rows("nan_update")] = float("nan")
    huge = rows("huge_update")
    if huge.any():
        flat[huge] = global_flat + 1e6 * (flat[huge] - global_flat)
    flip = rows("sign_flip")  # issue 33: sign-flipping attackers
    if flip.any():
        flat[flip] = 2 * global_flat - flat[flip]
    if free.any():
        flat[free] = global_flat
    if noisy.any():
        noise = torch.randn(int(noisy.sum()), flat.shape[1], generator=generator).to(flat.device)
        flat[noisy] = global_flat + noise * global_flat.std()
    return flat


class Adversaries(RoundObserver):
    """The split's hostile clients (:func:`apply_roles`), after local training and before screening."""

    def __init__(self, roles: np.ndarray):
        self.roles = roles

    def uploads(self, flat, clients, global_flat, generator):
        return apply_roles(flat, clients, self.roles, global_flat, generator)


class UpdateSimilarity(RoundObserver):
    """cos(w_k, w_g) of each aggregated upload with the new global model (FLCE §4.1.3), as ``similarity``."""

    def after_server(self, round_index, state, updates, global_flat):
        similarity = torch.nn.functional.cosine_similarity(updates.flat, global_flat.unsqueeze(0), dim=1)
        return {"similarity": similarity.cpu().tolist()}


class ReferenceValues(RoundObserver):
    """Exact Shapley and leave-one-out values of the last round's clients (:func:`reference_values`),
    as ``final["reference"]``; not part of the round's server time."""

    def __init__(self, prepared, last_round: int):
        self.prepared, self.last_round, self.values = prepared, last_round, None

    def after_server(self, round_index, state, updates, global_flat):
        if round_index == self.last_round:
            self.values = reference_values(self.prepared, state, updates)
        return None

    def finish(self, final, label):
        if self.values is not None:
            final["reference"] = self.values


class Monitor(RoundObserver):
    """The poisoning monitor: ``record["disagreement"]`` each round, ``final["poisoning_warning"]``."""

    def __init__(self, parameter_uploads: bool):
        self.monitor = PoisoningMonitor(parameter_uploads)

    def after_round(self, record, screened):
        self.monitor.observe(record, screened)

    def finish(self, final, label):
        self.monitor.finish(final, label)


def observers_for(prepared, method) -> list[RoundObserver]:
    """The observers a run switches on (the module docstring), in the order their hooks are called."""
    cfg, roles = prepared.config, np.asarray(prepared.partition.roles)
    chosen: list[RoundObserver] = []
    if UPLOAD_ROLES.intersection(roles.tolist()):
        chosen.append(Adversaries(roles))
    chosen.append(UpdateSimilarity())
    if cfg.reference_values:
        chosen.append(ReferenceValues(prepared, cfg.rounds - 1))
    chosen.append(Monitor(method.parameter_uploads))
    return chosen


def reference_values(p, state, updates) -> dict[str, Any]:
    """Exact Shapley and leave-one-out values of one round's aggregated clients (``RunConfig.reference_values``).

    The utility of a coalition Q is the validation accuracy of the sample-count average of its
    members' uploads (the empty coalition: the round's incoming global model), all 2^n coalitions
    evaluated in batches (``fedlib.valuation``)."""
    t0 = time.perf_counter()
    sizes = np.maximum(updates.sizes, 1)
    utility = coalition_utility(p.model, updates.flat, updates.buffers, torch.as_tensor(sizes, dtype=torch.float32),
                                p.x_val, p.y_val, p.dataset.num_classes, state.global_flat, state.global_buffers,
                                classwise=False)
    n = len(updates.clients)
    shapley, loo = exact_shapley(utility, n), leave_one_out(utility, n)
    ends = utility(torch.stack([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)]))
    return {"clients": updates.clients.tolist(), "shapley": shapley.tolist(), "loo": loo.tolist(),
            "sizes": np.asarray(updates.sizes).tolist(), "utility_empty": float(ends[0]),
            "utility_all": float(ends[1]), "coalitions": utility.evaluations,
            "time": time.perf_counter() - t0}
