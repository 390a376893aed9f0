"""The population: many models of one architecture as one stacked parameter tensor.

N client models live in a flat tensor ``[N, P]`` (``P`` = parameters per model) plus
stacked buffers (BatchNorm running statistics, ``[N, ...]``). Local training of all
clients runs at once with ``torch.func`` (functional_call + vmap + grad): every client
draws its own shuffled mini-batches, shorter clients are padded and masked, and a client
with no samples left in a step is not updated. Evaluation of M models is one vmapped
forward pass per test chunk, and aggregation is a matmul (``w_g = c @ W``).

How the steps run is chosen per shape (``execution_plan``): on CUDA the step after a round's
first one is captured once per shape as a CUDA graph and replayed (``LocalTraining.compile``;
the eager step is the oracle, the replay is bit-identical to it); on a CPU the clients are
split into one group per intra-op thread, each group trained by its own thread with one
intra-op thread (``LocalTraining.workers``), either as one vmapped call or one client at a time
by plain autograd, whichever ``client_order``'s rule (from ``benchmarks/cpu_order.py``) says is
faster for the model and the steps per client (``LocalTraining.order``). Convolutions run as vmap's grouped convolution or
as unfold + one matmul per client (``LocalTraining.conv``): native on a CPU, where it measured
2x faster; on CUDA the lowering whose captured step is faster, timed once per shape and recorded
in the run's ``meta.conv_lowerings``. ``warm_up`` pays torch.func's one-time costs before a
run's first round.

``fedlib.testing.train_clients_loop`` is the plain per-client implementation, kept only as the test
oracle and benchmark baseline; it consumes exactly the same batches.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from .layers import CONV_LOWERINGS, Conv2d, conv_lowering, current_conv_lowering, sample_mask


def _keep_freed_memory() -> None:
    """Ask glibc to reuse freed large blocks instead of returning them to the OS.

    A round allocates several [N, P] tensors (500 MLPs: ~0.5 GB each); with glibc's
    defaults each one is a fresh mmap whose page faults cost as much as the arithmetic
    (measured: a 500-client round 0.80 s -> 0.46 s). Set FEDLIB_KEEP_HEAP=0 to opt out.
    """
    import ctypes
    import os
    import sys

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


def _per_client_loss(model, cfg: LocalTraining):
    """Loss of one client on one batch as a function of its parameters."""

    low = check_precision(cfg.precision) != "float32"

    def loss_fn(params, buffers, anchor, xb, yb, mb, context):
        buffers = {k: v.clone() for k, v in buffers.items()}
        with autocast(cfg.precision, xb.device):  # float32: no autocast (the same ops as before)
            with sample_mask(mb):
                if cfg.extra_loss is None:
                    logits = functional_call(model, (params, buffers), (xb,))
                    features = None
                else:
                    logits, features = functional_call(
                        model, (params, buffers), (xb,), {"return_features": True}
                    )
            if low:  # the loss itself in float32 (the logits of a bfloat16 forward, cast up)
                logits = logits.float()
                features = None if features is None else features.float()
            count = mb.sum().clamp(min=1.0)
            loss = (F.cross_entropy(logits, yb, reduction="none") * mb).sum() / count
            if cfg.prox_mu:
                loss = loss + 0.5 * cfg.prox_mu * sum((params[k] - anchor[k]).square().sum() for k in params)
            if cfg.extra_loss is not None:
                kwargs = {"inputs": xb} if cfg.extra_loss_inputs else {}
                loss = loss + cfg.extra_loss(params, logits, features, yb, mb, context, **kwargs)
        return loss.float(), buffers

    return loss_fn


COMPILE_MODES = ("off", "auto", "on")


def step_backend(cfg: LocalTraining, device: torch.device | str) -> str:
    """How the per-client steps after a round's first one run: "eager", "graph" (CUDA graph
    replay) or "inductor" (torch.compile on CPU)."""
    mode = cfg.compile if cfg.compile is not None else os.environ.get("FEDLIB_COMPILE", "auto")
    if mode not in COMPILE_MODES:
        raise ValueError(f"LocalTraining.compile (or FEDLIB_COMPILE): must be one of "
                         f"{', '.join(COMPILE_MODES)} (got {mode!r})")
    if mode == "off" or cfg.extra_loss is not None:
        return "eager"
    if torch.device(device).type == "cuda":
        return "graph"
    return "inductor" if mode == "on" else "eager"


def cpu_workers(cfg: LocalTraining, n_clients: int, device: torch.device | str) -> int:
    """Parallel client groups for a CPU round (1 on CUDA, with an extra_loss, or for one client).

    Each group runs the vectorized step on its clients with one intra-op thread. On a small
    CPU this replaces OpenMP's 2-thread GEMMs, whose barriers cost a lot on small matrices and
    collapse when the cores are shared with other processes (measured 10-30x slower under load)."""
    if torch.device(device).type != "cpu" or cfg.extra_loss is not None or step_backend(cfg, device) != "eager":
        return 1  # (torch.compile is not run from several threads at once)
    wanted = cfg.workers if cfg.workers is not None else os.environ.get("FEDLIB_CPU_WORKERS")
    if wanted is None:
        wanted = _caller_threads()
    try:
        wanted = int(wanted)
    except ValueError:
        raise ValueError(f"LocalTraining.workers (or FEDLIB_CPU_WORKERS): must be an integer >= 1 "
                         f"(got {wanted!r})") from None
    if wanted < 1:
        raise ValueError(f"LocalTraining.workers (or FEDLIB_CPU_WORKERS): must be >= 1 (got {wanted})")
    return max(1, min(wanted, n_clients))


CLIENT_ORDERS = ("auto", "vectorized", "clients")
# The "auto" rule, from benchmarks/cpu_order.py (benchmarks/results/cpu_order_cpu-2core.json, 2-core CPU, one
# round of 60,000 samples, batch 128; three invocations, +-10 % apart): clients one at a time ran 1.3-2.6x faster
# than the vmapped groups for LeNet-5 at every N (vmap's grouped convolution is slow on a CPU) and 1.05-1.48x for
# the MLP at N = 5 (94 steps per client: a client's weights stay in cache); for the MLP at 24 steps per client
# the plans tied (0.94-1.02x) and at 5 steps the groups were as fast or faster (0.82-1.05x). Alone, a client's
# step costs about 0.5 ms more (Python and dispatch), so small steps stay vectorized (a 4-MFLOP CNN step: 2x
# slower alone).
CLIENT_ORDER_MIN_STEPS = 32  # mean live steps per client from which a model without convolutions goes alone
CLIENT_ORDER_MIN_FLOPS = 2.5e7  # forward FLOPs of one client's step (a sample's x the batch) to go alone


def client_order(cfg: LocalTraining, device: torch.device | str, model: nn.Module | None = None,
                 steps: float | None = None, step_flops: float | None = None) -> str:
    """How a round's eager CPU steps go through its clients: "clients" (one at a time per worker thread) or
    "vectorized" (a worker's clients in one vmapped call). "auto" goes client by client when a client's step
    is large (``step_flops``, see ``step_flops``) and either the model has convolutions or the clients have
    many steps (``steps``: the mean live steps per client). CUDA and captured steps are always vectorized."""
    mode = cfg.order if cfg.order is not None else os.environ.get("FEDLIB_CPU_ORDER", "auto")
    if mode not in CLIENT_ORDERS:
        raise ValueError(f"LocalTraining.order (or FEDLIB_CPU_ORDER): must be one of {', '.join(CLIENT_ORDERS)} "
                         f"(got {mode!r})")
    if torch.device(device).type != "cpu" or step_backend(cfg, device) != "eager":
        return "vectorized"
    if mode != "auto":
        return mode
    if model is None or step_flops is None or step_flops < CLIENT_ORDER_MIN_FLOPS:
        return "vectorized"
    convolutional = any(isinstance(m, nn.Conv2d) for m in model.modules())
    return "clients" if convolutional or (steps is not None and steps >= CLIENT_ORDER_MIN_STEPS) else "vectorized"


def step_flops(model: nn.Module, sample: torch.Tensor, batch: int) -> float:
    """Forward FLOPs of one client's step: one sample's (counted once per architecture and input shape) x batch."""
    key = (type(model).__name__, ParamLayout(model).size, tuple(sample.shape), sample.dtype)
    if key not in _FLOPS:
        from torch.utils.flop_counter import FlopCounterMode

        was_training = model.training
        try:
            model.eval()
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                model(sample.unsqueeze(0))
        finally:
            model.train(was_training)
        _FLOPS[key] = float(counter.get_total_flops())
    return _FLOPS[key] * batch


_FLOPS: dict[tuple, float] = {}


def execution_plan(cfg: LocalTraining, n_clients: int, device: torch.device | str, model: nn.Module | None = None,
                   sample: torch.Tensor | None = None, steps: float | None = None) -> dict[str, Any]:
    """What ``train_clients`` will do for this shape (benchmarks report it): with the model, one input
    ``sample`` and the mean ``steps`` per client, the order is the one the round takes. ``conv`` is the
    requested mode ("auto" is resolved per shape by ``conv_lowering_for``; see ``CONV_CHOICES``)."""
    workers = cpu_workers(cfg, n_clients, device)
    flops = step_flops(model, sample, cfg.batch_size) if model is not None and sample is not None else None
    order = client_order(cfg, device, model, steps, flops)
    memory = (memory_format_for(cfg, device, model, sample.shape) if order == "clients" and model is not None
              and sample is not None else "contiguous")
    return {"step": step_backend(cfg, device), "order": order,
            "workers": workers, "intra_op_threads": 1 if workers > 1 else _caller_threads(), "conv": conv_mode(cfg),
            "precision": check_precision(cfg.precision), "memory_format": memory}


def client_schedule(steps: torch.Tensor, workers: int) -> tuple[list[list[int]], list[int]]:
    """The per-client order's schedule of clients with ``steps`` live steps each (``[n]``): one list of
    clients per worker thread (longest first, dealt by ``balanced_groups``), then the tail, the last
    ``n mod workers`` clients by steps, trained one by one with all threads once the workers are done
    (N = 5 on 2 threads: 2 + 2 clients in parallel, then 1 on both, not 3 + 2)."""
    by_steps = torch.sort(steps, descending=True, stable=True).indices
    head = by_steps[:len(steps) - len(steps) % workers]  # one worker: every client
    tail = by_steps[len(head):]
    groups = [head[g].tolist() for g in balanced_groups(steps[head], workers)] if len(head) else []
    return [sorted(g, key=lambda c: -int(steps[c])) for g in groups], tail.tolist()


CONV_MODES = CONV_LOWERINGS + ("auto",)
CONV_CHOICES: dict[tuple, dict[str, Any]] = {}  # shape key -> {"lowering", "seconds": {lowering: s}}
_CONV_LOCK = threading.Lock()


def conv_mode(cfg: LocalTraining) -> str:
    mode = cfg.conv if cfg.conv is not None else os.environ.get("FEDLIB_CONV", "auto")
    if mode not in CONV_MODES:
        raise ValueError(f"LocalTraining.conv (or FEDLIB_CONV): must be one of {', '.join(CONV_MODES)} (got {mode!r})")
    return mode


def conv_lowering_for(model, layout, x, y, n, batch, bufs, cfg, autotune: bool | None = None) -> str:
    """The convolution lowering ``train_clients`` uses for this shape.

    "auto" is native on a CPU and with an extra loss; on CUDA (or with ``autotune=True``) it is
    the lowering whose captured step of these n clients on this batch size ran fastest, timed
    once per shape (``time_conv_lowerings``; the choice and its timings are in ``CONV_CHOICES``)."""
    mode = conv_mode(cfg)
    if mode != "auto":
        return mode
    if cfg.extra_loss is not None or not any(isinstance(m, Conv2d) for m in model.modules()):
        return "native"
    if not (autotune if autotune is not None else x.device.type == "cuda"):
        return "native"
    key = (type(model).__name__, layout.size, n, batch, tuple(x.shape[1:]), str(x.device),
           cfg.momentum, cfg.weight_decay, cfg.prox_mu, cfg.augment_fill, cfg.precision)
    with _CONV_LOCK:
        if key not in CONV_CHOICES:
            seconds = time_conv_lowerings(model, layout, x, y, n, batch, bufs, cfg)
            CONV_CHOICES[key] = {"lowering": min(CONV_LOWERINGS, key=seconds.__getitem__), "seconds": seconds}
        return CONV_CHOICES[key]["lowering"]


def conv_choices_for(model: nn.Module, device: torch.device | str) -> dict[str, dict[str, Any]]:
    """The lowerings chosen by timing for this architecture on this device, by training shape
    ("n clients x batch"), with their step times in ms (a run's provenance; empty when none was timed)."""
    name, size = type(model).__name__, ParamLayout(model).size
    return {f"{k[2]} x {k[3]}" + ("" if k[10] == "float32" else f" {k[10]}"): {"lowering": v["lowering"], "step_ms": {m: round(t * 1e3, 3) for m, t in v["seconds"].items()}}
            for k, v in list(CONV_CHOICES.items()) if k[0] == name and k[1] == size and k[5] == str(torch.device(device))}


def time_conv_lowerings(model, layout, x, y, n, batch, bufs, cfg, repeats: int = 3, clock=None) -> dict[str, float]:
    """Seconds of one captured training step of n clients under each lowering (the best of
    ``repeats`` after one warm-up step): a CUDA graph replay on CUDA, the same step run eagerly
    on its static tensors elsewhere. The steps run on scratch tensors; nothing of a run moves."""
    import time

    clock = clock or time.perf_counter
    device = x.device
    backend = "graph" if step_backend(cfg, device) == "graph" else "static"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
    index = torch.arange(n * batch, device=device).remainder(len(y)).view(n, batch)
    mask, active = torch.ones(n, batch, device=device), torch.ones(n, device=device)
    codes = None if cfg.augment_fill is None else torch.zeros(n, batch, dtype=torch.long, device=device)
    seconds = {}
    was_training = model.training
    model.train()
    try:
        for lowering in CONV_LOWERINGS:
            with conv_lowering(lowering):
                step = _StaticStep(backend, model, layout, cfg, n, batch, x, y, bufs)
                step.step(index, mask, active, codes)
                best = math.inf
                for _ in range(repeats):
                    sync(device)
                    t0 = clock()
                    step.step(index, mask, active, codes)
                    sync(device)
                    best = min(best, clock() - t0)
            seconds[lowering] = best
            del step
    finally:
        model.train(was_training)
    return seconds


def train_clients(
    model: nn.Module,
    start: torch.Tensor,
    buffers: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    batches: ClientBatches,
    cfg: LocalTraining,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Train N clients at once from ``start`` ([P] shared or [N, P]); returns the
    trained flat parameters ``[N, P]`` and buffers ``{name: [N, ...]}``."""
    layout = ParamLayout(model)
    batches = batches.first(cfg.max_steps)
    if (batches.codes is None) != (cfg.augment_fill is None):
        raise ValueError("augmentation: batches with codes need LocalTraining.augment_fill, and only they")
    n = batches.index.shape[1]
    start = start.detach()
    bufs = {k: (v.expand(n, *v.shape[1:]) if v.shape[0] == 1 else v).clone() for k, v in buffers.items()}
    workers = cpu_workers(cfg, n, start.device)
    chunk = min(cfg.chunk_size or n, math.ceil(n / workers))
    balance = balanced(cfg, start.device)
    on_cpu = start.device.type == "cpu"
    live = (batches.mask.sum(2) > 0).sum(0) if on_cpu else None  # live steps per client
    schedule = None
    if on_cpu and client_order(cfg, start.device, model, float(live.float().mean()),
                               step_flops(model, x[0], batches.index.shape[2]) if len(x) else None) == "clients":
        schedule = client_schedule(live, workers)
        groups = [torch.tensor([c]) for c in range(n)]
        chunk = 1
    elif balance and workers > 1 and not cfg.chunk_size:
        groups = balanced_groups(live, workers)  # threads get equal steps
        chunk = max(len(g) for g in groups)
    else:
        groups = [slice(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]  # memory-bounded chunks
    lowering = conv_lowering_for(model, layout, x, y, chunk, batches.index.shape[2],
                                 {k: v[:chunk] for k, v in bufs.items()}, cfg)

    def train_group(sl: slice, net: nn.Module):
        ctx = None if cfg.client_context is None else torch.utils._pytree.tree_map(
            lambda t: t[sl], cfg.client_context
        )
        chunk_start = start if start.dim() == 1 else start[sl].clone()
        chunk_cfg = replace(cfg, lr=cfg.lr[sl]) if torch.is_tensor(cfg.lr) else cfg
        with conv_lowering(lowering):  # set in the thread that trains (context variables stay per thread)
            return _train_chunk(net, layout, chunk_start, {k: v[sl] for k, v in bufs.items()},
                                x, y, batches.index[:, sl], batches.mask[:, sl], chunk_cfg, ctx,
                                None if batches.codes is None else batches.codes[:, sl], compact=balance,
                                alone=schedule is not None)

    was_training = model.training
    model.train()
    try:
        if schedule is not None:
            assigned, tail = schedule
            results = _in_worker_threads(model, groups, train_group, workers, assigned) if workers > 1 else [None] * n
            for c in (tail if workers > 1 else [c for group in assigned for c in group] + tail):  # all threads
                results[c] = train_group(groups[c], model)
        elif workers == 1:
            results = [train_group(sl, model) for sl in groups]
        else:
            results = _in_worker_threads(model, groups, train_group, workers)
    finally:
        model.train(was_training)
    if len(results) == 1:
        return results[0]
    order = torch.cat([torch.arange(n)[g] for g in groups])  # the clients in the order of the results
    flat = results[0][0].new_empty(n, results[0][0].shape[1])
    flat[order.to(flat.device)] = torch.cat([f for f, _ in results])
    out = {}
    for k in bufs:
        joined = torch.cat([b[k] for _, b in results])
        out[k] = torch.empty_like(joined)
        out[k][order.to(joined.device)] = joined
    return flat, out


def _switch(setting: bool | None, variable: str) -> bool:
    """``setting`` when set, else the environment ``variable`` (on or off, default on)."""
    if setting is not None:
        return bool(setting)
    value = os.environ.get(variable, "on")
    if value not in ("on", "off"):
        raise ValueError(f"{variable}: must be on or off (got {value!r})")
    return value == "on"


def balanced(cfg: LocalTraining, device: torch.device | str) -> bool:
    """Whether this CPU round skips finished clients and balances its worker threads (see ``LocalTraining.balance``)."""
    if torch.device(device).type != "cpu" or step_backend(cfg, device) != "eager":
        return False
    return _switch(cfg.balance, "FEDLIB_CPU_BALANCE")


def compacted_replay(cfg: LocalTraining, device: torch.device | str) -> bool:
    """Whether captured steps (CUDA graphs, inductor) replay only the clients with samples (see
    ``LocalTraining.balance``)."""
    return step_backend(cfg, device) != "eager" and _switch(cfg.balance, "FEDLIB_COMPACT")


REPLAY_BUCKETS = 4  # captured sizes per chunk: a quarter, a half, three quarters of its clients, all


def replay_rows(active: torch.Tensor, buckets: int = REPLAY_BUCKETS) -> torch.Tensor | None:
    """The rows a compacted replay trains for a step whose clients with samples are ``active`` ([n] bool,
    on the host): those clients, padded with clients without samples (which stay put) up to the next
    multiple of ceil(n / buckets), ascending; None when that is every row."""
    n = active.numel()
    quarter = math.ceil(n / buckets)
    size = min(n, math.ceil(max(1, int(active.sum())) / quarter) * quarter)
    if size >= n:
        return None
    idle = (~active).nonzero().squeeze(1)
    return torch.sort(torch.cat([active.nonzero().squeeze(1), idle[:size - int(active.sum())]])).values


def balanced_groups(steps: torch.Tensor, groups: int) -> list[torch.Tensor]:
    """Clients (their live steps ``[n]``) dealt into at most ``groups`` groups of nearly equal total steps:
    longest first, in a snake (0, 1, .., g-1, g-1, .., 0, 0, ..); each group's clients in ascending order."""
    order = torch.sort(steps, descending=True, stable=True).indices
    turn = torch.arange(len(order)) % (2 * groups)
    group = torch.where(turn < groups, turn, 2 * groups - 1 - turn)
    return [torch.sort(order[group == g]).values for g in range(min(groups, len(order)))]


_THREADS_LOCK = threading.Lock()
_THREADS_SAVED = 1  # torch's intra-op threads outside the worker sections
_SECTIONS = 0  # worker sections running now (several runs may train at once in one process)


def _caller_threads() -> int:
    """torch's intra-op threads as the caller set them, not the 1 used inside a worker section."""
    with _THREADS_LOCK:
        return _THREADS_SAVED if _SECTIONS else torch.get_num_threads()


def _enter_section():
    global _SECTIONS, _THREADS_SAVED
    with _THREADS_LOCK:
        if _SECTIONS == 0:
            _THREADS_SAVED = torch.get_num_threads()
            torch.set_num_threads(1)
        _SECTIONS += 1


def _leave_section():
    global _SECTIONS
    with _THREADS_LOCK:
        _SECTIONS -= 1
        if _SECTIONS == 0:
            torch.set_num_threads(_THREADS_SAVED)


def _in_worker_threads(model, groups, train_group, workers, assigned: list[list[int]] | None = None):
    """Client groups on ``workers`` threads, one intra-op thread each (torch ops release the GIL): worker w
    trains the groups ``assigned[w]`` (default: every workers-th group); the others' results stay None.

    functional_call swaps tensors into the module it is given, so every thread has its own copy."""
    models = [model] + [copy.deepcopy(model) for _ in range(workers - 1)]
    results: list = [None] * len(groups)
    errors: list[BaseException] = []
    assigned = assigned or [list(range(w, len(groups), workers)) for w in range(workers)]

    def work(w: int):
        torch.set_num_threads(1)
        try:
            for g in assigned[w]:
                results[g] = train_group(groups[g], models[w])
        except BaseException as err:  # re-raised in the calling thread
            errors.append(err)

    _enter_section()
    try:
        pool = [threading.Thread(target=work, args=(w,), name=f"fedlib-worker-{w}") for w in range(workers)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        _leave_section()
    if errors:
        raise errors[0]
    return results


def _train_chunk(model, layout, start, bufs, x, y, index, mask, cfg, context, codes=None, compact=False, alone=False):
    """SGD steps for a chunk of n clients from ``start`` ([P] shared or [n, P]).

    While every client still holds the shared start (the first step of a round) the
    parameters enter the vmapped step unbatched, so the forward pass and the input
    gradients are single large matmuls; only the weight gradients are per client.
    The later steps run eagerly or, per ``step_backend``, replay a captured step. With ``compact``
    (eager steps on a CPU) a later step trains only its clients with samples; the others stay put
    exactly as they do under the mask. ``alone`` (the per-client order: a chunk of one client) takes the
    eager steps by plain autograd (``_one_client_step``).
    """
    n = index.shape[1]
    loss_fn = _per_client_loss(model, cfg)
    shared = start.dim() == 1
    params = layout.unflatten(start)  # per-client views are updated in place
    anchor = layout.unflatten(start.clone()) if cfg.prox_mu else None
    anchor_dim = None if (anchor is None or shared) else 0
    ctx_dim = None if context is None else 0
    steppers = {}
    flat, velocity = (None if shared else start), None
    step_active = (mask.sum(2) > 0).to(mask.dtype)  # [steps, n]
    live_steps = step_active.any(1).tolist()  # one host sync per round, not one per step
    live_counts = step_active.sum(1).tolist() if compact else None
    backend = step_backend(cfg, start.device)
    replay, replay_at = None, None  # the captured step in use and its rows (None: all)
    last = 0  # the last live step a replay ran
    compact_replay = backend != "eager" and compacted_replay(cfg, start.device)
    active_host = step_active.bool().cpu() if compact_replay else None  # the same host sync, once per round
    row_lr = torch.is_tensor(cfg.lr)  # one learning rate per client: the step is on * lr_i (exact, on in {0, 1})
    lr_rows = cfg.lr.to(start.device, start.dtype) if row_lr else None
    fill = None if codes is None else torch.tensor(cfg.augment_fill, dtype=x.dtype, device=x.device)
    channels_last = alone and n == 1 and memory_format_for(cfg, start.device, model, x.shape[1:]) == "channels_last"
    with torch.no_grad():
        for s in range(index.shape[0]):
            if not live_steps[s]:
                continue
            mb, active = mask[s], step_active[s]
            scale, value = (active * lr_rows, -1.0) if row_lr else (active, -cfg.lr)
            if backend != "eager" and flat is not None:
                same = compact_replay and replay is not None and torch.equal(active_host[s], active_host[last])
                rows = replay_at if same else (replay_rows(active_host[s]) if compact_replay else None)
                last = s  # the previous live step (its clients decide whether the rows change)
                if replay is None or not _same_rows(rows, replay_at):
                    if replay is not None:
                        velocity = replay.store(flat, bufs, velocity, replay_at)
                    replay_at = rows
                    size = n if rows is None else len(rows)
                    replay = _captured_step(backend, model, layout, cfg, size, index.shape[2], x, y,
                                            {k: v[:size] for k, v in bufs.items()})
                    replay.load(flat, bufs, velocity, anchor, start if anchor_dim is None else None, cfg.lr, rows)
                    at = None if rows is None else rows.to(index.device)
                if at is None:
                    replay.step(index[s], mb, active, None if codes is None else codes[s])
                else:
                    replay.step(index[s][at], mb[at], active[at], None if codes is None else codes[s][at])
                continue
            if compact and not shared and live_counts[s] < n:
                velocity = _compacted_step(steppers, loss_fn, params, bufs, anchor, anchor_dim, velocity, context,
                                           x, y, index[s], mb, codes, s, fill, active, lr_rows, cfg)
                continue
            xb, yb = x[index[s]], y[index[s]]
            if codes is not None:
                xb = crop_flip(xb, codes[s], fill)
            dims = (None if shared else 0, 0, anchor_dim, 0, 0, 0, ctx_dim)
            if dims not in steppers:
                steppers[dims] = (_one_client_step(loss_fn, dims, channels_last) if alone and n == 1 else
                                  vmap(grad(loss_fn, has_aux=True), in_dims=dims))
            with torch.enable_grad():
                grads, bufs = steppers[dims](params, bufs, anchor, xb, yb, mb, context)
            if shared:  # materialize the population from the shared start
                flat = torch.empty(n, layout.size, dtype=start.dtype, device=start.device)
                per_client = layout.unflatten(flat)
            for k, p in params.items():
                on = active.view(n, *([1] * p.dim())) if shared else active.view(n, *([1] * (p.dim() - 1)))
                g = grads[k]
                if cfg.weight_decay:
                    g.add_(p, alpha=cfg.weight_decay)
                if cfg.momentum:  # torch.optim.SGD: v <- m v + g, first step v = g
                    if velocity is None or k not in velocity:
                        velocity = velocity or {}
                        velocity[k] = on * g
                    else:
                        velocity[k].addcmul_(on, g + (cfg.momentum - 1.0) * velocity[k])
                    g = velocity[k]
                step = scale.view_as(on)
                if shared:
                    torch.addcmul(p, step, g, value=value, out=per_client[k])
                else:
                    p.addcmul_(step, g, value=value)  # clients without samples this step stay put
            if shared:
                params, shared = per_client, False
    if replay is not None:
        replay.store(flat, bufs, velocity, replay_at)
    if flat is None:  # no client had a sample
        flat = start.expand(n, -1).clone()
    # MaskedBatchNorm left the statistics of empty steps unchanged
    return flat, {k: v.detach() for k, v in bufs.items()}


def _one_client_step(loss_fn, in_dims, channels_last: bool = False):
    """``vmap(grad(loss_fn, has_aux=True), in_dims)`` for a chunk of one client, by plain autograd: the
    same gradients and buffers, without torch.func's per-op transform (1.2x on a small MLP's step). With
    ``channels_last`` the client's batch enters in channels-last memory format (its convolutions then run
    oneDNN's NHWC kernels; the numbers agree up to float summation order)."""
    one = lambda t: t[0]  # noqa: E731

    def step(params, *args):
        args = [a if d is None or a is None else torch.utils._pytree.tree_map(one, a)
                for a, d in zip(args, in_dims[1:])]
        if channels_last and args[2].dim() == 4:  # (buffers, anchor, xb, yb, mb, context)
            args[2] = args[2].contiguous(memory_format=torch.channels_last)
        leaves = {k: (p if in_dims[0] is None else p[0]).detach().requires_grad_() for k, p in params.items()}
        loss, buffers = loss_fn(leaves, *args)
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True, materialize_grads=True)
        return ({k: g.unsqueeze(0) for k, g in zip(leaves, grads)},
                {k: b.detach().unsqueeze(0) for k, b in buffers.items()})

    return step


def _compacted_step(steppers, loss_fn, params, bufs, anchor, anchor_dim, velocity, context, x, y, index, mb,
                    codes, s, fill, active, lr_rows, cfg):
    """One eager step of only the clients with samples (``active``), written back into the population:
    the same per-client arithmetic as the masked step, whose inactive rows stay put. Returns the
    momentum buffers (made here on the round's first momentum step, zero for the clients left out)."""
    rows = active.nonzero().squeeze(1)
    pick = lambda t: t[rows]  # noqa: E731
    sub = {k: p[rows] for k, p in params.items()}
    index_rows = index[rows]
    xb, yb = x[index_rows], y[index_rows]
    if codes is not None:
        xb = crop_flip(xb, codes[s][rows], fill)
    sub_anchor = anchor if anchor_dim is None else {k: a[rows] for k, a in anchor.items()}
    sub_context = None if context is None else torch.utils._pytree.tree_map(pick, context)
    dims = (0, 0, anchor_dim, 0, 0, 0, None if context is None else 0)
    if dims not in steppers:
        steppers[dims] = vmap(grad(loss_fn, has_aux=True), in_dims=dims)
    with torch.enable_grad():
        grads, new_bufs = steppers[dims](sub, {k: v[rows] for k, v in bufs.items()}, sub_anchor, xb, yb, mb[rows],
                                          sub_context)
    for k, v in new_bufs.items():
        bufs[k].index_copy_(0, rows, v)
    lr = lr_rows[rows] if lr_rows is not None else None
    for k, p in params.items():
        g = grads[k]
        if cfg.weight_decay:
            g.add_(sub[k], alpha=cfg.weight_decay)
        if cfg.momentum:  # as the masked step: v <- m v + g for these clients, first step v = g
            if velocity is None or k not in velocity:
                velocity = velocity or {}
                velocity[k] = torch.zeros_like(p).index_copy_(0, rows, g)
            else:
                v = velocity[k][rows]
                velocity[k].index_copy_(0, rows, v.add_(g + (cfg.momentum - 1.0) * v))
            g = velocity[k][rows]
        updated = (torch.add(sub[k], g, alpha=-cfg.lr) if lr is None else
                   torch.addcmul(sub[k], lr.view(-1, *([1] * (g.dim() - 1))), g, value=-1.0))
        p.index_copy_(0, rows, updated)
    return velocity


# ----------------------------------------------------------------------------- captured steps


class _StaticStep:
    """One per-client SGD step of a fixed shape on static tensors, captured once, replayed.

    Every input lives at a fixed address (parameters ``[n, P]``, buffers, momentum, the prox
    anchor, this step's sample indices, mask and active flags, the learning rate), so a
    captured program (a CUDA graph, or an inductor-compiled function) can be replayed each
    step after copying the step's indices in. The arithmetic is the eager step's (the
    learning rate enters as ``on * lr`` instead of ``-lr`` with ``on`` in {0, 1}: exact).
    Backend "static" runs the same function eagerly on the static tensors (tests on CPU)."""

    def __init__(self, backend, model, layout, cfg, n, batch, x, y, bufs):
        dev = x.device
        self.backend, self.model, self.layout, self.n = backend, model, layout, n
        self.x, self.y = x, y
        self.momentum, self.weight_decay, self.prox_mu = cfg.momentum, cfg.weight_decay, cfg.prox_mu
        self.flat = torch.zeros(n, layout.size, device=dev)
        self.params = layout.unflatten(self.flat)
        self.bufs = {k: torch.zeros_like(v) for k, v in bufs.items()}
        self.velocity = {k: torch.zeros_like(p) for k, p in self.params.items()} if cfg.momentum else None
        self.anchor_flat = torch.zeros(n, layout.size, device=dev) if cfg.prox_mu else None
        self.anchor = layout.unflatten(self.anchor_flat) if cfg.prox_mu else None
        self.index = torch.zeros(n, batch, dtype=torch.long, device=dev)
        self.mask = torch.zeros(n, batch, device=dev)
        self.active = torch.zeros(n, device=dev)
        self.lr = torch.zeros(n, device=dev)  # per client (packed runs may differ)
        self.fill = None if cfg.augment_fill is None else torch.tensor(cfg.augment_fill, dtype=x.dtype, device=dev)
        self.codes = None if cfg.augment_fill is None else torch.zeros(n, batch, dtype=torch.long, device=dev)
        loss_fn = _per_client_loss(model, LocalTraining(prox_mu=cfg.prox_mu, precision=cfg.precision))
        self.stepper = vmap(grad(loss_fn, has_aux=True), in_dims=(0, 0, 0 if cfg.prox_mu else None, 0, 0, 0, None))
        self.run = self._capture()

    def _step(self):
        with torch.no_grad():
            xb, yb = self.x[self.index], self.y[self.index]
            if self.codes is not None:
                xb = crop_flip(xb, self.codes, self.fill)
            with torch.enable_grad():
                grads, bufs = self.stepper(self.params, self.bufs, self.anchor, xb, yb, self.mask, None)
            for k, b in bufs.items():
                self.bufs[k].copy_(b)
            on_lr = self.active * self.lr
            for k, p in self.params.items():
                on = self.active.view(self.n, *([1] * (p.dim() - 1)))
                g = grads[k]
                if self.weight_decay:
                    g.add_(p, alpha=self.weight_decay)
                if self.momentum:
                    v = self.velocity[k]
                    v.addcmul_(on, g + (self.momentum - 1.0) * v)
                    g = v
                p.addcmul_(on_lr.view_as(on), g, value=-1.0)

    def _capture(self):
        if self.backend == "static":
            return self._step
        if self.backend == "inductor":
            return torch.compile(self._step, dynamic=False)
        if self.backend != "graph":
            raise ValueError(f"unknown step backend {self.backend!r}")
        stream = torch.cuda.Stream(self.x.device)  # warm-up off the default stream, as CUDA graphs need
        stream.wait_stream(torch.cuda.current_stream(self.x.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream(self.x.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step()
        self.graph = graph
        return graph.replay

    def load(self, flat, bufs, velocity, anchor, shared_anchor, lr, rows=None):
        """Copy a chunk's state in: all its clients, or its ``rows`` (a compacted replay)."""
        pick = (lambda t: t) if rows is None else (lambda t: t[rows.to(t.device)])  # noqa: E731
        self.flat.copy_(pick(flat))
        for k, b in bufs.items():
            self.bufs[k].copy_(pick(b))
        if self.velocity is not None:
            for k, v in self.velocity.items():
                v.copy_(pick(velocity[k])) if velocity is not None and k in velocity else v.zero_()
        if self.anchor_flat is not None:
            self.anchor_flat.copy_(pick(self.layout.flatten(anchor, (len(flat),))) if shared_anchor is None
                                   else shared_anchor.expand_as(self.anchor_flat))
        lr = torch.as_tensor(lr, dtype=self.lr.dtype).to(self.lr.device)
        self.lr.copy_(pick(lr) if lr.dim() else lr.expand(self.n))

    def store(self, flat, bufs, velocity, rows=None):
        """Write the replayed state back into the chunk's tensors (all clients, or ``rows``); returns the
        momentum buffers, made here (zero for clients never replayed) when the chunk had none yet."""
        if self.velocity is not None and velocity is None:
            velocity = {k: flat.new_zeros(len(flat), *v.shape[1:]) for k, v in self.velocity.items()}
        if rows is None:
            flat.copy_(self.flat)
            for k, b in bufs.items():
                b.copy_(self.bufs[k])
            for k, v in (self.velocity or {}).items():
                velocity[k].copy_(v)
            return velocity
        at = rows.to(flat.device)
        flat.index_copy_(0, at, self.flat)
        for k, b in bufs.items():
            b.index_copy_(0, at, self.bufs[k])
        for k, v in (self.velocity or {}).items():
            velocity[k].index_copy_(0, at, v)
        return velocity

    def step(self, index, mask, active, codes=None):
        if self.codes is not None:
            self.codes.copy_(codes)
        self.index.copy_(index)
        self.mask.copy_(mask)
        self.active.copy_(active)
        self.run()



def _same_rows(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


_CAPTURED: OrderedDict = OrderedDict()  # shape key -> _StaticStep, least recently used first
_CAPTURED_LOCK = threading.Lock()
CAPTURED_KEEP = 2 * REPLAY_BUCKETS  # every size of a compacted chunk, for two chunk shapes


def _captured_step(backend, model, layout, cfg, n, batch, x, y, bufs) -> _StaticStep:
    """The captured step for this shape, made on first use (the model is kept alive by the
    entry, so its id stays unique; x and y are keyed by address: a new tensor at the same
    address with the same shape is read correctly by the replay)."""
    key = (backend, id(model), n, batch, str(x.device),
           x.data_ptr(), tuple(x.shape), x.dtype, y.data_ptr(), tuple(y.shape),
           tuple((k, tuple(v.shape), v.dtype) for k, v in bufs.items()),
           cfg.momentum, cfg.weight_decay, cfg.prox_mu, cfg.augment_fill, cfg.precision, current_conv_lowering())
    with _CAPTURED_LOCK:
        entry = _CAPTURED.pop(key, None)
        if entry is None:
            entry = _StaticStep(backend, model, layout, cfg, n, batch, x, y, bufs)
        _CAPTURED[key] = entry
        while len(_CAPTURED) > CAPTURED_KEEP:
            _CAPTURED.popitem(last=False)
    return entry


_WARM: set = set()


def warm_up(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """One tiny vectorized step (2 clients, 2 samples) so a run's first round is not charged
    for one-time costs; returns its seconds (0.0 when this architecture was warmed already).

    Profiled on a 2-core CPU: ~96 % of the first step's extra time is Python imports that
    torch.func.grad triggers on first use (torch._dynamo and with it sympy, ~870 modules);
    the rest is the first dispatch of each op under vmap/grad."""
    import time

    key = (type(model), ParamLayout(model).size, str(x.device))
    if key in _WARM:
        return 0.0
    t0 = time.perf_counter()
    layout = ParamLayout(model)
    n = min(2, len(y))
    index = torch.arange(n, device=x.device).view(1, 1, n).expand(1, 2, n).contiguous()
    batches = ClientBatches(index, torch.ones(1, 2, n, device=x.device))
    buffers = {k: v.unsqueeze(0) for k, v in layout.buffers_of(model).items()}
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # dropout in the warm-up must not shift the run's RNG
        train_clients(model, layout.flat_of(model), buffers, x, y, batches,
                      LocalTraining(batch_size=n, compile="off", workers=1))
    _WARM.add(key)
    return time.perf_counter() - t0


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
