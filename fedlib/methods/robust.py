"""Byzantine-robust aggregation: coordinate-wise median, trimmed mean, Krum and multi-Krum.

The server steps and hyper-parameters follow the strategies users know from Flower
(github.com/adap/flower, ``framework/py/flwr/server/strategy/aggregate.py``, ``src/py/...`` before
2025: ``aggregate_median``, ``aggregate_trimmed_avg``, ``aggregate_krum``; strategies ``FedMedian``, ``FedTrimmedAvg(beta)``,
``Krum(num_malicious_clients, num_clients_to_keep)``). With the n screened uploads w_1..w_n of a
round (non-finite ones dropped, outsized ones clipped by ``fedlib.screening`` first):

    median        w_g[j] = median_i w_i[j]          Yin et al. 2018 (ICML), Eq. (3): the mean of
                                                    the two middle values when n is even
    trimmed mean  w_g[j] = mean of the w_i[j] ranked k+1 .. n-k per coordinate, k = floor(beta n)
                                                    Yin et al. 2018, Definition 2 (beta < 1/2)
    Krum          s_i = sum of ||w_i - w_l||^2 over the m = max(1, n - f - 2) nearest l != i;
                  w_g = w_{argmin s}                Blanchard et al. 2017 (NeurIPS), §4
    multi-Krum    w_g = sample-count average of the K uploads with the lowest s_i (K > 0)

Median and trimmed mean are not a weighted average of the uploads, so they are the server's
``server_update`` (as q-FedAvg and FedFV are); the weights their ``weigh`` returns say how much
of the new model each client supplied: client i's share of the coordinates whose median (half a
share each of the two middle values when n is even) or trimmed mean its value entered. Krum's weights are
the one-hot choice, multi-Krum's the kept clients' sample-count shares. Floating buffers (BatchNorm
statistics) take the same coordinate-wise rule; integer buffers the engine's (the maximum).
Every rule ignores the clients' reported sample counts except multi-Krum's average (as Flower).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .base import ClientUpdates, Method, RoundState, register
from .fedavg import sample_count_weights


BLOCK = 2**24  # elements of [n, P] sorted at a time: bounded memory for large models


def _by_blocks(values: torch.Tensor, rule) -> tuple[torch.Tensor, torch.Tensor]:
    """``rule(sorted_values, order)`` -> (statistic, credit) applied to blocks of columns of
    ``values`` [n, ...] (a loop over parameter blocks, not clients); credits summed."""
    n = values.shape[0]
    flat = values.reshape(n, -1)
    step = max(1, BLOCK // max(n, 1))
    out = torch.empty(flat.shape[1], dtype=flat.dtype, device=flat.device)
    credit = torch.zeros(n, dtype=torch.float64, device=flat.device)
    for start in range(0, flat.shape[1], step):
        block = slice(start, start + step)
        ordered, order = flat[:, block].sort(dim=0, stable=True)
        out[block], part = rule(ordered, order)
        credit += part
    return out.reshape(values.shape[1:]), credit


def coordinate_median(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(median over dim 0 of ``values`` [n, ...], the share [n] of coordinates each row supplied).
    Even n: the mean of the two middle values, each row credited half a coordinate."""
    n = values.shape[0]
    lower, upper = (n - 1) // 2, n // 2
    size = max(values[0].numel(), 1)

    def rule(ordered, order):
        credit = torch.zeros(n, dtype=torch.float64, device=ordered.device)
        half = torch.full((ordered.shape[1],), 0.5 / size, dtype=torch.float64, device=ordered.device)
        for rank in (lower, upper):  # the two middle ranks (one rank twice when n is odd)
            credit.index_add_(0, order[rank], half)
        return 0.5 * (ordered[lower] + ordered[upper]), credit

    return _by_blocks(values, rule)


def trimmed_mean(values: torch.Tensor, cut: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean over dim 0 of ``values`` [n, ...] without the ``cut`` smallest and ``cut`` largest
    values of each coordinate, the share [n] of the kept values each row supplied)."""
    n = values.shape[0]
    if not 0 <= 2 * cut < n:
        raise ValueError(f"trimmed mean: cutting {cut} from each end leaves nothing of {n} values")
    kept_total = max(values[0].numel(), 1) * (n - 2 * cut)

    def rule(ordered, order):
        kept = order[cut:n - cut].reshape(-1)
        credit = torch.zeros(n, dtype=torch.float64, device=ordered.device).index_add_(
            0, kept, torch.full((kept.numel(),), 1.0 / kept_total, dtype=torch.float64, device=ordered.device))
        return ordered[cut:n - cut].mean(0), credit

    return _by_blocks(values, rule)


def krum_scores(flat: torch.Tensor, num_malicious: int) -> torch.Tensor:
    """Krum's score of each row of ``flat`` [n, P]: the sum of its squared distances to its
    m = max(1, n - f - 2) nearest other rows (all of them when fewer exist)."""
    n = flat.shape[0]
    if n == 1:
        return torch.zeros(1, dtype=torch.float64, device=flat.device)
    x = flat.double()
    squared = torch.cdist(x, x).square()
    squared.fill_diagonal_(float("inf"))  # a row is not its own neighbour
    m = min(max(1, n - num_malicious - 2), n - 1)
    return squared.topk(m, dim=1, largest=False).values.sum(1)


def _coordinatewise(rule, state: RoundState, buffers: dict[str, torch.Tensor]):
    """The new global model and buffers from ``rule`` applied to the round's uploads."""
    updates = state.updates
    flat, _ = rule(updates.flat)
    out = dict(buffers)
    for name, value in updates.buffers.items():
        if value.is_floating_point():
            out[name] = rule(value)[0]
    return flat, out


