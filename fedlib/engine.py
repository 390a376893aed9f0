"""The engine: the one round loop (plan -> local (main pass, then any local phases) -> server -> evaluate).

Methods supply only their hooks (``fedlib.methods``). Local training of the selected clients
is one call into the vectorized population engine per round (``fedlib.population``).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Generator

import numpy as np
import torch

from .federation import Prepared
from .methods import ClientData, ClientUpdates, DistillationProtocol, Federation, RoundState, TestSet
from .observers import observers_for
from .population import ClientBatches, LocalTraining, ParamLayout, aggregate, black_pixel, evaluate, make_client_batches
from .training import conv_choices_for, train_clients, warm_up
from .results import RunResult, _provenance, _strict
from .screening import screen_updates

__all__ = ["execute", "rounds", "TrainRequest", "EvalRequest"]


@dataclass
class TrainRequest:
    """What a run's round loop asks the trainer for: ``train_clients(model, start, buffers, x, y,
    batches, training)``. The loop yields it and resumes with the trained ``(flat, buffers)``;
    :func:`execute` answers it alone, ``fedlib.packing`` together with other runs' requests."""

    model: torch.nn.Module
    start: torch.Tensor  # [P] shared or [n, P]
    buffers: dict[str, torch.Tensor]  # {name: [1 or n, ...]}
    x: torch.Tensor
    y: torch.Tensor
    batches: ClientBatches
    training: LocalTraining
    loss_key: tuple | None = None  # which local objective (method, hyper-parameters, phase) an extra_loss is

    @property
    def rows(self) -> int:
        return self.batches.index.shape[1]

    def answer(self):
        return train_clients(self.model, self.start, self.buffers, self.x, self.y, self.batches, self.training)


@dataclass
class EvalRequest:
    """The engine's default evaluation of one run's new global model on its test set."""

    model: torch.nn.Module
    flat: torch.Tensor  # [1, P]
    buffers: dict[str, torch.Tensor]  # {name: [1, ...]}
    x: torch.Tensor
    y: torch.Tensor
    n_classes: int

    def answer(self):
        return evaluate(self.model, self.flat, self.buffers, self.x, self.y, self.n_classes)


def _round_generator(seed: int, round_index: int, device) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed((seed * 1_000_003 + round_index * 7_919 + 1) % (2**63))
    return g


def execute(p: Prepared, progress: bool, on_round: Callable[[dict], None] | None = None) -> RunResult:
    """Run one federation: its round loop (:func:`rounds`), each request answered at once."""
    loop = rounds(p, progress, on_round)
    try:
        request = next(loop)
        while True:
            request = loop.send(request.answer())
    except StopIteration as done:
        return done.value


