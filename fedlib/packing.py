"""Packed runs: many runs trained as one population.

A run's round loop (``fedlib.engine.rounds``) yields every local training and default evaluation as
a request. :func:`execute_packed` advances many runs side by side and answers their pending requests
together: the training requests that can share one vectorized call (:func:`train_signature`: same
architecture, sample shape, batch size, optimiser constants and local objective) become one
``train_clients`` call over all their clients, and the evaluations on one shared test set become one
batched forward. Everything else stays each run's own: its split, seed streams, method hooks and
client state, screening, server step and history.

What may differ row by row inside one call: the start model (each run's global model or its
clients' own), the learning rate (each run's schedule), the proximal anchor (the start), the client
sizes (masks) and the number of steps (shorter runs are padded with masked steps, which change
nothing), and the local objective's per-client context (MOON's and Ditto's anchors).

Equal numbers. A packed run makes the same selections and aggregation weights as the same run
alone, and its parameters agree to float rounding (about 1e-7 relative per round): packing changes
how the per-client arithmetic is batched (a first step from a shared start is one large matmul
alone, a batched one in a pack; threads take other row groups), not what is computed
(``tests/core/test_packing.py`` checks every registered method). Packing never mixes a run whose result
would change: requests with different optimiser constants, objectives or shapes are never merged.
"""

from __future__ import annotations

import math

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from .engine import EvalRequest, TrainRequest, rounds
from .federation import Prepared
from .population import ClientBatches, Evaluation, ParamLayout, evaluate
from .training import train_clients
from .results import RunResult

__all__ = ["execute_packed", "train_together", "evaluate_together", "pack_signature", "make_packs",
           "rows_per_pack", "bytes_per_row"]


# ----------------------------------------------------------------------------- which runs pack


def pack_signature(config) -> tuple:
    """Runs with equal signatures pack well: the same data, model, batch size, local epochs, rounds,
    device, augmentation and optimiser constants, so their requests share one call in every round
    (others still pack correctly, but their rounds drift apart and fewer requests meet; runs with other
    augmentation, momentum or weight decay never share a training call (``train_signature``): on the
    H100 a pack of 3 such CIFAR-10 runs took 62.6 s per run, a pack of 2 mergeable ones 43.2 s). Runs of
    another ``precision`` (float32, bfloat16 autocast) are never packed together."""
    return (config.dataset, config.data_root, config.fraction, config.model, config.batch_size,
            config.local_epochs, config.rounds, config.device, config.test_samples, config.augment,
            config.momentum, config.weight_decay, getattr(config, "precision", "float32"))


def make_packs(configs: Sequence, max_rows: int | None = None) -> list[list[int]]:
    """Indices of ``configs`` grouped into packs: equal :func:`pack_signature`, at most ``max_rows``
    client rows per round (clients per round x runs; a run larger than that is a pack of its own),
    in the order of their first member."""
    groups: dict[tuple, list[list[int]]] = {}
    rows: dict[tuple, int] = {}
    for i, config in enumerate(configs):
        sig = pack_signature(config)
        per_round = config.per_round
        if sig not in groups or (max_rows is not None and rows[sig] + per_round > max_rows):
            groups.setdefault(sig, []).append([])
            rows[sig] = 0
        groups[sig][-1].append(i)
        rows[sig] += per_round
    packs = [pack for packs in groups.values() for pack in packs]
    return sorted(packs, key=lambda pack: pack[0])


def bytes_per_row(model: torch.nn.Module, sample_shape: Sequence[int], batch_size: int) -> int:
    """Device bytes one client row of a packed step needs: its parameters, gradients, momentum and
    start copies (float32, about 6 x P) plus its activations on one batch (2 x the elements the
    forward pass creates, for the backward pass), measured with forward hooks on one sample. A
    convolution also counts its unfolded columns twice (the matmul lowering's im2col and its copy)."""
    elements = [0]

    def count(module, _inputs, output):
        if torch.is_tensor(output):
            elements[0] += output.numel()
            if isinstance(module, torch.nn.Conv2d):
                columns = output.numel() // module.out_channels * module.in_channels * math.prod(module.kernel_size)
                elements[0] += 2 * columns

    hooks = [m.register_forward_hook(count) for m in model.modules() if not list(m.children())]
    try:
        was = model.training
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, *sample_shape, device=next(model.parameters()).device))
        model.train(was)
    finally:
        for h in hooks:
            h.remove()
    params = ParamLayout(model).size
    return 4 * (6 * params + 2 * elements[0] * batch_size)


