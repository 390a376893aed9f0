"""Running the queue: one item or pack here (:func:`run_one`, :func:`run_packed`), the local process backend and
the planning loop (:func:`run_queue`) that claims, runs and stores the units within a budget."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ... import limits
from ...cache import write_failure
from ...run import run_pack
from ...scm_pipeline import run_pipelines
from ...store import Store, stored_payload
from ..kit.items import QueueItem, run_round, run_scm

# read as costs.STARTUP_SECONDS: one value, where a test patches it
from . import cost as costs
from .cost import CostModel
from .plan import Entry, Pack, _hms, chapter_items, recost, reserved
from .store import (
    _claim_path,
    answers,
    claim,
    is_stored,
    release,
    store_payload,
)

# ----------------------------------------------------------------------------- running

def check_device(device: str) -> str:
    """``device`` when runs can start on it here ('cpu'; 'cuda' or 'cuda:N' when that CUDA device is on
    this machine: ``fedlib.limits.check_device``), else a one-line ``ConfigError`` (a ValueError)."""
    return limits.check_device(device, present=True, what="--device")


def no_run_with_key(chapter: str, key: str, profile: str) -> str:
    """The one-line error for a key the chapter's profile has no run for (a key includes the fingerprint of
    the data it reads, so a key made under another data root is not found)."""
    return (f"{chapter}: no run with key {key!r} in the {profile} profile (a key includes the data's fingerprint: "
            f"was it made with this FEDLIB_DATA?)")


def on_device(config, device: str):
    """``config`` to run on ``device`` (the chapter's own config on a CPU)."""
    return config if device == "cpu" else config.model_copy(update={"device": device})


def compute(items: list[QueueItem], device: str = "cpu", packed: bool = False,
            on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
    """The finished results of ``items`` on ``device`` as dicts (``RunResult.to_dict()``), not stored: one
    item by its runner, or (``packed``)
    the items as packs (``fedlib.run.run_pack``; FedSCM federations by ``run_pipelines``). ``on_done(i,
    result)`` as each run finishes. What a queue worker runs: a local one stores each result
    (:func:`run_one`, :func:`run_packed`), a cluster worker sends them back (``fedlib.app.cluster``)."""
    configs = [on_device(i.config, device) for i in items]
    if not packed:
        out = [items[0].runner(configs[0])]
        if on_done is not None:
            on_done(0, out[0])
        return out
    if items and items[0].runner is run_scm:
        as_dicts = None if on_done is None else (lambda i, record: on_done(i, record.to_dict()))
        return [record.to_dict() for record in run_pipelines(configs, on_done=as_dicts)]
    return run_pack(configs, on_done=on_done)


def run_one(chapter: str, key: str, profile: str = "paper", device: str = "cpu") -> Path:
    """Run the item of ``chapter`` with config ``key`` (on ``device``) and store it once."""
    check_device(device)
    matches = [i for i in chapter_items(chapter, profile) if i.key == key]
    if not matches:
        raise ValueError(no_run_with_key(chapter, key, profile))
    item = matches[0]
    return store_payload(item, compute([item], device)[0], profile)


def pack_items(specs: list[str], profile: str = "paper") -> list[QueueItem]:
    """The items ``chapter:key`` of a pack, checked: engine runs or FedSCM federations, not both."""
    items = []
    for spec in specs:
        chapter, sep, key = spec.partition(":")
        if not sep:
            raise ValueError(f"--run-pack: expected CHAPTER:KEY (got {spec!r})")
        by_key = {i.key: i for i in chapter_items(chapter, profile)}
        if key not in by_key:
            raise ValueError(no_run_with_key(chapter, key, profile))
        if by_key[key].runner not in (run_round, run_scm):
            raise ValueError(f"{chapter}: {key} is neither an engine run nor a FedSCM federation; it cannot be packed")
        items.append(by_key[key])
    if len({i.runner for i in items}) > 1:
        raise ValueError("--run-pack: engine runs and FedSCM federations cannot share a pack")
    return items


def run_packed(specs: list[str], profile: str = "paper", device: str = "cpu", log=print) -> list[Path]:
    """Run the items ``chapter:key`` as packs (``fedlib.run.run_pack``) on ``device``; each run is stored
    as it finishes, so a killed pack loses only the runs not yet finished."""
    check_device(device)
    items = pack_items(specs, profile)
    paths: list[Path] = []

    def stored(i: int, result: dict) -> None:
        paths.append(store_payload(items[i], result, profile))
        log(f"stored {paths[-1]} ({items[i].describe()})")

    compute(items, device, packed=True, on_done=stored)
    return paths


@dataclass
class Outcome:
    stored: list[QueueItem] = field(default_factory=list)
    failed: list[tuple[QueueItem, str]] = field(default_factory=list)
    killed: list[QueueItem] = field(default_factory=list)  # still running when the budget ran out
    claimed: list[QueueItem] = field(default_factory=list)  # held by another live queue: skipped
    absent: list[tuple[QueueItem, str]] = field(default_factory=list)  # not runnable where it was sent (its data)
    ran_on: dict[str, str] = field(default_factory=dict)  # config key -> the worker (and device) that ran it
    elapsed: float = 0.0


def _command(entry: Entry | Pack, profile: str, device: str) -> list[str]:
    if isinstance(entry, Pack):
        return [sys.executable, "-m", "fedlib", "results", "--run-pack",
                *[f"{i.chapter}:{i.key}" for i in entry.items], "--profile", profile, "--device", device]
    return [sys.executable, "-m", "fedlib", "results", "--run-one", entry.item.key, "--chapter", entry.item.chapter,
            "--profile", profile, "--device", device]


# ----------------------------------------------------------------------------- backends: where units run


@dataclass
class Finished:
    """What became of a unit a backend ran (:meth:`LocalProcesses.poll`, ``fedlib.app.cluster.DaskBackend.poll``).

    ``records``: the finished runs' results, in the unit's order, for the queue to check and store (None: the
    unit stored its own); ``error``: why it failed (one line); ``absent``: why it cannot run where it was sent
    (its data is not there); ``where``: the worker (and device) that ran it; ``seconds``: its time there."""

    records: list[dict] | None = None
    error: str | None = None
    absent: str | None = None
    where: str | None = None
    seconds: float | None = None


class LocalProcesses:
    """Units as processes of this machine (``python -m fedlib results --run-one/--run-pack``, one thread each),
    ``workers`` at a time; each stores its own runs in the queue's store."""

    def __init__(self, workers: int = 1, profile: str = "paper", device: str = "cpu", command=_command):
        self.workers, self.profile, self.device, self.command = workers, profile, device, command
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def slots(self) -> int:
        return self.workers

    def accepts(self, unit: Entry | Pack) -> bool:
        return True

    def start(self, unit: Entry | Pack):
        out = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(self.command(unit, self.profile, self.device), stdout=out, stderr=subprocess.STDOUT,
                                env=self.env)
        return proc, out

    def poll(self, handle) -> Finished | None:
        proc, out = handle
        code = proc.poll()
        if code is None:
            return None
        if code == 0:
            done = Finished(where=f"local process {proc.pid} ({self.device})")
        else:
            out.seek(0)
            done = Finished(error=f"exit {code}: " + " | ".join(out.read().strip().splitlines()[-3:]))
        out.close()
        return done

    def cancel(self, handle) -> None:
        proc, out = handle
        proc.kill()
        proc.wait()
        out.close()

    def close(self) -> None:
        return None


def store_records(unit: Entry | Pack, records: list[dict], profile: str) -> list[tuple[QueueItem, str | None]]:
    """Check each finished result a worker sent back against its item (:func:`answers`) and store the valid
    ones (:func:`store_payload`); (item, None when stored, else why not) for each item of ``unit``."""
    out: list[tuple[QueueItem, str | None]] = []
    if not isinstance(records, list) or len(records) != len(unit.items):
        return [(item, f"the worker sent back {type(records).__name__} instead of {len(unit.items)} result(s)")
                for item in unit.items]
    for item, record in zip(unit.items, records):
        try:
            canonical = item.config.to_dict()
            problem = answers(item, stored_payload(canonical, {**record, "config": canonical}))
        except Exception as err:  # noqa: BLE001 - a malformed result is an invalid one
            problem = f"invalid result ({type(err).__name__})"
        if problem is None:
            try:
                store_payload(item, record, profile)
            except OSError as err:
                problem = f"could not store it ({write_failure(err, Store.writing().runs)})"
        out.append((item, problem))
    return out


def _claim_unit(unit: Entry | Pack, outcome: Outcome, log) -> Entry | Pack | None:
    """Claim every run of ``unit`` (:func:`claim`); the runs another live queue holds, or stored
    meanwhile, are left out. Returns what this queue runs (a smaller pack, one entry) or None."""
    kept = []
    for entry in (unit.entries if isinstance(unit, Pack) else [unit]):
        try:
            held, owner = claim(entry.item.key, log=log)
        except OSError as err:  # a read-only or full store: nothing could be stored either
            outcome.failed.append((entry.item, write_failure(err, _claim_path(entry.item.key))))
            log(f"[FAILED] {entry.describe()}: cannot claim it ({outcome.failed[-1][1]})")
            continue
        if not held:
            outcome.claimed.append(entry.item)
            log(f"[claimed] {entry.describe()}: run by pid {owner.get('pid')} on {owner.get('host')}; skipped")
            continue
        if is_stored(entry.item):  # another queue finished it meanwhile
            release(entry.item.key)
            log(f"[stored] {entry.describe()}: stored meanwhile; skipped")
            continue
        kept.append(entry)
    if not kept:
        return None
    if not isinstance(unit, Pack) or len(kept) == len(unit.entries):
        return unit
    share = (unit.cost - costs.STARTUP_SECONDS) * len(kept) / len(unit.entries)
    return kept[0] if len(kept) == 1 else Pack(kept, costs.STARTUP_SECONDS + share, unit.how)


def next_unit(pending: list[Entry | Pack], left: float | None, log=print,
              accept: Callable[[Entry | Pack], bool] | None = None) -> Entry | Pack | None:
    """Take from ``pending`` the next unit to start with ``left`` seconds of budget (None: no budget): the
    first whose :func:`reserved` fits (and that ``accept`` takes now: a backend with a free slot for it); a
    first pack too long for it is split first into the part that fits."""
    head = pending[0]
    if left is not None and isinstance(head, Pack) and reserved(head) > left:  # the part of it that fits
        margin = reserved(head) / head.cost
        per_run = margin * (head.cost - costs.STARTUP_SECONDS) / len(head.entries)
        runs = int((left - margin * costs.STARTUP_SECONDS) // max(per_run, 1e-9))
        if runs >= 1:
            part, rest = head.split(runs)
            pending[0:1] = [part, rest]
            log(f"budget: {part.describe()} of the {len(head.entries)} fits in {_hms(left)}")
    pick = next((e for e in pending if (left is None or reserved(e) <= left) and (accept is None or accept(e))),
                None)
    if pick is not None:
        pending.remove(pick)
    return pick


def preview(units: list[Entry | Pack], budget: float, workers: int = 1) -> list[tuple[float, Entry | Pack]]:
    """(start second, unit) of what :func:`run_queue` with this ``budget`` would start if every unit took
    its estimate: what a budgeted call (the GPU script's) will try, seen before it spends device time."""
    pending = [u for u in units if not u.stored and not u.missing]
    running: list[float] = []  # the estimated end of each unit started
    now, started = 0.0, []
    while pending:
        while len(running) < workers and pending:
            pick = next_unit(pending, budget - now, log=lambda line: None)
            if pick is None:
                break
            started.append((now, pick))
            running.append(now + pick.cost)
        if not running:
            break
        now = min(running)
        running.remove(now)
    return started


def format_preview(started: list[tuple[float, Entry | Pack]], budget: float, workers: int = 1) -> str:
    runs = sum(len(unit.items) for _, unit in started)
    lines = [f"With a budget of {budget:.0f} s and {workers} worker(s), by the estimates this queue would start "
             f"{len(started)} unit(s) of {runs} run(s):"]
    lines += [f"  at {_hms(at)}  ≈ {_hms(unit.cost)}  {unit.describe()}  [{unit.how}]" for at, unit in started]
    return "\n".join(lines)


def run_queue(entries: list[Entry | Pack], profile: str = "paper", budget: float | None = None, workers: int = 1,
              device: str = "cpu", log=print, command=_command, grace: float = 0.1, poll: float = 0.5,
              claims: bool = True, cost_model: CostModel | None = None, backend=None) -> Outcome:
    """Run the pending entries (single runs or :class:`Pack` s) in order, as many at a time as the ``backend``
    has slots: by default :class:`LocalProcesses` (``workers`` processes of this machine, each storing its own
    runs); ``fedlib.app.cluster.DaskBackend`` sends them to a Dask cluster, whose workers send the finished
    runs back, and this queue checks and stores them (:func:`store_records`) as they arrive.

    With a ``budget`` (seconds), an entry starts only if :func:`reserved` (its estimate, with a
    margin while unmeasured) fits in what is left; a first pack too long for it runs the part that
    fits, ahead of later units; when none fits, no more start. Runs still going ``grace`` x budget (at least 5 s) after
    the budget are stopped (nothing partial is stored). With ``claims``, each run is claimed
    first (:func:`claim`): a run another live queue on this store holds, or one it stored
    meanwhile, is skipped; a dead queue's claim is taken over. With a ``budget`` and a ``cost_model``,
    the pending units are re-estimated (:func:`recost`) each time runs are stored. A unit a worker cannot
    run (its data is not there) is logged and left; which worker ran each unit is in ``Outcome.ran_on``."""
    backend = backend if backend is not None else LocalProcesses(workers, profile, device, command)
    pending = [e for e in entries if not e.stored and not e.missing]
    outcome = Outcome()
    t0 = time.monotonic()
    running: list[tuple[Entry | Pack, Any, float]] = []
    total = len(pending)
    started = 0

    def stamp() -> str:
        left = sum(e.cost for e in pending) + sum(max(0.0, e.cost - (time.monotonic() - s)) for e, _, s in running)
        return f"elapsed {_hms(time.monotonic() - t0)}, remaining ≈ {_hms(left / max(1, backend.slots()))}"

    def fits(unit, left) -> bool:
        return left is None or reserved(unit) <= left

    hard_stop = None if budget is None else budget * (1 + grace) + 5.0
    waiting = False  # for a worker to join (a cluster with none)
    try:
        while pending or running:
            now = time.monotonic() - t0
            while len(running) < backend.slots() and pending:
                left = None if budget is None else budget - now
                pick = next_unit(pending, left, log, accept=backend.accepts)
                if pick is None:
                    if any(fits(e, left) for e in pending):  # one fits, but no free slot takes it yet
                        break
                    if not running:
                        log(f"budget: the next run needs ≈ {_hms(min(reserved(e) for e in pending))}, "
                            f"{_hms(max(0.0, left))} left; stopping ({len(pending)} pending)")
                    pending = [] if not running else pending
                    break
                if claims:
                    pick = _claim_unit(pick, outcome, log)
                    if pick is None:
                        continue
                started += 1
                running.append((pick, backend.start(pick), time.monotonic()))
                log(f"[start {started}/{total}] {pick.describe()} (≈ {_hms(pick.cost)}) · {stamp()}")
            if not running and pending and backend.slots() == 0:  # a cluster without workers: wait for one
                if not waiting:
                    log("no worker: waiting for one to join")
                waiting = True
                if hard_stop is not None and time.monotonic() - t0 > budget:
                    log(f"budget: spent waiting for a worker; stopping ({len(pending)} pending)")
                    break
                time.sleep(poll)
                continue
            waiting = False
            if not running:
                break
            time.sleep(poll)
            still = []
            for entry, handle, start in running:
                done = backend.poll(handle)
                if done is None and (hard_stop is None or time.monotonic() - t0 <= hard_stop):
                    still.append((entry, handle, start))
                    continue
                stored = _finish(entry, handle, start, done, backend, outcome, profile, log, stamp)
                if stored and budget is not None and cost_model is not None and pending:
                    recost(pending, stored, cost_model, device)
                if claims:
                    for item in entry.items:
                        release(item.key)
            running = still
            if budget is not None and pending and not running:
                left = budget - (time.monotonic() - t0)
                if not any(reserved(e) <= left for e in pending):
                    log(f"budget: {_hms(max(0.0, left))} left, no pending run fits; stopping ({len(pending)} pending)")
                    pending = []
    finally:
        for entry, handle, _ in running:  # interrupted: stop what still runs, store nothing of it
            backend.cancel(handle)
            if claims:
                for item in entry.items:
                    release(item.key)
        backend.close()
    outcome.elapsed = time.monotonic() - t0
    return outcome


def _finish(entry: Entry | Pack, handle, start: float, done: Finished | None, backend, outcome: Outcome,
            profile: str, log, stamp) -> list[QueueItem]:
    """Record a unit that ended (``done``), or stop one past the budget (``done`` None): nothing partial is
    stored. Returns the items it stored."""
    if done is None:
        backend.cancel(handle)
        outcome.killed.extend(entry.items)
        log(f"[stopped] {entry.describe()}: past the budget, not stored")
        return []
    where = f" on {done.where}" if done.where else ""
    if done.where:
        outcome.ran_on.update({item.key: done.where for item in entry.items})
    if done.absent is not None:
        outcome.absent.extend((item, done.absent) for item in entry.items)
        log(f"[absent] {entry.describe()}: not runnable{where}: {done.absent}")
        return []
    if done.error is not None:
        outcome.failed.extend((item, done.error) for item in entry.items)
        log(f"[FAILED] {entry.describe()}{where}: {done.error}")
        return []
    results = [(item, None) for item in entry.items] if done.records is None else \
        store_records(entry, done.records, profile)
    took = done.seconds if done.seconds is not None else time.monotonic() - start
    for item, problem in results:
        if problem is None:
            outcome.stored.append(item)
        else:
            outcome.failed.append((item, problem))
            log(f"[FAILED] {item.describe()}{where}: {problem}; not stored")
    if any(problem is None for _, problem in results):
        log(f"[done  {len(outcome.stored)}] {entry.describe()} in {_hms(took)} (est. {_hms(entry.cost)}){where} "
            f"· {stamp()}")
    return [item for item, problem in results if problem is None]