def rounds(p: Prepared, progress: bool, on_round: Callable[[dict], None] | None = None,
           meta: dict[str, Any] | None = None) -> Generator[TrainRequest | EvalRequest, Any, RunResult]:
    """The one round loop of a run, as a generator: it yields each local training and default evaluation
    as a request and resumes with its answer, so that several runs can be answered together
    (``fedlib.packing``); returns the run's :class:`RunResult`. ``meta``: extra provenance."""
    cfg, model, method, part = p.config, p.model, p.method, p.partition
    warmup = warm_up(model, p.x_pool, p.y_pool)  # one-time torch.func costs, kept out of round 1
    loss_key = (type(method).__name__, repr(sorted(method.resolved_hyperparameters().items())))
    t_start, cpu_start = time.perf_counter(), time.process_time()
    layout = ParamLayout(model)
    global_flat, global_buffers = p.init if p.init is not None else (layout.flat_of(model), layout.buffers_of(model))
    sizes = np.asarray(part.sizes)
    roles = np.asarray(part.roles)
    n_classes = p.dataset.num_classes
    method.setup(Federation(model=model, n_clients=part.n_clients, n_classes=n_classes, rounds=cfg.rounds,
                            clients_per_round=cfg.per_round, client_sizes=sizes, device=p.device,
                            x_val=p.x_val, y_val=p.y_val, input_shape=tuple(p.dataset.input_shape),
                            client_data=lambda c: ClientData(p.x_pool, p.y_pool, [part.indices[i] for i in c],
                                                             torch.Generator().manual_seed(cfg.seed)),
                            seed=cfg.seed))
    distills = isinstance(method, DistillationProtocol)  # the logit protocol's own hooks (methods.base)
    train_indices = method.training_indices(list(part.indices)) if distills else list(part.indices)
    test_set = TestSet(model, p.x_test, p.y_test, n_classes)
    client_state = method.init_client_state(method.fed, global_flat, global_buffers)
    rng = np.random.default_rng(cfg.seed)
    history: list[dict[str, Any]] = []
    stopped = None
    rounds = range(cfg.rounds)
    bar = None
    if progress:
        # lazy: tqdm.auto loads ipywidgets in a notebook; only progress bars need it
        from tqdm.auto import tqdm

        bar = tqdm(rounds, desc=f"{cfg.method.name} on {cfg.dataset}", leave=False)
        rounds = bar
    last_eval = None
    suspect_log: list[tuple[int, list[int]]] = []  # (round, clients): outsized updates screening could not clip
    observers = observers_for(p, method)  # hostile clients, FLCE's similarity, reference values, the monitor
    augment_fill = black_pixel(p.dataset) if cfg.augment else None  # crop_flip's padding, normalised
    for t in rounds:
        t_round = time.perf_counter()
        lr = cfg.lr_at(t)
        state = RoundState(round=t, rng=rng, global_flat=global_flat, global_buffers=global_buffers, lr=lr,
                           client_state=client_state)
        # 1. plan
        selected = np.asarray(method.select_clients(state), dtype=np.int64)
        base = LocalTraining(epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=lr, momentum=cfg.momentum,
                             weight_decay=cfg.weight_decay, chunk_size=cfg.client_chunk, augment_fill=augment_fill,
                             precision=cfg.precision)  # bfloat16: the clients' forward/backward under autocast
        local = method.local_training(state, base, selected)
        # 2. local training of all selected clients at once
        t0 = time.perf_counter()
        gen = _round_generator(cfg.seed, t, p.device)
        selected_indices = [train_indices[c] for c in selected]  # ragged sample lists (a gather, no compute)
        batches = make_client_batches(selected_indices, cfg.batch_size, cfg.local_epochs, gen,
                                      augment=augment_fill is not None).to(p.device)

        def run_phase(phase, trained):
            """A method's extra local pass (``LocalPhase``), vectorized like the main one."""
            phase_batches, x, y = batches, p.x_pool, p.y_pool
            if phase.indices is not None:
                phase_batches = make_client_batches(phase.indices, phase.training.batch_size, phase.training.epochs, gen)
                phase_batches.index, phase_batches.mask = (phase_batches.index.to(p.device),
                                                           phase_batches.mask.to(p.device))
                x, y = phase.x, phase.y
            start_flat, start_bufs = (trained if phase.start is None else (phase.start, phase.start_buffers))
            return TrainRequest(model, start_flat, start_bufs, x, y, phase_batches, phase.training,
                                (*loss_key, phase.name))

        start = method.start_models(state, selected)
        start_buffers = {k: v.unsqueeze(0) for k, v in global_buffers.items()}
        if start is None and client_state is not None and client_state.flat is not None:
            rows = torch.as_tensor(selected, dtype=torch.long, device=client_state.flat.device)
            start = client_state.flat[rows]
            start_buffers = {k: v[rows] for k, v in client_state.buffers.items()} or start_buffers
        flat, bufs = yield TrainRequest(model, global_flat if start is None else start, start_buffers,
                                        p.x_pool, p.y_pool, batches, local, (*loss_key, "local"))
        for phase in method.local_phases(state, selected, local):  # e.g. Ditto's personal models
            phase_flat, phase_bufs = yield run_phase(phase, (flat, bufs))
            if phase.replaces_upload:
                flat, bufs = phase_flat, phase_bufs
            client_state = state.client_state = method.phase_done(state, phase, selected, phase_flat, phase_bufs)
        uploads = method.client_uploads(state, selected, flat, bufs,
                                        ClientData(p.x_pool, p.y_pool, selected_indices, gen))
        for observer in observers:  # the split's hostile clients change their uploads here
            flat = observer.uploads(flat, selected, global_flat, gen)
        t_train = time.perf_counter() - t0
        # 3. server
        t0 = time.perf_counter()
        screened = screen_updates(selected, flat, bufs, global_flat,
                                  clip_factor=cfg.update_clip if method.parameter_uploads else None,
                                  sizes=sizes[selected])
        updates = ClientUpdates(clients=selected[screened.keep], flat=screened.flat,
                                sizes=sizes[selected[screened.keep]], buffers=screened.buffers,
                                extras={k: v[torch.as_tensor(screened.keep, device=v.device)]
                                        for k, v in (uploads or {}).items()},
                                start=None if start is None or start.dim() == 1 else
                                start[torch.as_tensor(screened.keep, device=start.device)])
        if screened.suspects:
            suspect_log.append((t, screened.suspects))
        if len(updates.clients) == 0:
            stopped = _stop_message(t, lr, screened, True, suspect_log)
            break
        state.updates = updates
        weights = method.weigh(state, updates).to(flat.device, flat.dtype)
        keep_global = not bool(weights.any())  # all-zero weights: the round keeps the global model
        new_flat, new_buffers = aggregate(updates.flat, weights, updates.buffers)
        global_flat, global_buffers = method.server_update(state, weights, new_flat, new_buffers)
        if keep_global:
            global_flat, global_buffers = state.global_flat, state.global_buffers
        if client_state is not None:
            client_state = state.client_state = method.update_client_state(state, weights, global_flat,
                                                                           global_buffers)
        t_server = time.perf_counter() - t0
        record: dict[str, Any] = {
            "round": t, "lr": lr, "selected": selected.tolist(), "dropped": screened.dropped,
            "clipped": screened.clipped,
            "aggregated": updates.clients.tolist(), "weights": weights.cpu().tolist(),
            "time_train": t_train, "time_server": t_server,  # time_monitor: the poisoning monitor, in time_server
            "time_monitor": screened.monitor_time,
        }
        for observer in observers:  # e.g. FLCE's similarity; the reference values of the last round
            record.update(observer.after_server(t, state, updates, global_flat) or {})
        scores = method.scores()
        if scores is not None:
            record["scores"] = np.asarray(scores, dtype=float).tolist()
        record["diagnostics"] = None  # the method's, filled after the evaluation (which may add to them)
        if screened.notes:
            record["screening"] = screened.notes
        if not torch.isfinite(global_flat).all():
            _set_diagnostics(record, method.diagnostics(state))
            history.append(_strict(record))
            stopped = _stop_message(t, lr, screened, False, suspect_log)
            break
        if (t + 1) % cfg.eval_every == 0 or t == cfg.rounds - 1:
            t0 = time.perf_counter()
            ev = method.evaluate(state, global_flat, global_buffers, test_set)
            if ev is None:
                ev = yield EvalRequest(model, global_flat.unsqueeze(0),
                                       {k: v.unsqueeze(0) for k, v in global_buffers.items()},
                                       p.x_test, p.y_test, n_classes)
            last_eval = ev
            record.update(accuracy=float(ev.accuracy[0]), balanced_accuracy=float(ev.balanced_accuracy[0]),
                          f1=float(ev.macro_f1[0]),
                          per_class_accuracy=ev.per_class_accuracy[0].cpu().tolist(), loss=float(ev.loss[0]),
                          time_eval=time.perf_counter() - t0)
            if bar is not None:
                bar.set_postfix(acc=f"{100 * record['accuracy']:.1f}%")
        _set_diagnostics(record, method.diagnostics(state))
        for phase in method.round_end_phases(state, updates.clients, local) if distills else ():  # the refinement
            t0 = time.perf_counter()
            phase_flat, phase_bufs = yield run_phase(phase, None)
            client_state = state.client_state = method.phase_done(state, phase, updates.clients, phase_flat, phase_bufs)
            record["time_train"] += time.perf_counter() - t0  # local training, though after the server step
        record["time_round"] = time.perf_counter() - t_round  # all of the round, bookkeeping included
        for observer in observers:  # the poisoning monitor: record["disagreement"]
            observer.after_round(record, screened)
        record = _strict(record)
        history.append(record)
        if on_round is not None:
            on_round(record)
    if bar is not None:
        bar.close()
    if stopped:
        warnings.warn(f"{cfg.method.name} on {cfg.dataset}: {stopped}", RuntimeWarning, stacklevel=3)
    final: dict[str, Any] = {"rounds_completed": len(history), "stopped": stopped}
    if last_eval is not None:
        final.update(accuracy=float(last_eval.accuracy[0]), balanced_accuracy=float(last_eval.balanced_accuracy[0]),
                     f1=float(last_eval.macro_f1[0]),
                     per_class_accuracy=last_eval.per_class_accuracy[0].cpu().tolist())
    else:
        final.update(accuracy=None, balanced_accuracy=None, per_class_accuracy=[])
    for observer in observers:  # final["poisoning_warning"], final["reference"]
        observer.finish(final, f"{cfg.method.name} on {cfg.dataset}")
    if distills:
        final.update(method.final_extras() or {})
    meta = {**_provenance(p, time.perf_counter() - t_start), **(meta or {})}
    meta["warmup_s"] = warmup
    # CPU seconds of this process (all its threads) over the rounds, like wall_time: a pack's runs share it;
    # runs per core-hour = 3600 / cpu_time on a 1-thread plan
    meta["cpu_time"] = time.process_time() - cpu_start
    conv = conv_choices_for(p.model, p.device)
    if conv:  # convolution lowerings chosen by timing (CUDA): the numbers agree up to float order
        meta["conv_lowerings"] = conv
    result = RunResult(config=cfg.to_dict(), history=history, final=_strict(final), meta=meta)
    if p.keep_model:
        result.model = (global_flat, global_buffers)
    return result


