"""Layers that stay exact when a batch is padded.

The population engine trains many clients at once on equally shaped batches; a client
whose last batch is short is padded and the padding is masked out. Losses take the mask
directly. BatchNorm would see the padding in its batch statistics, so models use
:class:`MaskedBatchNorm`, which reads the current sample mask from :func:`sample_mask`
and computes statistics (and running-statistic updates) over the real samples only.
Without a mask it is exactly ``torch.nn.BatchNorm{1,2}d``.

Convolutions are :class:`Conv2d`, ``torch.nn.Conv2d`` with a second lowering. Under ``vmap``
over stacked weights PyTorch runs a convolution of M models as one grouped convolution
(groups = M), which cuDNN may serve slowly for small layers; within :func:`conv_lowering`
("matmul") the layer runs as an unfold and one matrix product per model instead. Both give
the same numbers up to float summation order; the engine picks one per shape
(``fedlib.training.conv_lowering_for``).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.nn.functional as F
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


CONV_LOWERINGS = ("native", "matmul")
_CONV_LOWERING: contextvars.ContextVar[str] = contextvars.ContextVar("fedlib_conv_lowering", default="native")


@contextlib.contextmanager
def conv_lowering(name: str):
    """Within this block, :class:`Conv2d` layers run as ``name`` (one of ``CONV_LOWERINGS``)."""
    if name not in CONV_LOWERINGS:
        raise ValueError(f"conv lowering: must be one of {', '.join(CONV_LOWERINGS)} (got {name!r})")
    token = _CONV_LOWERING.set(name)
    try:
        yield
    finally:
        _CONV_LOWERING.reset(token)


def current_conv_lowering() -> str:
    return _CONV_LOWERING.get()


def conv2d_as_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     stride: tuple[int, int], padding: tuple[int, int]) -> torch.Tensor:
    """``F.conv2d(x, weight, bias, stride, padding)`` (groups 1, dilation 1) as im2col and one
    matrix product over the whole batch: ``out[o, (b, l)] = sum_k W[o, k] cols[k, (b, l)]``."""
    batch, _, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    out_h = (height + 2 * padding[0] - kh) // stride[0] + 1
    out_w = (width + 2 * padding[1] - kw) // stride[1] + 1
    cols = F.unfold(x, (kh, kw), padding=padding, stride=stride)  # [B, C*kh*kw, L]
    cols = cols.transpose(0, 1).reshape(cols.shape[1], batch * out_h * out_w)  # [C*kh*kw, B*L]
    out = weight.reshape(out_channels, -1) @ cols  # [C_out, B*L]: under vmap one bmm over models
    if bias is not None:
        out = out + bias[:, None]
    return out.reshape(out_channels, batch, out_h, out_w).transpose(0, 1)


class Conv2d(nn.Conv2d):
    """``torch.nn.Conv2d`` (same parameters, initialisation and state dict) that runs as
    :func:`conv2d_as_matmul` inside ``conv_lowering("matmul")``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (_CONV_LOWERING.get() == "matmul" and self.groups == 1 and self.dilation == (1, 1)
                and self.padding_mode == "zeros" and not isinstance(self.padding, str)):
            return conv2d_as_matmul(x, self.weight, self.bias, self.stride, self.padding)
        return super().forward(x)


class MaskedBatchNorm(nn.BatchNorm2d):
    """BatchNorm over dim 1 for inputs [B, C] or [B, C, H, W], mask-aware in training.

    With a mask of shape [B]: mean and biased variance over masked samples (and spatial
    positions); running statistics move by ``momentum`` toward (mean, unbiased variance);
    a batch with no real sample leaves the running statistics unchanged. A bfloat16 input (local
    training under bfloat16 autocast) is normalised in float32, so the statistics stay float32.
    """

    def _check_input_dim(self, x):
        if x.dim() not in (2, 4):
            raise ValueError(f"MaskedBatchNorm expects 2D or 4D input, got {x.dim()}D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if x.dtype in (torch.bfloat16, torch.float16) and self.running_mean is not None and \
                self.running_mean.dtype == torch.float32:
            # a low-precision activation (bfloat16 autocast, LocalTraining.precision): statistics, running
            # statistics and the normalisation in float32, the output back in the activation's precision
            return self._forward(x.float()).to(x.dtype)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
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