def rows_per_pack(model: torch.nn.Module, sample_shape: Sequence[int], batch_size: int,
                  device: torch.device | str, memory_fraction: float = 0.5, cpu_rows: int = 256) -> int:
    """How many client rows one packed step may hold: on CUDA, ``memory_fraction`` of the free device
    memory over :func:`bytes_per_row`; on a CPU ``cpu_rows`` (arithmetic-bound: packing there saves
    the per-call overhead, not more)."""
    device = torch.device(device)
    if device.type != "cuda":
        return cpu_rows
    free, _total = torch.cuda.mem_get_info(device)
    return max(1, int(memory_fraction * free // bytes_per_row(model, sample_shape, batch_size)))


# ----------------------------------------------------------------------------- answering requests together


def _model_signature(model: torch.nn.Module) -> tuple:
    return (type(model).__name__, tuple((n, tuple(p.shape)) for n, p in model.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in model.named_buffers()))


def train_signature(request: TrainRequest) -> tuple:
    """Requests with equal signatures are trained in one call (see the module docstring)."""
    t = request.training
    return ("train", _model_signature(request.model), tuple(request.x.shape[1:]), request.x.dtype,
            tuple(request.y.shape[1:]), request.y.dtype, str(request.x.device), request.batches.index.shape[2],
            t.momentum, t.weight_decay, t.prox_mu, t.augment_fill, t.compile, t.workers, t.conv, t.extra_loss_inputs,
            t.precision, t.memory_format,
            None if t.extra_loss is None else request.loss_key, t.client_context is None)


def eval_signature(request: EvalRequest) -> tuple:
    """Evaluations on the same test tensors of the same architecture are one batched forward."""
    return ("eval", _model_signature(request.model), id(request.x), id(request.y), request.n_classes)


class _Pools:
    """The sample pools of a pack: requests on the same tensors share them (the dataset's training
    tensor, ``fedlib.federation.on_device``); others are concatenated once and kept."""

    def __init__(self):
        self._joined: dict[tuple, tuple[list, torch.Tensor, torch.Tensor, list[int]]] = {}

    def join(self, requests: Sequence[TrainRequest]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(x, y, offset of each request's indices)."""
        distinct: dict[tuple[int, int], int] = {}
        for r in requests:
            distinct.setdefault((id(r.x), id(r.y)), len(distinct))
        if len(distinct) == 1:
            return requests[0].x, requests[0].y, [0] * len(requests)
        key = tuple(distinct)
        hit = self._joined.get(key)
        if hit is None:
            firsts = {}
            for r in requests:
                firsts.setdefault((id(r.x), id(r.y)), r)
            members = list(firsts.values())
            starts = [0]
            for r in members[:-1]:
                starts.append(starts[-1] + len(r.x))
            # the members are kept with the joined tensors, so their ids cannot be reused meanwhile
            hit = (members, torch.cat([r.x for r in members]), torch.cat([r.y for r in members]), starts)
            if len(self._joined) > 8:
                self._joined.clear()
            self._joined[key] = hit
        _, x, y, starts = hit
        return x, y, [starts[distinct[(id(r.x), id(r.y))]] for r in requests]


def _rows_of(tensor: torch.Tensor, n: int) -> torch.Tensor:
    return tensor.expand(n, *tensor.shape[1:]) if tensor.shape[0] == 1 else tensor


def train_together(requests: Sequence[TrainRequest], pools: _Pools | None = None) -> list[tuple]:
    """Answer training requests of equal :func:`train_signature` with one ``train_clients`` call:
    their clients stacked as rows, the shorter ones padded with masked steps."""
    if len(requests) == 1:
        return [requests[0].answer()]
    pools = pools or _Pools()
    x, y, offsets = pools.join(requests)
    sizes = [r.rows for r in requests]
    batches = []
    for r, offset in zip(requests, offsets):
        b = r.batches.first(r.training.max_steps)
        batches.append(b if offset == 0 else ClientBatches(b.index + offset, b.mask, b.codes))
    steps = max(b.steps for b in batches)
    index = torch.cat([F.pad(b.index, (0, 0, 0, 0, 0, steps - b.steps)) for b in batches], dim=1)
    mask = torch.cat([F.pad(b.mask, (0, 0, 0, 0, 0, steps - b.steps)) for b in batches], dim=1)
    codes = None if batches[0].codes is None else torch.cat(  # equal signatures: all have codes or none
        [F.pad(b.codes, (0, 0, 0, 0, 0, steps - b.steps)) for b in batches], dim=1)
    start = torch.cat([r.start.unsqueeze(0).expand(n, -1) if r.start.dim() == 1 else r.start
                       for r, n in zip(requests, sizes)])
    names = list(requests[0].buffers)
    buffers = {k: torch.cat([_rows_of(r.buffers[k], n) for r, n in zip(requests, sizes)]) for k in names}
    lrs = [r.training.lr for r in requests]
    if all(not torch.is_tensor(lr) for lr in lrs) and len(set(lrs)) == 1:
        lr = lrs[0]
    else:
        lr = torch.cat([torch.as_tensor(lr, dtype=torch.float32).reshape(-1).expand(n)
                        for lr, n in zip(lrs, sizes)]).to(start.device)
    context = None
    if requests[0].training.client_context is not None:
        context = torch.utils._pytree.tree_map(lambda *parts: torch.cat(parts),
                                               *[r.training.client_context for r in requests])
    chunks = [r.training.chunk_size for r in requests if r.training.chunk_size]
    training = replace(requests[0].training, lr=lr, client_context=context, max_steps=None,
                       chunk_size=min(chunks) if chunks else None)
    flat, bufs = train_clients(requests[0].model, start, buffers, x, y, ClientBatches(index, mask, codes), training)
    out, lo = [], 0
    for n in sizes:
        out.append((flat[lo:lo + n], {k: v[lo:lo + n] for k, v in bufs.items()}))
        lo += n
    return out


def evaluate_together(requests: Sequence[EvalRequest]) -> list[Evaluation]:
    """Answer evaluations on one test set with one batched forward of all the models."""
    if len(requests) == 1:
        return [requests[0].answer()]
    first = requests[0]
    flat = torch.cat([r.flat for r in requests])
    buffers = {k: torch.cat([r.buffers[k] for r in requests]) for k in first.buffers}
    ev = evaluate(first.model, flat, buffers, first.x, first.y, first.n_classes)
    return [Evaluation(ev.confusion[i:i + 1], ev.loss[i:i + 1]) for i in range(len(requests))]


# On a CPU, merged training pays off for models without convolutions only: benchmarks/packed.py measured
# packed / separate 1.12-1.27x for the MLP at packs of 5-75, but 0.58-0.82x for the CNN and LeNet-5 at
# packs of 25-75 (results/packed_cpu-2core.json): a convolution from one run's shared start is one large
# convolution alone and a grouped one in a pack. So on a CPU such requests are answered one by one
# ("auto"); "always" merges them anyway (the tests use it to check the merged path GPUs take).
MERGE_ON_CPU = "auto"


def _merges(request: TrainRequest) -> bool:
    """Whether training requests like this one are merged into one call (see ``MERGE_ON_CPU``)."""
    if request.x.device.type != "cpu" or MERGE_ON_CPU == "always":
        return True
    return not any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in request.model.modules())


def answer_together(requests: Sequence[TrainRequest | EvalRequest], pools: _Pools | None = None) -> list:
    """Answers to a mixed list of requests, grouping those that can share a call."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        if isinstance(r, TrainRequest):
            sig = train_signature(r) if _merges(r) else ("train", "alone", i)
        else:
            sig = eval_signature(r)
        groups.setdefault(sig, []).append(i)
    answers: list[Any] = [None] * len(requests)
    for sig, members in groups.items():
        together = train_together if sig[0] == "train" else evaluate_together
        args = (pools,) if sig[0] == "train" else ()
        for i, answer in zip(members, together([requests[i] for i in members], *args)):
            answers[i] = answer
    return answers


# ----------------------------------------------------------------------------- running a pack


def execute_packed(prepared: Sequence[Prepared], progress: bool = False,
                   on_done: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
    """Run several prepared federations as one population (see the module docstring); returns their
    results in order. ``on_done(i, result)`` is called as each run finishes (a run that stops early
    finishes early). A pack of one is exactly ``fedlib.engine.execute``."""
    n = len(prepared)
    t0 = time.perf_counter()
    methods = [p.config.method.name for p in prepared]  # the pack's mix: what its one wall time paid for
    loops = [rounds(p, False, meta={"pack": {"size": n, "index": i, "methods": methods}}) for i, p in enumerate(prepared)]
    results: list[RunResult | None] = [None] * n
    pending: dict[int, Any] = {}

    def advance(i: int, answer: Any = None, first: bool = False) -> None:
        try:
            pending[i] = next(loops[i]) if first else loops[i].send(answer)
        except StopIteration as done:
            pending.pop(i, None)
            results[i] = done.value
            if on_done is not None:
                on_done(i, done.value)

    for i in range(n):
        advance(i, first=True)
    bar = None
    if progress:
        # lazy: tqdm.auto loads ipywidgets in a notebook; only progress bars need it
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc=f"pack of {n} runs", unit="run", leave=False)
    pools = _Pools()
    while pending:
        order = sorted(pending)
        answers = answer_together([pending[i] for i in order], pools)
        for i, answer in zip(order, answers):
            advance(i, answer)
        if bar is not None:
            bar.n = sum(r is not None for r in results)
            bar.set_postfix(elapsed=f"{time.perf_counter() - t0:.0f}s")
            bar.refresh()
    if bar is not None:
        bar.close()
    return results  # type: ignore[return-value]
