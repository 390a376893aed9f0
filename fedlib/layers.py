"""Layers that stay exact when a batch is padded.

The population engine trains many clients at once on equally shaped batches; a client
whose last batch is short is padded and the padding is masked out. Losses take the mask
directly. BatchNorm would see the padding in its batch statistics, so models use
:class:`MaskedBatchNorm`, which reads the current sample mask from :func:`sample_mask`
and computes statistics (and running-statistic updates) over the real samples only.
Without a mask it is exactly ``torch.nn.BatchNorm{1,2}d``.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
from torch import nn

_SAMPLE_MASK: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "fedlib_sample_mask", default=None
)


@contextlib.contextmanager
def sample_mask(mask: torch.Tensor | None):
    """Within this block, MaskedBatchNorm layers use ``mask`` ([B], 1 = real sample)."""
    token = _SAMPLE_MASK.set(mask)
    try:
        yield
    finally:
        _SAMPLE_MASK.reset(token)


class MaskedBatchNorm(nn.BatchNorm2d):
    """BatchNorm over dim 1 for inputs [B, C] or [B, C, H, W], mask-aware in training.

    With a mask of shape [B]: mean and biased variance over masked samples (and spatial
    positions); running statistics move by ``momentum`` toward (mean, unbiased variance);
    a batch with no real sample leaves the running statistics unchanged.
    """

    def _check_input_dim(self, x):
        if x.dim() not in (2, 4):
            raise ValueError(f"MaskedBatchNorm expects 2D or 4D input, got {x.dim()}D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        mask = _SAMPLE_MASK.get()
        if not self.training or mask is None:
            return super().forward(x)
        if self.momentum is None:
            raise ValueError("MaskedBatchNorm needs a numeric momentum")
        shape = [-1] + [1] * (x.dim() - 1)
        m = mask.to(x.dtype).reshape(shape)
        reduce_dims = [0] + list(range(2, x.dim()))
        per_sample = x[0].numel() // x.shape[1]  # spatial positions per sample
        count = m.sum() * per_sample
        safe = count.clamp(min=1.0)
        mean = (x * m).sum(reduce_dims) / safe
        centred = x - mean.reshape(1, -1, *([1] * (x.dim() - 2)))
        var = (centred.square() * m).sum(reduce_dims) / safe
        unbiased = var * safe / (safe - 1.0).clamp(min=1.0)
        if self.track_running_stats:
            has_data = (count > 0).to(x.dtype)
            mom = self.momentum * has_data
            self.running_mean.copy_((1 - mom) * self.running_mean + mom * mean.detach())
            self.running_var.copy_((1 - mom) * self.running_var + mom * unbiased.detach())
            self.num_batches_tracked.add_((count > 0).to(self.num_batches_tracked.dtype))
        view = [1, -1] + [1] * (x.dim() - 2)
        var = torch.where(count > 0, var, torch.ones_like(var))  # empty batch: keep values finite
        out = centred * torch.rsqrt(var.reshape(view) + self.eps)
        if self.affine:
            out = out * self.weight.reshape(view) + self.bias.reshape(view)
        return out
