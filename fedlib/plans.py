"""How local training runs, chosen per shape: the execution plan of ``fedlib.training.train_clients``.

The step backend (eager, a captured CUDA graph, torch.compile; ``step_backend``), the CPU worker
threads and their client groups (``cpu_workers``, ``client_schedule``, the worker sections), the
client order (one vmapped call or one client at a time; ``client_order`` and its FLOP rule), the
convolution mode, balancing and compaction switches, all summed up by ``execution_plan``. These
choices change how fast a round runs, not what it computes beyond float summation order.
"""

from __future__ import annotations

import copy
import os
import threading
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .layers import CONV_LOWERINGS
from .population import LocalTraining, ParamLayout, check_precision, memory_format_for

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


def conv_mode(cfg: LocalTraining) -> str:
    mode = cfg.conv if cfg.conv is not None else os.environ.get("FEDLIB_CONV", "auto")
    if mode not in CONV_MODES:
        raise ValueError(f"LocalTraining.conv (or FEDLIB_CONV): must be one of {', '.join(CONV_MODES)} (got {mode!r})")
    return mode


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


