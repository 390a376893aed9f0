"""The population: many models of one architecture as one stacked parameter tensor.

N client models live in a flat tensor ``[N, P]`` (``P`` = parameters per model) plus
stacked buffers (BatchNorm running statistics, ``[N, ...]``). Aggregation is a matmul
(``w_g = c @ W``) and evaluation of M models is one vmapped forward pass per test chunk
(``evaluate`` / ``predict``, an ``Evaluation``). This module also holds what local training is
given: every client's shuffled, padded and masked mini-batches (``make_client_batches``), the
settings (``LocalTraining``) and their precision (``autocast``) and memory format.

Local training itself is ``fedlib.training.train_clients``; how its steps run (vectorized or
client by client, threads, compaction, captured steps) is chosen by ``fedlib.plans``.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap


def _keep_freed_memory() -> None:
    """Ask glibc to reuse freed large blocks instead of returning them to the OS.

    A round allocates several [N, P] tensors (500 MLPs: ~0.5 GB each); with glibc's
    defaults each one is a fresh mmap whose page faults cost as much as the arithmetic
    (measured: a 500-client round 0.80 s -> 0.46 s). Set FEDLIB_KEEP_HEAP=0 to opt out.
    """
    if os.environ.get("FEDLIB_KEEP_HEAP", "1") == "0" or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 2**31 - 1)
    libc.mallopt(m_trim_threshold, 2**31 - 1)


_keep_freed_memory()

# ----------------------------------------------------------------------------- layout


class ParamLayout:
    """Where each named parameter sits in the flat vector of one model."""

    def __init__(self, model: nn.Module):
        self.names: list[str] = []
        self.shapes: list[torch.Size] = []
        self.numels: list[int] = []
        for name, p in model.named_parameters():
            self.names.append(name)
            self.shapes.append(p.shape)
            self.numels.append(p.numel())
        self.size = sum(self.numels)
        self.buffer_names = [n for n, _ in model.named_buffers()]

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views ``{name: [..., *shape]}`` of a flat ``[..., P]`` tensor."""
        lead = flat.shape[:-1]
        parts = torch.split(flat, self.numels, dim=-1)
        return {n: t.reshape(*lead, *s) for n, t, s in zip(self.names, parts, self.shapes)}

    def flatten(self, params: dict[str, torch.Tensor], lead: tuple[int, ...] = ()) -> torch.Tensor:
        return torch.cat([params[n].reshape(*lead, -1) for n in self.names], dim=-1)

    def flat_of(self, model: nn.Module) -> torch.Tensor:
        """The flat parameter vector ``[P]`` of a module."""
        return self.flatten(dict(model.named_parameters())).detach().clone()

    def buffers_of(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {n: b.detach().clone() for n, b in model.named_buffers()}

    def load_into(self, model: nn.Module, flat: torch.Tensor, buffers: dict | None = None) -> nn.Module:
        """Copy one flat vector ``[P]`` (and buffers) into ``model`` in place."""
        params = self.unflatten(flat)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(params[n])
            if buffers:
                for n, b in model.named_buffers():
                    b.copy_(buffers[n])
        return model


def stack_buffers(buffers: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    """Repeat one model's buffers for ``n`` models: ``{name: [n, ...]}``."""
    return {k: v.unsqueeze(0).expand(n, *v.shape).clone() for k, v in buffers.items()}


def aggregate(flat: torch.Tensor, weights: torch.Tensor, buffers: dict | None = None):
    """Weighted average of models: ``weights @ flat``.

    ``weights`` is ``[N]`` (one model) or ``[M, N]`` (M models, e.g. Shapley subsets).
    Floating buffers (running statistics) are averaged with the same weights; integer
    buffers (``num_batches_tracked``) take the maximum.
    """
    weights = weights.to(flat.dtype)
    out = weights @ flat
    if buffers is None:
        return out
    agg = {}
    for k, b in buffers.items():
        if b.is_floating_point():
            agg[k] = torch.tensordot(weights, b, dims=([-1], [0]))
        else:
            top = b.max(dim=0).values
            agg[k] = top if weights.dim() == 1 else top.expand(weights.shape[0], *top.shape).clone()
    return out, agg


# ----------------------------------------------------------------------------- batches


@dataclass
class ClientBatches:
    """Per-client shuffled mini-batches for local training.

    ``index[s, i, b]`` is the pool index of sample b of client i at step s and
    ``mask[s, i, b]`` says whether it is a real sample (padding is 0).
    """

    index: torch.Tensor  # [steps, N, B] int64 into the sample pool
    mask: torch.Tensor  # [steps, N, B] float (1 = real sample)
    # [steps, N, B] int64 augmentation of each sample (``crop_flip``'s code), or None: as stored
    codes: torch.Tensor | None = None

    @property
    def steps(self) -> int:
        return self.index.shape[0]

    def first(self, steps: int | None) -> "ClientBatches":
        """The first ``steps`` steps (all when None)."""
        if steps is None:
            return self
        return ClientBatches(self.index[:steps], self.mask[:steps], None if self.codes is None else self.codes[:steps])

    def to(self, device) -> "ClientBatches":
        return ClientBatches(self.index.to(device), self.mask.to(device),
                             None if self.codes is None else self.codes.to(device))


# Standard CIFAR augmentation (random crop with zero padding 4, horizontal flip; torchvision's
# RandomCrop(32, padding=4) + RandomHorizontalFlip): one code per sample and step, drawn from the run's
# own generator with its batches, so a packed run augments exactly as it does alone.
CROP_PAD = 4
CROP_CODES = 2 * (2 * CROP_PAD + 1) ** 2  # flip x row offset x column offset


def black_pixel(dataset) -> tuple[float, ...]:
    """A black pixel in ``dataset``'s normalised units, per channel: (0 − mean_c) / std_c (what
    torchvision's zero padding becomes once the image is normalised)."""
    c = dataset.input_shape[0]
    mean = dataset.channel_mean or (0.0,) * c
    std = dataset.channel_std or (1.0,) * c
    return tuple(-m / s for m, s in zip(mean, std))


def crop_flip(xb: torch.Tensor, codes: torch.Tensor, fill: torch.Tensor, pad: int = CROP_PAD) -> torch.Tensor:
    """Samples ``xb [..., C, H, W]`` cropped and flipped per ``codes [...]``: code = flip·(2p+1)² + dy·(2p+1)
    + dx; the image padded by ``pad`` with ``fill [C]`` (a black pixel once normalised), the H x W window at
    (dy, dx) taken, then mirrored left-right when flip. Two gathers, no loop over samples."""
    *lead, c, h, w = xb.shape
    side = 2 * pad + 1
    flat = xb.reshape(-1, c, h, w)
    codes = codes.reshape(-1)
    flip, dy, dx = codes // (side * side), (codes // side) % side, codes % side
    padded = fill.view(1, c, 1, 1).to(xb.dtype).expand(flat.shape[0], c, h + 2 * pad, w + 2 * pad).clone()
    padded[:, :, pad:pad + h, pad:pad + w] = flat
    rows = (dy.view(-1, 1, 1, 1) + torch.arange(h, device=xb.device).view(1, 1, h, 1)).expand(-1, c, h, w + 2 * pad)
    out = torch.gather(padded, 2, rows)  # [M, C, H, W + 2p]
    j = torch.arange(w, device=xb.device).view(1, w)
    cols = dx.view(-1, 1) + torch.where(flip.view(-1, 1) > 0, w - 1 - j, j)  # [M, W]
    out = torch.gather(out, 3, cols.view(-1, 1, 1, w).expand(-1, c, h, w))
    return out.reshape(*lead, c, h, w)


def flat_indices(client_indices: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Client index lists concatenated: (indices [M], owner client of each [M], sizes [N])."""
    sizes = torch.from_numpy(np.fromiter(map(len, client_indices), dtype=np.int64, count=len(client_indices)))
    flat = np.concatenate(client_indices).astype(np.int64, copy=False) if len(client_indices) else np.zeros(0, np.int64)
    return torch.from_numpy(flat), torch.repeat_interleave(torch.arange(len(sizes)), sizes), sizes


def padded_indices(client_indices: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Client index lists as a padded matrix ``[N, M_max]`` and sizes ``[N]``."""
    flat, rows, sizes = flat_indices(client_indices)
    width = max(int(sizes.max()), 1) if len(sizes) else 1
    table = torch.zeros(len(client_indices), width, dtype=torch.long)
    cols = torch.arange(len(flat)) - torch.repeat_interleave(torch.cumsum(sizes, 0) - sizes, sizes)
    table[rows, cols] = flat
    return table, sizes


def make_client_batches(
    client_indices: list[np.ndarray], batch_size: int, epochs: int, generator: torch.Generator,
    augment: bool = False,
) -> ClientBatches:
    """Shuffle every client's samples each epoch (one argsort for all clients) and cut
    them into mini-batches; clients with fewer samples finish early (masked steps). With
    ``augment``, each sample of each step also gets a ``crop_flip`` code (drawn after the epoch's order)."""
    table, sizes = padded_indices(client_indices)
    n, width = table.shape
    steps_per_epoch = max(1, math.ceil(int(sizes.max()) / batch_size))
    span = steps_per_epoch * batch_size
    col = torch.arange(width)
    valid = col.unsqueeze(0) < sizes.unsqueeze(1)
    index_steps, mask_steps, code_steps = [], [], []
    for _ in range(epochs):
        keys = torch.rand(n, width, generator=generator)
        keys = keys.masked_fill(~valid, 2.0)  # padding sorts last
        order = torch.argsort(keys, dim=1)
        order = F.pad(order, (0, span - width)) if span > width else order[:, :span]
        samples = torch.gather(table, 1, order)
        real = (torch.arange(span).unsqueeze(0) < sizes.unsqueeze(1)).float()
        index_steps.append(samples.reshape(n, steps_per_epoch, batch_size).transpose(0, 1))
        mask_steps.append(real.reshape(n, steps_per_epoch, batch_size).transpose(0, 1))
        if augment:
            codes = torch.randint(0, CROP_CODES, (n, span), generator=generator)
            code_steps.append(codes.reshape(n, steps_per_epoch, batch_size).transpose(0, 1))
    return ClientBatches(torch.cat(index_steps), torch.cat(mask_steps), torch.cat(code_steps) if augment else None)


# ----------------------------------------------------------------------------- training


@dataclass
class LocalTraining:
    """Local optimisation settings shared by all clients of a round."""

    epochs: int = 1
    batch_size: int = 128
    lr: float | torch.Tensor = 0.1  # or one per client [N] (packed runs: each run's own schedule)
    momentum: float = 0.0
    weight_decay: float = 0.0
    prox_mu: float = 0.0  # FedProx: + mu/2 ||w - w_global||^2
    max_steps: int | None = None  # at most this many mini-batch steps per client (None: the whole epochs)
    # extra_loss(params, logits, features, y, mask, context) -> scalar, per client;
    # ``context`` is that client's slice of ``client_context`` (any pytree, dim 0 = clients).
    extra_loss: Callable[..., torch.Tensor] | None = None
    client_context: Any = None
    # True: extra_loss also receives the batch as ``inputs=xb`` (MOON runs other models on it)
    extra_loss_inputs: bool = False
    chunk_size: int | None = None  # clients trained together; None = all
    # crop_flip's padding value per channel (a black pixel, normalised); applied to batches with codes
    augment_fill: tuple[float, ...] | None = None
    # "off": eager steps; "on": capture the per-client step once per shape and replay it (CUDA
    # graph on CUDA, torch.compile/inductor on CPU); "auto": CUDA graph on CUDA, eager on CPU.
    # None reads FEDLIB_COMPILE (default "auto"). Steps with an extra_loss always run eagerly.
    compile: str | None = None
    # CPU only: client groups trained in parallel Python threads with one intra-op thread each
    # (None reads FEDLIB_CPU_WORKERS, default: torch.get_num_threads()); 1 = one vectorized call
    # using all intra-op threads. Results equal the single call up to float blocking (1e-6).
    workers: int | None = None
    # how convolutions run under vmap: "native" (one grouped convolution over the clients),
    # "matmul" (unfold + one matmul per client, fedlib.layers.Conv2d) or "auto": native on a CPU
    # (2x faster there, benchmarks/packed.py --conv), on CUDA the faster of the two, timed once
    # per shape. None reads FEDLIB_CONV (default "auto"). Numbers agree up to float summation order.
    conv: str | None = None
    # Each step trains only the clients with samples left (a finished client is skipped, not computed
    # on padding). CPU eager steps: the worker threads also get client groups balanced by their steps;
    # None reads FEDLIB_CPU_BALANCE (default on). Captured steps (CUDA graphs): the clients with samples,
    # padded up to a quarter of the chunk, replay a step captured for that size; None reads
    # FEDLIB_COMPACT (default on). Off is the plain plan (benchmarks). The numbers are the plain plan's:
    # inactive clients never moved.
    balance: bool | None = None
    # CPU eager steps: "clients" trains each client alone, longest first, one per worker thread (its step
    # plain autograd, no torch.func transform; the last N mod workers clients, the shortest, then take all
    # threads); "vectorized" trains a worker's clients as one vmapped call; "auto" (None reads
    # FEDLIB_CPU_ORDER, default "auto") picks by ``client_order``'s rule. Numbers equal up to float summation order.
    order: str | None = None
    # A protocol choice (it changes numbers beyond summation order, so it is in the run's key): "float32", or
    # "bfloat16": the local loss's forward and backward run under torch.autocast(bfloat16) (see ``PRECISIONS``);
    # parameters, gradients, the optimiser step and BatchNorm's statistics stay float32.
    precision: str = "float32"
    # Activations' memory format in steps that run a client alone by plain autograd (the CPU per-client order):
    # "channels_last", "contiguous" or "auto" (None reads FEDLIB_MEMORY_FORMAT, default "auto"): channels-last
    # for a convolutional model on a CPU (``memory_format_for``). Under vmap a convolution of M models is one
    # grouped convolution whose batching rule copies its input back to contiguous, so vmapped steps stay
    # contiguous. Numbers agree up to float summation order.
    memory_format: str | None = None


PRECISIONS = ("float32", "bfloat16")


def check_precision(precision: str) -> str:
    """``precision`` when it is one of ``PRECISIONS``; else one line saying what is allowed."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: must be one of {', '.join(PRECISIONS)} (got {precision!r})")
    return precision


def autocast(precision: str, device: torch.device | str):
    """The context local training's forward and backward run in: nothing for float32; for bfloat16
    ``torch.autocast(device type, bfloat16)`` (matmuls and convolutions in bfloat16 with float32 parameters,
    so their gradients, the optimiser step and the running statistics stay float32). The autocast weight
    cache is off (captured steps: CUDA graphs must not hold cached casts)."""
    if check_precision(precision) == "float32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, cache_enabled=False)


MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
# The "auto" rule, from benchmarks/precision.py (benchmarks/results/precision_cpu-2core.json, 2-core CPU, 1 thread,
# medians of 5 interleaved repeats on a loaded machine): a 5-client round in channels-last format ran 1.44x (CNN,
# 16/32 channels) and 1.37x (cnn_wide, 32/64) as fast as contiguous; LeNet-5 (6/16 channels on 1 x 28 x 28) 1.05x,
# within its spread (0.71-1.21x), so narrow convolutions stay contiguous. Under vmap it changed nothing.
CHANNELS_LAST_MIN_CHANNELS = 32  # the widest convolution's output channels from which a model goes channels-last


def memory_format_mode(cfg: LocalTraining) -> str:
    mode = cfg.memory_format if cfg.memory_format is not None else os.environ.get("FEDLIB_MEMORY_FORMAT", "auto")
    if mode not in MEMORY_FORMATS:
        raise ValueError(f"LocalTraining.memory_format (or FEDLIB_MEMORY_FORMAT): must be one of "
                         f"{', '.join(MEMORY_FORMATS)} (got {mode!r})")
    return mode


def memory_format_for(cfg: LocalTraining, device: torch.device | str, model: nn.Module, sample_shape) -> str:
    """The activations' memory format of a step that trains one client alone by plain autograd (the CPU
    per-client order, ``client_order``) and of a one-model evaluation: "channels_last" or "contiguous". "auto"
    is channels-last on a CPU for image inputs ([C, H, W]) and a model whose widest convolution has at least
    ``CHANNELS_LAST_MIN_CHANNELS`` output channels (oneDNN's NHWC kernels; see the rule's measurements there);
    contiguous elsewhere. Vmapped steps are always contiguous (see ``LocalTraining.memory_format``)."""
    mode = memory_format_mode(cfg)
    if mode != "auto":
        return mode
    if torch.device(device).type != "cpu" or len(tuple(sample_shape)) != 3:
        return "contiguous"
    widest = max((m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)), default=0)
    return "channels_last" if widest >= CHANNELS_LAST_MIN_CHANNELS else "contiguous"


# ----------------------------------------------------------------------------- evaluation


@dataclass
class Evaluation:
    """Metrics of M models on one labelled set."""

    confusion: torch.Tensor  # [M, C, C] counts, rows = true class, cols = predicted
    loss: torch.Tensor  # [M] mean cross-entropy

    @property
    def accuracy(self) -> torch.Tensor:
        c = self.confusion
        return torch.diagonal(c, dim1=1, dim2=2).sum(1) / c.sum((1, 2)).clamp(min=1)

    @property
    def per_class_accuracy(self) -> torch.Tensor:
        c = self.confusion
        return torch.diagonal(c, dim1=1, dim2=2) / c.sum(2).clamp(min=1)

    @property
    def macro_f1(self) -> torch.Tensor:
        """Macro F1 over the classes occurring as a label or a prediction (fedlib.metrics.macro_f1)."""
        c = self.confusion
        tp = torch.diagonal(c, dim1=1, dim2=2)
        denominator = c.sum(2) + c.sum(1)  # 2 TP + FN + FP
        occurring = denominator > 0
        f1 = 2 * tp / denominator.clamp(min=1e-30)
        return (f1 * occurring).sum(1) / occurring.sum(1).clamp(min=1)

    @property
    def balanced_accuracy(self) -> torch.Tensor:
        present = self.confusion.sum(2) > 0
        pca = self.per_class_accuracy
        return (pca * present).sum(1) / present.sum(1).clamp(min=1)


def _forward_many(model, layout, flat, buffers, xb, with_features: bool, channels_last: bool = False):
    def one(f, b):
        kwargs = {"return_features": True} if with_features else {}
        return functional_call(model, (layout.unflatten(f), b), (xb,), kwargs)

    if channels_last and flat.shape[0] == 1 and xb.dim() == 4:
        # one model: a plain forward of the batch in channels-last format (not vmap, whose grouped convolution
        # copies back to contiguous); 1.4-1.7x on a CPU for cnn_wide and ResNet-20, equal up to summation order
        kwargs = {"return_features": True} if with_features else {}
        out = functional_call(model, (layout.unflatten(flat[0]), {k: v[0] for k, v in buffers.items()}),
                              (xb.contiguous(memory_format=torch.channels_last),), kwargs)
        return tuple(t.unsqueeze(0) for t in out) if with_features else out.unsqueeze(0)
    return vmap(one)(flat, buffers)


# Bytes one batched evaluation forward may hold (models x samples x activations per sample x the
# workspace factor): on a CPU a fixed 1 GiB, on CUDA a quarter of the free memory. A FedMS round on CIFAR-10
# with the wider CNN (GTG-Shapley's 32 coalitions on 2,000 validation samples at once) peaked at 21.5 GB RSS
# and was killed for memory; with 4 models per forward 8.8 GB, with 1 model 5.8 GB (FedAvg alone: 2.8 GB).
# The leaf modules' outputs undercount the peak (a convolution's unfolded input, temporaries): x 4.
EVAL_BUDGET_CPU = 1 << 30
WORKSPACE_FACTOR = 4
_ACTIVATIONS: dict[tuple, int] = {}


def activation_bytes(model: nn.Module, sample: torch.Tensor) -> int:
    """Bytes of the outputs of every leaf module in one model's forward of one sample (measured once per
    architecture and input shape)."""
    key = (type(model).__name__, ParamLayout(model).size, tuple(sample.shape), sample.dtype, str(sample.device))
    if key not in _ACTIVATIONS:
        total = [0]

        def count(_module, _inputs, output):
            for t in output if isinstance(output, (tuple, list)) else (output,):
                if torch.is_tensor(t):
                    total[0] += t.numel() * t.element_size()

        hooks = [m.register_forward_hook(count) for m in model.modules() if not list(m.children())]
        was_training = model.training
        try:
            model.eval()
            with torch.no_grad():
                model(sample.unsqueeze(0))
        finally:
            model.train(was_training)
            for h in hooks:
                h.remove()
        _ACTIVATIONS[key] = max(1, total[0])
    return _ACTIVATIONS[key]


def eval_model_chunk(model: nn.Module, x: torch.Tensor, batch_size: int, m: int) -> int:
    """Models per batched evaluation forward so its activations stay within the budget (at least 1)."""
    if len(x) == 0 or m <= 1:
        return max(m, 1)
    if x.device.type == "cuda":
        budget = torch.cuda.mem_get_info(x.device)[0] // 4
    else:
        budget = EVAL_BUDGET_CPU
    per_model = WORKSPACE_FACTOR * activation_bytes(model, x[0]) * min(batch_size, len(x))
    return max(1, min(m, budget // per_model))


def _eval_chunks(model, flat, buffers, x, batch_size, model_chunk, with_features=False):
    """Yield (model slice, sample slice, outputs) for M models over all samples (``model_chunk`` models at a
    time; None: as many as ``eval_model_chunk``'s memory budget allows)."""
    layout = ParamLayout(model)
    m = flat.shape[0]
    model_chunk = model_chunk or eval_model_chunk(model, x, batch_size, m)
    # a chunk of one model runs without vmap in the memory format FEDLIB_MEMORY_FORMAT's rule gives its device
    channels_last = memory_format_for(LocalTraining(), x.device, model, x.shape[1:]) == "channels_last"
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for lo in range(0, m, model_chunk):
                ms = slice(lo, min(m, lo + model_chunk))
                bufs = {k: v[ms] for k, v in buffers.items()}
                for start in range(0, len(x), batch_size):
                    ss = slice(start, start + batch_size)
                    yield ms, ss, _forward_many(model, layout, flat[ms], bufs, x[ss], with_features, channels_last)
    finally:
        model.train(was_training)


def evaluate(model, flat, buffers, x, y, num_classes, batch_size=2048, model_chunk=None) -> Evaluation:
    """Confusion matrices and losses of M models (``flat`` [M, P]) in batched passes."""
    m, c = flat.shape[0], num_classes
    confusion = torch.zeros(m, c * c, dtype=torch.long, device=flat.device)
    loss = torch.zeros(m, device=flat.device)
    for ms, ss, logits in _eval_chunks(model, flat, buffers, x, batch_size, model_chunk):
        yb = y[ss]
        pred = logits.argmax(-1)
        cell = yb.unsqueeze(0) * c + pred  # [mc, b]
        counts = torch.zeros(cell.shape[0], c * c, dtype=torch.long, device=cell.device)
        confusion[ms] += counts.scatter_add_(1, cell, torch.ones_like(cell))
        loss[ms] += F.cross_entropy(logits.flatten(0, 1), yb.repeat(logits.shape[0]),
                                    reduction="none").view(logits.shape[:2]).sum(1)
    return Evaluation(confusion.view(m, c, c).float(), loss / max(len(x), 1))


def predict(model, flat, buffers, x, batch_size=2048, model_chunk=None, with_features=False):
    """Logits ``[M, n, C]`` (and features ``[M, n, D]``) of M models on ``x``."""
    logits: dict[int, list] = {}
    feats: dict[int, list] = {}
    for ms, _, out in _eval_chunks(model, flat, buffers, x, batch_size, model_chunk, with_features):
        logits.setdefault(ms.start, []).append(out[0] if with_features else out)
        if with_features:
            feats.setdefault(ms.start, []).append(out[1])
    stitch = lambda parts: torch.cat([torch.cat(v, 1) for _, v in sorted(parts.items())])  # noqa: E731
    return (stitch(logits), stitch(feats)) if with_features else stitch(logits)
