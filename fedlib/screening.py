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
                    suspects=suspects)
