"""The results queue: every run of every chapter's paper profile, most valuable first.

Each chapter's ``Paper`` record (``fedlib.app.chapters``) names its ``runs(params) ->
list[QueueItem]`` (``fedlib.app.kit.items``): one item per run of its profile, saying which paper table,
row and column the run backs, its seed, its config and the function that runs it (:func:`run_round` for
every engine run, :func:`run_scm`). The queue knows nothing else about chapters: it orders the
items (:func:`priority`), skips those already stored under ``results/runs/<key>.json.zd`` (one
store: a run two chapters share is stored once), estimates what each costs and runs them, one
process per run, ``workers`` at a time, storing each result with its provenance as it
finishes. A killed queue resumes where it stopped (stored files are never recomputed). On a Dask
cluster (``--scheduler``, ``fedlib.app.cluster``) the same planning loop (:func:`run_queue`) sends the units
to the cluster's workers, which send the finished runs back to be stored here.

Cost model (:class:`CostModel`): a run's *work* is the number of training-sample passes it
makes (rounds x local epochs x the training samples of the clients of a round; the logit
protocol adds distillation on the public set; FedSCM's pipeline its local training plus
the post-selection rounds). Its cost is work x seconds per sample pass, the median of
``wall_time / work`` over stored runs on the same kind of device, taken from the most
similar group that has any: same runner, dataset, model and method; else same runner,
model and method; else same runner and model (scaled by :data:`METHOD_FACTOR`); else same
model. A model with no stored run on that kind of device takes other models' runs of the same runner
and dataset, scaled by the two models' FLOPs per sample (:func:`model_flops`; models of like size
only; runs of the same size first), and is not counted as measured (:func:`reserved` keeps its
margin). With nothing similar stored, :data:`FALLBACK_SECONDS_PER_1000` (seconds per 1,000
sample passes, by model and device kind: one-thread CPU figures measured here for the MLP and
LeNet-5, scaled by model size for the CNNs; the GPU's MLP figure from
benchmarks/results/peers_nvidia-h200.json, its CNN figure from packed_nvidia-h100.json (a run alone,
evaluation included), the others guessed from them) times
:data:`METHOD_FACTOR` is used, plus :data:`STARTUP_SECONDS` per run.

The package's modules: ``store`` (the store's side: stored or not, storing a result, the claims on keys in flight,
the data an item needs), ``cost`` (the cost model), ``plan`` (the items, their order, the entries and packs to run,
the CLI's list) and ``runner`` (running a unit here, the local backend and the planning loop). This module
re-exports the names the command line, the other layers and the tests use. A test patches a name in the module
that looks it up: ``store.data_missing``, ``runner.is_stored`` / ``runner.store_payload``,
``cost.STARTUP_SECONDS`` (read there by every module as ``costs.STARTUP_SECONDS``).
"""

from __future__ import annotations

from ..kit.items import QueueItem, method_name, run_round, run_scm, work
from ..kit.stored import StoredIndex
from .cost import (
    AUGMENT_FACTOR,
    FALLBACK_SECONDS_PER_1000,
    METHOD_FACTOR,
    CostModel,
    device_kind,
    model_flops,
)
from .plan import (
    SCM_PACK_RUNS,
    UNCALIBRATED_MARGIN,
    Entry,
    Pack,
    _check_labels,
    all_items,
    chapter_items,
    format_list,
    pack_cost,
    plan,
    plan_packs,
    priority,
    recost,
    reserved,
    scm_pack_signature,
    sharing,
    summary,
    unique,
)
from .runner import (
    Finished,
    LocalProcesses,
    Outcome,
    check_device,
    compute,
    format_preview,
    next_unit,
    preview,
    run_one,
    run_packed,
    run_queue,
    store_records,
)
from .store import (
    answers,
    claim,
    claim_owner,
    is_stored,
    left_out_lines,
    missing_data,
    release,
    results_root,
    store_payload,
    stored_state,
)

__all__ = [
    "all_items",
    "answers",
    "AUGMENT_FACTOR",
    "chapter_items",
    "check_device",
    "_check_labels",
    "claim",
    "claim_owner",
    "compute",
    "CostModel",
    "device_kind",
    "Entry",
    "FALLBACK_SECONDS_PER_1000",
    "Finished",
    "format_list",
    "format_preview",
    "is_stored",
    "left_out_lines",
    "LocalProcesses",
    "METHOD_FACTOR",
    "method_name",
    "missing_data",
    "model_flops",
    "next_unit",
    "Outcome",
    "Pack",
    "pack_cost",
    "plan",
    "plan_packs",
    "preview",
    "priority",
    "QueueItem",
    "recost",
    "release",
    "reserved",
    "results_root",
    "run_one",
    "run_packed",
    "run_queue",
    "run_round",
    "run_scm",
    "SCM_PACK_RUNS",
    "scm_pack_signature",
    "sharing",
    "store_payload",
    "store_records",
    "stored_state",
    "StoredIndex",
    "summary",
    "UNCALIBRATED_MARGIN",
    "unique",
    "work",
]
