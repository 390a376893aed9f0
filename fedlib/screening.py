"""Server-side screening of client updates, applied before any method sees them.

Rules, in order (each decision is recorded in the round's history):
1. **wrong shape** — an update whose size is not the model's parameter count is dropped;
2. **non-finite** — an update containing NaN or Inf (parameters or BatchNorm buffers) is dropped;
3. **outsized** — an update whose distance to the global model ``||w_i - w_g||`` exceeds
   ``clip_factor`` times the median distance of the round's remaining updates is clipped:
   ``w_i <- w_g + (w_i - w_g) * clip_factor * median / ||w_i - w_g||``. With fewer than three
   updates the median is not a meaningful reference (of two updates, either may be the odd one)
   and nothing is clipped; the round's ``notes`` say so, and an update more than ``clip_factor``
   times farther than the nearest one is named in ``suspects`` (the engine's stop message then
   points at it rather than at the learning rate).

Disagreement (issue 33). Before clipping, each finite update d_i = w_i - w_g is compared with the
round's coordinate-wise median update m (the mean of the two middle values when n is even):
``cosine`` cos(d_i, m) and ``norm_ratio`` ||d_i|| / median_j ||d_j||. An update is *anomalous*
when it points against the median (cosine < ``ANOMALY_COSINE`` = -0.05; orthogonal updates of very
different clients, cosine near 0, are not) or is more than ``clip_factor``
(10 when clipping is off) times the median norm; with fewer than three updates, only the
``suspects`` above. :class:`PoisoningMonitor` turns these per-round records into a run's warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Screened:
    """The updates that passed, plus what was dropped or clipped and why."""

    keep: np.ndarray  # bool [n]: row passed (possibly clipped)
    flat: torch.Tensor  # [n_kept, P]
    buffers: dict[str, torch.Tensor]
    dropped: list[dict] = field(default_factory=list)  # {"client": id, "reason": ...}
    clipped: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the screening could not do, and why
    suspects: list[int] = field(default_factory=list)  # unclipped updates far larger than the nearest one
    # how far the kept updates disagree, before clipping (issue 33): {"cosine": [n], "norm_ratio": [n],
    # "anomalous": [client ids]}, rows as ``flat``; None when nothing was kept
    disagreement: dict | None = None


def stack_received(received: list[torch.Tensor], size: int) -> tuple[torch.Tensor, np.ndarray]:
    """Stack per-client flat updates as received; wrong-sized ones become NaN rows (dropped later)."""
    rows = [r.reshape(-1) if r.numel() == size else torch.full((size,), float("nan")) for r in received]
    wrong = np.array([r.numel() != size for r in received], dtype=bool)
    return torch.stack(rows), wrong


def screen_updates(clients: np.ndarray, flat: torch.Tensor, buffers: dict[str, torch.Tensor],
                   global_flat: torch.Tensor, clip_factor: float | None = 10.0,
                   wrong_shape: np.ndarray | None = None) -> Screened:
    n = flat.shape[0]
    wrong = np.zeros(n, dtype=bool) if wrong_shape is None else wrong_shape
    finite = torch.isfinite(flat).all(1)
    for b in buffers.values():
        if b.is_floating_point():
            finite &= torch.isfinite(b.reshape(n, -1)).all(1)
    finite = finite.cpu().numpy() & ~wrong
    dropped = [{"client": int(c), "reason": "wrong shape" if w else "non-finite values"}
               for c, w, ok in zip(clients, wrong, finite) if not ok]
    flat, buffers = flat[finite], {k: v[finite] for k, v in buffers.items()}
    clipped: list[int] = []
    notes: list[str] = []
    suspects: list[int] = []
    kept_clients = np.asarray(clients)[finite]
    if clip_factor is not None and 0 < flat.shape[0] < 3:
        dist = (flat - global_flat).norm(dim=1)
        notes.append(f"not clipped: {flat.shape[0]} finite update(s), clipping needs >= 3 (a median to compare with)")
        nearest = float(dist.min())
        far = (dist > clip_factor * max(nearest, 1e-30)).cpu().numpy() if flat.shape[0] == 2 else np.zeros(1, bool)
        if far.any():
            suspects = kept_clients[far].astype(int).tolist()
            ratio = float(dist.max()) / max(nearest, 1e-30)
            how_far = f"{ratio:.3g} times farther" if np.isfinite(ratio) else "so much farther (its norm overflows)"
            notes.append(f"client(s) {suspects} sent an update {how_far} from the global model than the other; "
                         f"with two updates it cannot be told which is faulty")
    disagreement = update_disagreement(kept_clients, flat, global_flat, clip_factor, suspects)
    if clip_factor is not None and flat.shape[0] >= 3:
        delta = flat - global_flat
        dist = delta.norm(dim=1)
        limit = clip_factor * dist.median()
        over = dist > limit
        if over.any():
            scale = torch.where(over, limit / dist.clamp(min=1e-30), torch.ones_like(dist))
            flat = global_flat + delta * scale.unsqueeze(1)
            clipped = kept_clients[over.cpu().numpy()].astype(int).tolist()
    return Screened(keep=finite, flat=flat, buffers=buffers, dropped=dropped, clipped=clipped, notes=notes,
                    suspects=suspects, disagreement=disagreement)


# ----------------------------------------------------------------------------- poisoning (issue 33)

ANOMALY_COSINE = -0.05  # an update pointing against the round's median update (beyond noise) is anomalous
ANOMALY_NORM = 10.0  # ... or one this many times the median norm (the clip factor when clipping is on)
POISONED_SHARE = 0.25  # a round is contested when at least this share of its updates is anomalous
CONTESTED_ROUNDS = 0.3  # the run warns when at least this share of its rounds is contested
MIN_CONTESTED = 3  # ... and at least this many (two rounds of a short run with extreme label skew are no attack)
COLLAPSE_DROP = 0.2  # ... or when accuracy falls this much (absolute) below its best so far
COLLAPSE_RATIO = 0.5  # ... to at most this fraction of it, in a round with (or after) anomalous updates


DISAGREEMENT_BLOCK = 2**24  # elements of [n, P] per block of columns: bounded memory for large models


def _middle(values: torch.Tensor) -> torch.Tensor:
    """Median over dim 0, the mean of the two middle values when the count is even (as np.median)."""
    ordered = values.sort(dim=0).values
    n = values.shape[0]
    return 0.5 * (ordered[(n - 1) // 2] + ordered[n // 2])


def update_disagreement(clients: np.ndarray, flat: torch.Tensor, global_flat: torch.Tensor,
                        clip_factor: float | None, suspects: list[int]) -> dict | None:
    """How far the updates ``flat - global_flat`` [n, P] of ``clients`` disagree (module docstring).
    Blocks of columns at a time (the coordinate-wise median sorts; no [n, P] copy of the whole);
    sums in float64, so an outsized update's norm does not overflow."""
    n, size = flat.shape
    if n == 0:
        return None
    step = max(1, DISAGREEMENT_BLOCK // n)
    blocks = [slice(start, min(start + step, size)) for start in range(0, size, step)]
    median_update = torch.empty(size, dtype=flat.dtype, device=flat.device)
    squares = torch.zeros(n, dtype=torch.float64, device=flat.device)
    for block in blocks:  # blocks of parameters, not clients
        delta = flat[:, block] - global_flat[block]
        median_update[block] = _middle(delta)
        squares += delta.double().square().sum(1)
    dots = torch.zeros(n, dtype=torch.float64, device=flat.device)
    for block in blocks:
        dots += (flat[:, block] - global_flat[block]).double() @ median_update[block].double()
    norms = squares.sqrt()
    scale = norms * median_update.double().norm()
    cosine = torch.where(scale > 0, dots / scale.clamp(min=1e-300), torch.zeros_like(norms))
    median_norm = _middle(norms.unsqueeze(1))[0]
    ratio = norms / median_norm if median_norm > 0 else torch.zeros_like(norms)
    if n >= 3:
        limit = ANOMALY_NORM if clip_factor is None else clip_factor
        bad = ((cosine < ANOMALY_COSINE) | (ratio > limit)).cpu().numpy()
        anomalous = np.asarray(clients)[bad].astype(int).tolist()
    else:  # two updates: no majority to compare with; only an update far larger than the other
        anomalous = list(suspects)
    return {"cosine": cosine.cpu().tolist(), "norm_ratio": ratio.cpu().tolist(), "anomalous": anomalous}


class PoisoningMonitor:
    """Watches a run's rounds for poisoning and reports it (issue 33). The engine calls
    :meth:`observe` with each round's record (``accuracy`` filled in when evaluated) and its
    screening, which adds the round's ``disagreement``; then :meth:`finish` with the run's
    ``final`` block, which gets ``poisoning_warning`` (None when nothing was found) and, when
    something was, a RuntimeWarning. Two rules:

    * **contested**: in at least ``CONTESTED_ROUNDS`` of the rounds, at least ``POISONED_SHARE``
      of the screened updates, and at least two, were anomalous (one odd client, e.g. a Maverick
      among four, is not an attack; with fewer than three updates, the one outsized update is);
    * **collapse**: an evaluated accuracy fell by ``COLLAPSE_DROP`` or more below the best so far,
      to at most ``COLLAPSE_RATIO`` of it, with anomalous updates in that round or since the last
      evaluation (e.g. one unclipped outsized update in a sampled run's last round).

    ``enabled`` False (uploads that are not updates of one shared model, the logit protocol):
    nothing is measured or reported."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.rounds = 0
        self.contested: dict[int, list[int]] = {}  # round -> anomalous clients
        self.pending: dict[int, list[int]] = {}  # anomalous since the last evaluation
        self.collapses: list[dict] = []
        self.best: float | None = None

    def observe(self, record: dict, screened: Screened) -> None:
        if not self.enabled:
            return
        self.rounds += 1
        t, found = record["round"], screened.disagreement
        if found is not None:
            record["disagreement"] = found
            if found["anomalous"]:
                self.pending[t] = found["anomalous"]
                k, n = len(found["anomalous"]), len(found["cosine"])
                if k >= POISONED_SHARE * n and (k >= 2 or n < 3):  # one odd client of many is no attack
                    self.contested[t] = found["anomalous"]
        accuracy = record.get("accuracy")
        if accuracy is None:
            return
        if (self.best is not None and self.pending and self.best - accuracy >= COLLAPSE_DROP
                and accuracy <= COLLAPSE_RATIO * self.best):
            clients = sorted({c for cs in self.pending.values() for c in cs})
            self.collapses.append({"round": t, "accuracy": accuracy, "best": self.best,
                                   "rounds": sorted(self.pending), "clients": clients})
        self.best = accuracy if self.best is None else max(self.best, accuracy)
        self.pending = {}

    def report(self) -> dict | None:
        """The run's ``poisoning_warning``: rounds (as the history's ``round``), clients, reasons, message."""
        contested = self.rounds > 0 and len(self.contested) >= max(MIN_CONTESTED, CONTESTED_ROUNDS * self.rounds)
        if not (contested or self.collapses):
            return None
        reasons, rounds, clients = [], set(), set()
        if contested:
            rounds |= set(self.contested)
            clients |= {c for cs in self.contested.values() for c in cs}
            reasons.append(f"in {len(self.contested)} of {self.rounds} rounds at least {POISONED_SHARE:.0%} of the "
                           f"updates were anomalous (against the round's median update or outsized)")
        for c in self.collapses:
            rounds |= set(c["rounds"]) | {c["round"]}
            clients |= set(c["clients"])
            reasons.append(f"accuracy fell from {100 * c['best']:.1f} % to {100 * c['accuracy']:.1f} % in round "
                           f"{c['round'] + 1} after anomalous updates of client(s) {c['clients'][:10]}")
        rounds_list, clients_list = sorted(rounds), sorted(clients)
        message = (f"possible poisoning: {'; '.join(reasons[:3])}; anomalous client(s) {clients_list[:10]}"
                   f"{' ...' if len(clients_list) > 10 else ''}. Exclude them or use a robust aggregation "
                   f"(fedmedian, fedtrimmedavg, krum)")
        return {"rounds": rounds_list, "clients": clients_list, "contested": contested,
                "collapses": self.collapses, "message": message}

    def finish(self, final: dict, label: str) -> dict | None:
        """Sets ``final["poisoning_warning"]`` and warns (RuntimeWarning) when it is not None."""
        import warnings

        found = self.report() if self.enabled else None
        final["poisoning_warning"] = found
        if found is not None:
            warnings.warn(f"{label}: {found['message']}", RuntimeWarning, stacklevel=3)
        return found