@register
@dataclass
class FedMedian(Method):
    """Coordinate-wise median of the uploads (Yin et al. 2018, Eq. 3; Flower's ``FedMedian``,
    github.com/adap/flower ``framework/py/flwr/server/strategy/aggregate.py`` ``aggregate_median``).
    Tolerates fewer than half of the clients being Byzantine per coordinate. Weights: each
    client's share of the coordinates its value is the median of (see the module docstring)."""

    name = "fedmedian"

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        _, credit = coordinate_median(updates.flat)
        state.round_data["diagnostics"] = {"rule": "coordinate-wise median"}
        return credit.float()

    def server_update(self, state, weights, flat, buffers):
        return _coordinatewise(coordinate_median, state, buffers)


@register
@dataclass
class FedTrimmedAvg(Method):
    """Coordinate-wise trimmed mean (Yin et al. 2018, Definition 2; Flower's
    ``FedTrimmedAvg(beta=0.2)``, github.com/adap/flower ``framework/py/flwr/server/strategy/aggregate.py``
    ``aggregate_trimmed_avg``): per coordinate, the k = floor(beta n) smallest and k largest of the n
    uploads are cut and the rest averaged. beta in [0, 0.5); beta = 0 is the uniform mean."""

    name = "fedtrimmedavg"
    beta: float = 0.2

    def validate(self) -> None:
        self.check(("beta", 0 <= self.beta < 0.5, "in [0, 0.5)"))

    def cut(self, n: int) -> int:
        return min(int(np.floor(self.beta * n)), (n - 1) // 2)  # floor(beta n) < n/2; the min guards rounding

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        k = self.cut(len(updates.clients))
        _, credit = trimmed_mean(updates.flat, k)
        state.round_data["diagnostics"] = {"cut_each_end": k}
        return credit.float()

    def server_update(self, state, weights, flat, buffers):
        k = self.cut(len(state.updates.clients))
        return _coordinatewise(lambda v: trimmed_mean(v, k), state, buffers)


@register
@dataclass
class Krum(Method):
    """Krum and multi-Krum (Blanchard et al. 2017, §4; multi-Krum §5 of El Mhamdi et al. 2018 and
    Flower's ``Krum(num_malicious_clients, num_clients_to_keep)``, github.com/adap/flower
    ``framework/py/flwr/server/strategy/aggregate.py`` ``aggregate_krum``). Each upload's score is the sum
    of squared distances to its n - f - 2 nearest others (f = ``num_malicious_clients``, at least
    one neighbour); ``num_clients_to_keep`` = 0: the upload with the lowest score becomes the global
    model (Krum); K > 0: the sample-count average of the K lowest (multi-Krum). A round that receives
    fewer than K uploads is refused with one line (Flower's ``aggregate_krum`` then keeps them all,
    silently FedAvg). Ties go to the lower client id. Krum's guarantee needs n >= 2f + 3.

    Finding (issue 43): identical uploads are each other's nearest neighbours at distance 0, so a
    group of free-riders (each returning w_g) or colluders sending one vector gets the lowest scores
    and Krum picks it every round: the model never moves (4 free-riders of 10 froze MNIST at 12.2 %).
    Flower's ``aggregate_krum`` does the same (it skips only the first, zero, distance of each row),
    and so does this implementation, to stay comparable; the poisoning monitor names such groups
    (``fedlib.screening``, rule A)."""

    name = "krum"
    num_malicious_clients: int = 0
    num_clients_to_keep: int = 0

    def validate(self) -> None:
        self.check(("num_malicious_clients", isinstance(self.num_malicious_clients, int)
                    and self.num_malicious_clients >= 0, "an integer >= 0"),
                   ("num_clients_to_keep", isinstance(self.num_clients_to_keep, int)
                    and self.num_clients_to_keep >= 0, "an integer >= 0"))

    def check_run(self, rounds: int, n_clients: int) -> None:
        if self.num_malicious_clients >= n_clients:
            raise ValueError(f"method 'krum': num_malicious_clients must be < n_clients = {n_clients} "
                             f"(got {self.num_malicious_clients})")
        if self.num_clients_to_keep > n_clients:
            raise ValueError(f"method 'krum': num_clients_to_keep must be <= n_clients = {n_clients} "
                             f"(got {self.num_clients_to_keep})")

    def setup(self, fed) -> None:
        super().setup(fed)
        if self.num_clients_to_keep > fed.clients_per_round:
            raise ValueError(f"method 'krum': num_clients_to_keep must be <= the {fed.clients_per_round} clients "
                             f"per round (got {self.num_clients_to_keep})")

    def weigh(self, state: RoundState, updates: ClientUpdates) -> torch.Tensor:
        n = len(updates.clients)
        if self.num_clients_to_keep > n:
            raise ValueError(f"method 'krum': round {state.round + 1} received {n} upload(s), fewer than "
                             f"num_clients_to_keep = {self.num_clients_to_keep}")
        scores = krum_scores(updates.flat, self.num_malicious_clients).cpu()
        keep = self.num_clients_to_keep or 1
        chosen = np.lexsort((np.arange(n), scores.numpy()))[:keep]  # lowest scores; ties: lower position
        weights = torch.zeros(n)
        if self.num_clients_to_keep:
            weights[chosen] = sample_count_weights(np.asarray(updates.sizes)[chosen])
        else:
            weights[chosen] = 1.0
        state.round_data["diagnostics"] = {"krum_scores": scores.tolist(),
                                           "kept": np.asarray(updates.clients)[np.sort(chosen)].tolist()}
        return weights