def _set_diagnostics(record: dict[str, Any], extras: dict[str, Any] | None) -> None:
    if extras:
        record["diagnostics"] = extras
    else:
        record.pop("diagnostics", None)


def _stop_message(t: int, lr: float, screened, everything_dropped: bool,
                  suspect_log: list[tuple[int, list[int]]]) -> str:
    """Why training stopped. Outsized updates the screening could not clip (fewer than 3 updates)
    are named as the likely cause; the lr is suggested only when no update looked poisoned."""
    kept = f"the history of the {t} earlier round(s) is kept"
    dropped = [d["client"] for d in screened.dropped][:10]
    what = (f"every update was dropped as non-finite or malformed (clients {dropped})"
            if everything_dropped else "the global model became non-finite")
    if suspect_log:
        where = ", ".join(f"round {r + 1}: client(s) {c[:10]}" for r, c in suspect_log[:5])
        return (f"round {t + 1}: {what} after unclipped updates far larger than the others' ({where}; clipping "
                f"needs >= 3 updates per round); a faulty or poisoned update, not the learning rate, is the likely "
                f"cause; {kept}. Exclude those clients or take part with more clients per round.")
    if everything_dropped:
        return (f"round {t + 1}: {what}, so the round has nothing to aggregate; {kept}. If these clients are faulty "
                f"or hostile, exclude them; if their local training diverged, try a smaller lr (now {lr:g}).")
    return f"round {t + 1}: {what}, so training diverged; {kept}. Try a smaller lr (now {lr:g})."


_execute = execute  # the name tests and older code import
