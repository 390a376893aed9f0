"""Local training of a population: every client's SGD steps at once (``train_clients``).

Local training of all clients runs at once with ``torch.func`` (functional_call + vmap + grad): every
client draws its own shuffled mini-batches, shorter clients are padded and masked, and a client
with no samples left in a step is not updated.

How the steps run is chosen per shape (``fedlib.plans.execution_plan``): on CUDA the step after a round's
first one is captured once per shape as a CUDA graph and replayed (``LocalTraining.compile``;
the eager step is the oracle, the replay is bit-identical to it); on a CPU the clients are
split into one group per intra-op thread, each group trained by its own thread with one
intra-op thread (``LocalTraining.workers``), either as one vmapped call or one client at a time
by plain autograd, whichever ``client_order``'s rule (from ``benchmarks/cpu_order.py``) says is
faster for the model and the steps per client (``LocalTraining.order``). Convolutions run as vmap's
grouped convolution or as unfold + one matmul per client (``LocalTraining.conv``): native on a CPU,
where it measured 2x faster; on CUDA the lowering whose captured step is faster, timed once per shape
(``conv_lowering_for``) and recorded in the run's ``meta.conv_lowerings``. Compacted replays train only
the clients with samples left (``replay_rows``). ``warm_up`` pays torch.func's one-time costs before a
run's first round.

``fedlib.testing.train_clients_loop`` is the plain per-client implementation, kept only as the test
oracle and benchmark baseline; it consumes exactly the same batches.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from . import plans  # plans.step_backend: one name to patch for every choice a step depends on
from .layers import CONV_LOWERINGS, Conv2d, conv_lowering, current_conv_lowering, sample_mask
from .plans import (_in_worker_threads, balanced, balanced_groups, client_order, client_schedule, compacted_replay,
                    conv_mode, cpu_workers, step_flops)
from .population import (ClientBatches, LocalTraining, ParamLayout, autocast, check_precision, crop_flip,
                         memory_format_for)

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


CONV_CHOICES: dict[tuple, dict[str, Any]] = {}  # shape key -> {"lowering", "seconds": {lowering: s}}
_CONV_LOCK = threading.Lock()

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
    clock = clock or time.perf_counter
    device = x.device
    backend = "graph" if plans.step_backend(cfg, device) == "graph" else "static"
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
    backend = plans.step_backend(cfg, start.device)
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


