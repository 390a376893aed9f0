"""The results queue on a Dask distributed cluster (``python -m fedlib results --scheduler tcp://host:8786``).

The queue (``fedlib.app.queue``) keeps its items, packs, cost model, claims and store; this module is only
how a unit starts, is polled and is stopped on a cluster (:class:`DaskBackend`). Scheduling, retries,
resources and heartbeats are Dask's:

* a unit (one run or a pack) is one task, :func:`run_unit`, submitted in the queue's order when a slot is
  free; the worker runs it with the same code the local queue's processes run (``queue.compute``) and
  sends the finished results back; the driver checks and stores them (``queue.store_records``). No shared
  filesystem; a worker lost mid-unit loses only that unit, which the scheduler gives to another worker
  (``retries`` more for a unit that raised). Nothing partial is stored: a unit's results come back together.
* a GPU-only unit (``QueueItem.gpu``) asks for ``resources={"GPU": 1}``: it runs only on a worker started
  with ``--resources GPU=1``; CPU units go anywhere. A worker runs on CUDA when it has it, else on its CPU,
  with one intra-op thread per unit (the local queue's plan).
* the data root is the worker's (its ``FEDLIB_DATA``): a worker without a unit's dataset answers with a
  marker (``{"absent": why}``), which the queue logs and goes on.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from typing import Any

import torch

from ..data import data_missing
from . import queue
from .kit.items import QueueItem
from .queue import Entry, Finished, Pack

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
GPU = "GPU"  # the Dask resource a GPU worker declares (dask worker ... --resources GPU=1)


def needs_gpu(unit: Entry | Pack) -> bool:
    return any(item.gpu for item in unit.items)


def unit_spec(unit: Entry | Pack) -> list[tuple[QueueItem, type, dict]]:
    """What a worker needs to run ``unit``: each item without its config, the config's class and its plain
    form (no data root: the worker's own is used)."""
    return [(dataclasses.replace(item, config=None), type(item.config), item.config.to_dict()) for item in unit.items]


def worker_device() -> str:
    """The device this worker runs units on: CUDA when it has it, else its CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_unit(spec: list[tuple[QueueItem, type, dict]], packed: bool) -> dict[str, Any]:
    """Executed by a cluster worker: the unit's finished results, not stored, as ``{"records": [...], "where",
    "device", "seconds"}``; ``{"absent": why, "where"}`` when a dataset of the unit is not on this worker."""
    try:
        # lazy: distributed (optional: the test extra's); the command line imports this module
        from distributed import get_worker

        worker = get_worker()
        where = f"{worker.name} at {worker.address}" if isinstance(worker.name, str) else worker.address
    except ValueError:  # not in a worker (called directly)
        where = f"pid {os.getpid()}"
    for _, _, config in spec:
        absent = data_missing(config["dataset"])
        if absent is not None:
            return {"absent": absent, "where": where}
    device = worker_device()
    items = [dataclasses.replace(item, config=cls.make(config)) for item, cls, config in spec]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the queue's plan: one intra-op thread per unit, as its local processes
    t0 = time.perf_counter()
    try:
        records = queue.compute(items, device, packed=packed)
    finally:
        torch.set_num_threads(threads)
    return {"records": records, "where": where, "device": device, "seconds": time.perf_counter() - t0}


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300]}" if text else type(err).__name__


class DaskBackend:
    """Units as tasks of a Dask cluster (see the module docstring): ``client`` is a ``distributed.Client``;
    as many units run at a time as the workers have threads (GPU-only units: as many as the workers declare
    GPUs); ``retries``: more tries of a unit whose task raised (a lost worker's unit is rescheduled by Dask)."""

    def __init__(self, client, retries: int = 1):
        self.client, self.retries = client, retries
        self.gpu_running = 0
        self._info: tuple[float, dict] = (0.0, {})

    def workers(self) -> dict:
        """The scheduler's workers (``scheduler_info()["workers"]``), asked again at most every 0.5 s."""
        at, info = self._info
        if time.monotonic() - at > 0.5:
            info = self.client.scheduler_info(n_workers=-1).get("workers", {})
            self._info = (time.monotonic(), info)
        return info

    def slots(self) -> int:
        return sum(int(w.get("nthreads", 1)) for w in self.workers().values())

    def gpu_slots(self) -> int:
        return sum(int((w.get("resources") or {}).get(GPU, 0)) for w in self.workers().values())

    def accepts(self, unit: Entry | Pack) -> bool:
        """A GPU-only unit waits while every GPU worker is busy (with none at all it starts, to be reported)."""
        if not needs_gpu(unit):
            return True
        gpus = self.gpu_slots()
        return gpus == 0 or self.gpu_running < gpus

    def start(self, unit: Entry | Pack):
        gpu = needs_gpu(unit)
        if gpu and self.gpu_slots() == 0:
            return Finished(absent=f"no worker of the cluster declares a {GPU} resource (dask worker ... "
                                   f"--resources {GPU}=1)")
        self.gpu_running += gpu
        future = self.client.submit(run_unit, unit_spec(unit), isinstance(unit, Pack), pure=False,
                                    key=f"fedlib-unit-{uuid.uuid4().hex}", retries=self.retries,
                                    resources={GPU: 1} if gpu else None)
        return future, gpu

    def poll(self, handle) -> Finished | None:
        if isinstance(handle, Finished):
            return handle
        future, gpu = handle
        if future.status == "pending":
            return None
        self.gpu_running -= gpu
        if future.status != "finished":
            err = future.exception() if future.status == "error" else None
            return Finished(error=one_line(err) if err is not None else f"the unit's task was {future.status}")
        answer = future.result()
        future.release()
        where = answer.get("where")
        if "absent" in answer:
            return Finished(absent=answer["absent"], where=where)
        return Finished(records=answer["records"], where=f"{where} ({answer['device']})", seconds=answer["seconds"])

    def cancel(self, handle) -> None:
        """Stop a unit: its result is dropped (nothing stored) and the worker running it, if any, restarted
        (a Python thread cannot be interrupted)."""
        if isinstance(handle, Finished):
            return
        future, gpu = handle
        if future.status == "pending":
            self.gpu_running -= gpu
        busy = [w for w, keys in self.client.processing().items() if future.key in keys]
        future.cancel()
        if busy:
            try:
                self.client.restart_workers(busy, timeout=60, raise_for_error=False)
            except Exception:  # noqa: BLE001 - a worker without a nanny, already gone: its result is dropped anyway
                pass

    def close(self) -> None:
        return None


def connect(address: str | None = None, wait_s: float = 60.0):
    """A ``distributed.Client`` of the scheduler at ``address`` (default: ``$DASK_SCHEDULER_ADDRESS``), once at
    least one worker has joined; a one-line ValueError when there is none within ``wait_s`` seconds."""
    # lazy: distributed (optional: the test extra's); the command line imports this module
    from distributed import Client

    address = address or os.environ.get(SCHEDULER_ENV)
    if not address:
        raise ValueError(f"--scheduler: no scheduler address (give one, or set ${SCHEDULER_ENV})")
    try:
        client = Client(address, timeout=wait_s)
    except (OSError, TimeoutError) as err:
        raise ValueError(f"--scheduler: cannot reach the scheduler at {address[:120]} ({one_line(err)})") from None
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except TimeoutError:
        client.close()
        raise ValueError(f"--scheduler: no worker joined the scheduler at {address[:120]} within {wait_s:.0f} s") \
            from None
    return client


def describe_cluster(client) -> str:
    """One line: the workers, their threads and GPUs."""
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    threads = sum(int(w.get("nthreads", 1)) for w in workers.values())
    gpus = sum(int((w.get("resources") or {}).get(GPU, 0)) for w in workers.values())
    return f"{len(workers)} worker(s), {threads} thread(s), {gpus} declaring {GPU}"


def run_queue(entries, client, profile: str = "paper", retries: int = 1, **kwargs) -> "queue.Outcome":
    """:func:`fedlib.app.queue.run_queue` on the cluster of ``client`` (the same planning loop, budget, claims,
    cost model and store; see :class:`DaskBackend`)."""
    return queue.run_queue(entries, profile, backend=DaskBackend(client, retries=retries), **kwargs)
