"""The results queue: every run of every chapter's paper profile, most valuable first.

Each chapter's ``Paper`` record (``fedlib.app.chapters``) names its ``queue_items(params) ->
list[QueueItem]`` (``fedlib.app.kit.items``): one item per run of its profile, saying which paper table,
row and column the run backs, its seed, its config and the function that runs it (:func:`run_round` for
every engine run, :func:`run_scm`). The queue knows nothing else about chapters: it orders the
items (:func:`priority`), skips those already stored under ``results/runs/<key>.json.gz`` (one
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
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import data
from ..cache import ResultCache, key_of
from ..data import data_missing
from ..results import list_store, runs_dir, store_run
from . import chapters
from .chapters import profiles
from .kit import stored as kit_stored
from .kit.items import QueueItem, _get, method_name, run_round, run_scm, runner_kind, work
from .kit.sources import check_only
from .kit.stored import StoredIndex

# seconds per 1,000 training-sample passes when nothing similar is stored (order of magnitude)
# (the wider CNN's: the CNN's times their FLOPs per CIFAR-10 sample, 15.78 / 4.66 MFLOP, model_flops)
FALLBACK_SECONDS_PER_1000 = {
    "cpu": {"mlp": 0.05, "lenet5": 0.3, "cnn": 1.5, "cnn_wide": 5.08, "resnet20": 6.0, "resnet18": 25.0,
            "vgg11": 20.0},
    "cuda": {"mlp": 0.005, "lenet5": 0.01, "cnn": 0.0103, "cnn_wide": 0.0349, "resnet20": 0.08, "resnet18": 0.15,
             "vgg11": 0.1},
}
# a model without stored runs on a device is estimated from another model's runs there, scaled by their FLOPs
# per sample, only when these are within this factor of each other: beyond it the fixed cost of a step (launches
# on a GPU) makes the scaling wrong (from the CNN, a ResNet-20 run on an H100 would be put at 5.6 h)
SCALE_WITHIN = 4.0
FALLBACK_UNKNOWN_MODEL = {"cpu": 5.0, "cuda": 0.1}
# augmented runs (crop + flip per sample and step) are timed apart from plain ones; with none stored, a plain
# rate times this: on an H100 a pack of 3 augmented CELM CIFAR-10 runs took 62.6 s per run, a pack of 2 plain
# ones 43.2 s (2026-11-27; the larger pack's own cost included, so an upper bound)
AUGMENT_FACTOR = 1.45
# extra server work per round relative to FedAvg (Shapley-type valuations evaluate many subsets)
METHOD_FACTOR = {"fedsv": 5.0, "gtg_shapley": 3.0, "fedms": 3.0, "greedyfed": 3.0, "s_fedavg": 1.5,
                 "shapley_rewards": 3.0}
STARTUP_SECONDS = 15.0  # process start, imports, data loading (measured 10-30 s on a shared 2-core machine)


# FedSCM federations packed at most: a table's α x seeds (3 x 3). Their one-shot stages' sample pools are
# concatenated (CIFAR-10: about 0.6 GB each), their clients trained a federation's worth at a time.
SCM_PACK_RUNS = 9


def scm_pack_signature(config) -> tuple:
    """FedSCM federations with equal signatures share their one-shot stage's calls and their post-training
    packs: the same data, model, local training and post-training rounds, on the same device."""
    return (config.dataset, config.data_root, config.model, config.batch_size, config.local_epochs, config.lr,
            config.momentum, config.weight_decay, config.post_rounds, config.post_epochs, config.post_lr,
            config.device)


# ----------------------------------------------------------------------------- the queue


def chapter_items(chapter: str, profile: str = "paper") -> list[QueueItem]:
    """Every item of a chapter's profile (its ``Paper.queue_items``), duplicates included; a profile that
    does not fit the chapter's schema is one ``ProfileError`` line."""
    return list(chapters.record(chapter).queue_items(profiles.load(chapter, profile)))


def all_items(profile: str = "paper", only: Iterable[str] | None = None) -> list[QueueItem]:
    known = list(chapters.registry())
    names = list(only) if only else known
    check_only(names, known)
    return [item for name in names for item in chapter_items(name, profile)]


def unique(items: Iterable[QueueItem]) -> list[QueueItem]:
    """One item per config key: the most valuable labelling of a run that several tables (or
    chapters: the FedAvg chapter's runs are CELM's) share."""
    ours = {name for name, paper in chapters.registry().items() if paper.ours}  # labelled by the paper they share
    seen, out = set(), []
    for item in sorted(items, key=lambda i: (not i.first_seed, not i.headline, i.table_rank, i.chapter in ours)):
        if item.key not in seen:
            seen.add(item.key)
            out.append(item)
    return out


def sharing(items: Iterable[QueueItem]) -> dict[str, tuple[str, ...]]:
    """Config key -> the chapters whose runs include it (they read the same stored run)."""
    out: dict[str, dict[str, None]] = {}
    for item in items:
        out.setdefault(item.key, {})[item.chapter] = None
    return {k: tuple(v) for k, v in out.items()}


def priority(item: QueueItem, cost: float, first: list[tuple[str, str | None]] | None = None) -> tuple:
    """Seed 0 first; then the ``first`` (chapter, table or None) in their order; then headline
    rows, main tables, cheap runs."""
    first = first or []
    rank = next((i for i, (chapter, table) in enumerate(first)
                 if item.chapter == chapter and table in (None, item.table)), len(first))
    return (not item.first_seed, rank, not item.headline, item.table_rank, cost, item.chapter,
            item.table, item.row, item.column, item.seed)


# ----------------------------------------------------------------------------- the store (adapter)


def results_root() -> Path:
    """Where the queue stores runs: ``$FEDLIB_RESULTS`` (e.g. a GPU machine's $OUT/results, to
    be copied into the repository), else the repository's ``results/``; runs go in its ``runs/``."""
    env = os.environ.get("FEDLIB_RESULTS")
    return Path(env) if env else kit_stored.repo_results()


def left_out_lines() -> list[str]:
    """One line per file of the queue's stores (where it writes, and the repository's) that no reader
    uses (:func:`fedlib.results.list_store`), each saying it is left where it is."""
    lines = []
    for root in dict.fromkeys((runs_dir(results_root()), runs_dir(kit_stored.repo_results()))):
        lines += [f"{root.parent.name}/{root.name}/{line}: left out, not read (left as it is)"
                  for line in list_store(root).left_out]
    return lines


def answers(item: QueueItem, payload: dict) -> str | None:
    """None when a stored entry (checksum already verified) is a valid run of ``item``: the right
    schema, and it answers the item's key (its resolved config, rule versions and data, as the
    chapters judge it: ``fedlib.results.result_check``); else what is wrong."""
    from ..config import RunConfig, ScmConfig
    from ..results import check_result, placement_free, result_check, run_of

    if not isinstance(payload, dict):
        return "not a stored run"
    run = run_of(payload)
    config = item.config
    if isinstance(config, RunConfig):
        problem = check_result(run)
        if problem:
            return problem
        fingerprint = config.data_fingerprint()
        if not fingerprint.get("sha256"):  # data absent here: the file's own record of its data
            fingerprint = run["meta"].get("data") or {}
        return result_check(config, fingerprint)(run)
    stored_config = payload.get("config")
    if isinstance(config, ScmConfig):
        if not isinstance(run.get("methods"), dict):
            return "not a FedSCM pipeline result"
        try:
            stored = ScmConfig.make(stored_config)
        except ValueError:
            return "its config is not a valid FedSCM config"
        same = placement_free(stored.resolved()) == placement_free(config.resolved())
        return None if same else "its config is not the requested one"
    return None if stored_config == config.to_dict() else "its config is not the requested one"


def stored_state(item: QueueItem) -> tuple[bool, str | None]:
    """(stored, problem): whether a valid run of ``item`` is stored where the queue writes or in the
    repository, judged by content (checksum, schema, answering the key; regular files of bounded
    size only, read without moving anything); else the problem of a damaged file (None: no file)."""
    from ..cache import ResultCache

    found = None
    for root in dict.fromkeys((results_root(), kit_stored.repo_results())):
        store = ResultCache(runs_dir(root), protect=True)
        payload, problem = store.read(item.key)
        if payload is None and problem is None:
            continue
        if problem is None:
            try:
                problem = answers(item, payload)
            except Exception as err:  # noqa: BLE001 - a malformed entry is a damaged one
                problem = f"invalid content ({type(err).__name__})"
        if problem is None:
            return True, None
        found = found or f"{store.path(item.key)}: {problem}"
    return False, found


def is_stored(item: QueueItem) -> bool:
    """Whether a valid run of ``item`` is stored (:func:`stored_state`); when its data is not on this
    machine, also by the fingerprint the run recorded (``fedlib.app.kit.stored.StoredIndex``)."""
    if stored_state(item)[0]:
        return True
    if data_missing(item.dataset) is None:  # the data is here: the key above is the run's
        return False
    return StoredIndex.read().run_of(item.config) is not None


def store_payload(item: QueueItem, result: dict, profile: str) -> Path:
    """Keep ``result`` as ``results/runs/<key>.json.gz`` (``fedlib.results.store_run``), plus where
    the run sits in the queue. A damaged file or another run's there is set aside first (renamed)."""
    canonical = item.config.to_dict()
    result = {**result, "config": canonical}  # the chapter's config, whatever device ran it
    return store_run(item.key, canonical, result, results_root(), check=lambda entry: answers(item, entry),
                     queue={"profile": profile, "table": item.table, "row": item.row, "column": item.column,
                            "seed": item.seed})


# ----------------------------------------------------------------------------- claims

CLAIM_SUFFIX = ".claim"  # runs/.<key>.claim: {"pid", "host", "since"} of the queue running <key>


def _claim_path(key: str, root: Path | None = None) -> Path:
    return runs_dir(root if root is not None else results_root()) / f".{key}{CLAIM_SUFFIX}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


UNREADABLE_CLAIM_S = 60.0  # an unreadable claim may be being written: held this long after its last change


def claim_problem(owner: Any) -> str | None:
    """Why a claim's content is not a claim this queue writes (None when it is): a mapping with a pid
    (a positive integer) and a host (text). Such a claim holds nothing."""
    if not isinstance(owner, dict):
        return f"not a claim ({type(owner).__name__})"
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return f"its pid {str(pid)[:40]!r} is not a process id"
    if not isinstance(owner.get("host"), str):
        return f"its host {str(owner.get('host'))[:40]!r} is not a host name"
    return None


def claim_owner(key: str, root: Path | None = None) -> dict | None:
    """The claim on ``key`` (``{"pid", "host", "since"}``), or None when there is none. An unreadable
    claim (being written, or a folder, a link, a FIFO) is ``{"pid": None, "host": None, "since": <its
    last change>}``; a readable one that is no claim (:func:`claim_problem`) also has ``"invalid"``: why."""
    from ..cache import read_regular

    path = _claim_path(key, root)
    try:
        owner = json.loads(read_regular(path, limit=4096))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):
        owner = None
    if owner is not None:
        problem = claim_problem(owner)
        if problem is None:
            return owner
        return {"pid": None, "host": None, "since": 0.0, "invalid": problem}
    try:  # unreadable (being written, or its writer died mid-write): held, until a minute old
        since = os.lstat(path).st_mtime
    except OSError:
        since = time.time()
    return {"pid": None, "host": None, "since": since}


def _remove_claim_file(path: Path) -> None:
    """Remove a dead claim moved out of the way: a file, a link (not what it points to) or an old
    directory claim with what it holds."""
    import shutil
    import stat as _stat

    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if _stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def claim(key: str, root: Path | None = None, log: Callable[[str], None] | None = None) -> tuple[bool, dict | None]:
    """Claim the run ``key`` for this process: an atomic exclusive create of ``runs/.<key>.claim``
    holding the pid and host. A claim whose owner is dead (same host, pid gone), one that is no claim
    (:func:`claim_problem`: a pid that is not a process id, ...; reported to ``log`` in one line), or an
    unreadable one (a folder of an older queue, a link, a file cut short) over a minute old, is taken
    over and removed, leaving nothing behind; another host's claim holds until it is released.
    Returns (claimed, the current owner when not)."""
    import socket

    path = _claim_path(key, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = claim_owner(key, root)
            if owner is None:
                continue  # released meanwhile: try again
            invalid = owner.get("invalid")
            dead = invalid is not None or (owner.get("host") == socket.gethostname()
                                           and isinstance(owner.get("pid"), int) and not _alive(owner["pid"]))
            dead = dead or (owner.get("pid") is None
                            and time.time() - float(owner.get("since") or 0) > UNREADABLE_CLAIM_S)
            if not dead:
                return False, owner
            stale = path.with_name(f"{path.name}.stale-{os.getpid()}")
            _remove_claim_file(stale)  # a leftover of this pid's earlier take-over
            try:
                os.replace(path, stale)  # one taker wins the rename; the others find it gone
            except FileNotFoundError:
                continue
            moved = _read_moved(stale)
            if moved != owner and claim_problem(moved) is None:  # a live taker's fresh claim: put it back
                try:
                    os.link(stale, path)
                except FileExistsError:
                    pass
            elif invalid is not None and log is not None:
                log(f"claim {path.name}: {invalid}; taken over")
            _remove_claim_file(stale)
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(mine)
        return True, None
    return False, claim_owner(key, root)


def _read_moved(path: Path) -> Any:
    """The content of a claim file moved aside (None when it is not a readable claim file)."""
    from ..cache import read_regular

    try:
        return json.loads(read_regular(path, limit=4096))
    except (OSError, ValueError, RecursionError):
        return None


def release(key: str, root: Path | None = None) -> None:
    """Remove this process's claim on ``key`` (another owner's claim is left alone)."""
    owner = claim_owner(key, root)
    if owner is not None and owner.get("pid") == os.getpid():
        _claim_path(key, root).unlink(missing_ok=True)


# ----------------------------------------------------------------------------- data


def missing_data(items: Iterable[QueueItem]) -> dict[str, str | None]:
    """Dataset -> why its data is absent here (None: present), for the datasets of ``items``."""
    return {dataset: data_missing(dataset) for dataset in dict.fromkeys(i.dataset for i in items)}


# ----------------------------------------------------------------------------- cost


def model_flops(model: str, dataset: str) -> float | None:
    """Forward FLOPs of one ``dataset`` sample through ``model`` (``fedlib.population.step_flops``), or None
    for a model or dataset without a fixed input shape here. Counted once per pair."""
    key = (model, dataset)
    if key not in _MODEL_FLOPS:
        import torch

        from ..models import MODELS, build_model
        from ..plans import step_flops

        flops = None
        try:
            spec = data.dataset_spec(dataset) if model in MODELS else None
            if spec is not None:
                shape, classes = spec
                flops = step_flops(build_model(model, shape, classes), torch.zeros(*shape), 1) or None
        except ValueError:  # an unknown dataset, or a model that does not take its input (vgg11 needs 32 x 32)
            flops = None
        _MODEL_FLOPS[key] = flops
    return _MODEL_FLOPS[key]


_MODEL_FLOPS: dict[tuple[str, str], float | None] = {}


def device_kind(device: str | None) -> str:
    return "cuda" if device and ("cuda" in device.lower() or "gpu" in device.lower()) else "cpu"


@dataclass
class CostModel:
    """Seconds a run will take, from stored wall times (see the module docstring)."""

    samples: list[tuple[tuple, float]] = field(default_factory=list)  # (signature, seconds per pass)

    @classmethod
    def from_results(cls, root: Path | None = None) -> "CostModel":
        model = cls()
        roots = [root] if root is not None else sorted({runs_dir(results_root()), runs_dir(kit_stored.repo_results())})
        for run in (run for r in roots for run in list_store(r).runs):  # the valid entries only
            model.read_entry(run.entry)
        return model

    packed: list[tuple[tuple, float]] = field(default_factory=list)  # the same, of runs trained in packs
    # what this queue measured itself, on this machine: it comes before any older store (see estimate)
    fresh: list[tuple[tuple, float]] = field(default_factory=list)
    fresh_packed: list[tuple[tuple, float]] = field(default_factory=list)

    def read(self, path: Path, fresh: bool = False) -> None:
        """Add one stored run (skipped unless a valid store file: bounded size, valid checksum)."""
        payload, _ = ResultCache(path.parent, protect=True).read(key_of(path))
        if payload is not None:
            self.read_entry(payload, fresh)

    def read_entry(self, payload: dict, fresh: bool = False) -> None:
        """Add one stored entry (``stored_payload``); one whose fields do not make a sample is skipped."""
        try:
            config, wall = payload["config"], float(payload.get("wall_time") or 0)
            pack = ((payload.get("result") or {}).get("meta") or {}).get("pack") or {}
            self.add(config, wall, payload.get("device"), int(pack.get("size", 1)), fresh=fresh,
                     pack_methods=pack.get("methods"))
        except (ValueError, KeyError, TypeError, AttributeError, OSError):
            return

    def add(self, config, wall_time: float, device: str | None, pack_size: int = 1, fresh: bool = False,
            pack_methods: list[str] | None = None) -> None:
        """One stored run; a run of a pack of ``pack_size`` took the pack's wall time, shared by its runs. A
        packed sample whose pack records its methods is kept per unit of :data:`METHOD_FACTOR` (the pack's
        mean factor divided out), so :meth:`packed_rate` can scale it to any method."""
        if wall_time < 1.0:  # served from a cache, not a measurement
            return
        w = work(config)
        if w > 0:
            rate = wall_time / w / pack_size
            if pack_size > 1:  # a pack that did not record its mix counts as one of this run's method
                rate /= statistics.mean(METHOD_FACTOR.get(m, 1.0) for m in (pack_methods or [method_name(config)]))
            sample = (self._signature(config, device_kind(device)), rate)
            if fresh:
                (self.fresh_packed if pack_size > 1 else self.fresh).append(sample)
            (self.packed if pack_size > 1 else self.samples).append(sample)

    def packed_rate(self, config, device: str = "cpu") -> float | None:
        """Median seconds per sample pass of stored packed runs like this one (same device kind, runner,
        model and dataset), this queue's own measurements first, times the config's method factor; or None.
        (A pack's runs share one wall time whatever their methods; :meth:`add` keeps its samples per unit
        of factor.)"""
        found = self.packed_estimate(config, device)
        return None if found is None else found[0]

    def packed_estimate(self, config, device: str = "cpu") -> tuple[float, str] | None:
        """(:meth:`packed_rate`, how): 'measured', 'measured plain runs x augmentation', or for a model with
        no packed run on this kind of device the FLOP-scaled rate of other models' (:meth:`scaled_rate`)."""
        sig = self._signature(config, device_kind(device))
        factor = METHOD_FACTOR.get(method_name(config), 1.0)
        for samples in (self.fresh_packed, self.packed):
            rates = [r for s, r in samples if all(s[i] == sig[i] for i in (0, 1, 2, 4))]
            if rates:
                return statistics.median(rates) * factor, "measured"
        plain = self._plain_rate(config, (0, 1, 2, 4), device_kind(device), packed=True)
        if plain is not None:
            return plain * factor, "measured plain runs x augmentation"
        return self.scaled_rate(config, device, packed=True)

    def scaled_rate(self, config, device: str = "cpu", packed: bool = False) -> tuple[float, str] | None:
        """(seconds per pass, how) for a model with no stored run on this kind of device: the median rate of
        other models' runs of the same runner, dataset and augmentation, with FLOPs per sample within
        :data:`SCALE_WITHIN` times this model's (the same method's first, unless
        ``packed``: packed rates are per unit of method factor; runs of the same size first), each times
        :func:`model_flops` of this model over its own. None when there are none, or FLOPs are unknown."""
        sig = self._signature(config, device_kind(device))
        model, _, augment = sig[2].partition(" + ")
        mine = model_flops(model, sig[4])
        if mine is None:
            return None
        factor = METHOD_FACTOR.get(method_name(config), 1.0)

        def similar(other: str) -> bool:  # a model of like size (small ones are launch-bound on a GPU)
            flops = model_flops(other, sig[4])
            return other != model and flops is not None and 1 / SCALE_WITHIN <= mine / flops <= SCALE_WITHIN

        others = [(s, r) for s, r in (self.packed if packed else self.samples)
                  if s[:2] == sig[:2] and s[4] == sig[4] and s[2].partition(" + ")[2] == augment
                  and similar(s[2].partition(" + ")[0])]
        if packed:
            tiers = [([x for x in others if x[0][5] == sig[5]], factor), (others, factor)]
        else:
            same = [x for x in others if x[0][3] == sig[3]]
            tiers = [([x for x in same if x[0][5] == sig[5]], 1.0), (same, 1.0),
                     ([x for x in others if x[0][5] == sig[5]], factor), (others, factor)]
        for group, scale in tiers:
            if group:
                rates = [r * mine / model_flops(s[2].partition(" + ")[0], s[4]) for s, r in group]
                names = ", ".join(sorted({s[2].partition(" + ")[0] for s, _ in group}))
                return statistics.median(rates) * scale, f"scaled from {names} by FLOPs ({len(rates)})"
        return None

    @staticmethod
    def _signature(config, kind: str) -> tuple:
        model, augment = _get(config, "model"), _get(config, "augment")  # augmented runs are their own kind
        return (kind, runner_kind(config), f"{model} + {augment}" if augment else model, method_name(config),
                _get(config, "dataset"), work(config))

    def _plain_rate(self, config, fields: tuple, kind: str, packed: bool) -> float | None:
        """For an augmented config with no augmented sample: the median rate of its plain twin's samples."""
        if not _get(config, "augment"):
            return None
        sig = self._signature(config, kind)
        sig = sig[:2] + (_get(config, "model"),) + sig[3:]  # its plain twin
        rates = [r for samples in ((self.fresh_packed, self.packed) if packed else (self.fresh, self.samples))
                 for s, r in samples if all(s[i] == sig[i] for i in fields)]
        return statistics.median(rates) * AUGMENT_FACTOR if rates else None

    def estimate(self, config, device: str = "cpu") -> tuple[float, str]:
        """(seconds, how: 'measured (n runs)' or 'fallback')."""
        kind = device_kind(device)
        sig = self._signature(config, kind)
        factor = METHOD_FACTOR.get(method_name(config), 1.0)
        # the most similar stored runs (the signature's fields that match; see the module docstring); runs this
        # queue measured on this machine (same runner, model and dataset) come before older stores
        ladder = [(self.fresh, (0, 1, 2, 3, 4), 1.0), (self.fresh, (0, 1, 2, 4), factor)] + [
            (self.samples, fields, scale) for fields, scale in
            (((0, 1, 2, 3, 4), 1.0), ((0, 1, 2, 3), 1.0), ((0, 1, 2), factor), ((0, 2), factor))]
        for samples, fields, scale in ladder:
            rates = [r for s, r in samples if all(s[i] == sig[i] for i in fields)]
            if rates:
                return STARTUP_SECONDS + statistics.median(rates) * work(config) * scale, f"measured ({len(rates)})"
        plain = self._plain_rate(config, (0, 1, 2), kind, packed=False)
        if plain is not None:
            return STARTUP_SECONDS + plain * work(config) * factor, "measured plain runs x augmentation"
        scaled = self.scaled_rate(config, device)
        if scaled is not None:
            return STARTUP_SECONDS + scaled[0] * work(config), scaled[1]
        per_1000 = FALLBACK_SECONDS_PER_1000[kind].get(_get(config, "model"), FALLBACK_UNKNOWN_MODEL[kind])
        augment = AUGMENT_FACTOR if _get(config, "augment") else 1.0
        return STARTUP_SECONDS + per_1000 * work(config) / 1000 * factor * augment, "fallback"


# ----------------------------------------------------------------------------- planning


@dataclass
class Entry:
    item: QueueItem
    cost: float
    how: str
    stored: bool
    missing: str | None  # why it cannot run here
    chapters: tuple[str, ...] = ()  # every chapter whose runs include this one
    damaged: str | None = None  # a stored file that is not a valid run of it (set aside when it runs)

    @property
    def items(self) -> list[QueueItem]:
        return [self.item]

    def describe(self) -> str:
        return self.item.describe()


@dataclass
class Pack:
    """Pending runs trained as one population in one worker (``fedlib.packing``): the unit of work
    of a packed queue. Its runs share data, model, batch size, local epochs and rounds."""

    entries: list[Entry]
    cost: float  # seconds for the whole pack (see :func:`pack_cost`)
    how: str
    stored: bool = False
    missing: str | None = None

    @property
    def items(self) -> list[QueueItem]:
        return [e.item for e in self.entries]

    def split(self, runs: int) -> tuple["Pack | Entry", "Pack | Entry"]:
        """Its first ``runs`` runs and the rest, each as a pack (or one entry), the cost shared pro rata."""
        def part(entries):
            if len(entries) == 1:
                return entries[0]
            return Pack(entries, STARTUP_SECONDS + (self.cost - STARTUP_SECONDS) * len(entries) / len(self.entries),
                        self.how)

        return part(self.entries[:runs]), part(self.entries[runs:])

    def describe(self) -> str:
        first = self.entries[0].item
        tables = ", ".join(dict.fromkeys(f"{e.item.chapter} {e.item.table}" for e in self.entries))
        return f"pack of {len(self.entries)} ({tables}; {first.config.model}, {first.dataset})"


def plan(profile: str = "paper", only=None, device: str = "cpu", part: str = "all", datasets=None,
         items: list[QueueItem] | None = None, cost_model: CostModel | None = None, tables=None, seeds=None,
         first: list[tuple[str, str | None]] | None = None) -> list[Entry]:
    """The queue in order: every unique item with its estimated cost and state.

    ``part``: 'all', 'cpu' (Fashion-MNIST/MNIST) or 'gpu' (the rest); ``datasets``, ``tables``,
    ``seeds`` keep only those (a run several tables share is kept for any of them, under its one
    label); ``first``: (chapter, table or None) to put first, in order."""
    if part not in ("all", "cpu", "gpu"):
        raise ValueError(f"part: must be all, cpu or gpu (got {part!r})")
    items = list(items if items is not None else all_items(profile, only))
    _check_labels(items, tables, first)
    shared = sharing(items)
    backs: dict[str, set[str]] = {}  # config key -> every table its run backs (a shared run has one label)
    for i in items:
        backs.setdefault(i.key, set()).add(i.table)
    every = unique(items)
    items = [i for i in every if (part == "all" or i.gpu == (part == "gpu"))
             and (not datasets or i.dataset in datasets) and (not tables or backs[i.key] & set(tables))
             and (seeds is None or i.seed in seeds)]
    if every:  # a filter value no run has (a typo, a seed the profile does not run), or filters leaving nothing
        problem = _unmatched_value(every, part, datasets, seeds)
        if problem or not items:
            raise ValueError(problem or _nothing_together(every, part, datasets, tables, seeds))
    model = cost_model or CostModel.from_results()
    missing = missing_data(items)
    entries = []
    for i in items:
        stored, problem = stored_state(i)
        entries.append(Entry(i, *model.estimate(i.config, device), stored, missing[i.dataset],
                             shared.get(i.key, (i.chapter,)), damaged=problem))
    entries.sort(key=lambda e: priority(e.item, e.cost, first))
    return entries


def _unmatched_value(items: list[QueueItem], part: str, datasets, seeds) -> str | None:
    """The one-line error of the first filter value that matches no run of ``items`` by itself, naming
    the values there are; None when each matches some run."""
    known_seeds = sorted({i.seed for i in items})
    for seed in seeds if seeds is not None else []:
        if seed not in known_seeds:
            return f"--seed: no run in this queue has seed {seed} (its seeds: {', '.join(map(str, known_seeds))})"
    if seeds is not None and not seeds:
        return "--seed: no seed given"
    known_datasets = sorted({i.dataset for i in items})
    for name in datasets or []:
        if name not in known_datasets:
            return (f"--dataset: no run in this queue is on {str(name)[:60]!r} "
                    f"(its datasets: {', '.join(known_datasets)})")
    if part != "all" and not any(i.gpu == (part == "gpu") for i in items):
        return f"--{part}-only: no run in this queue is a {part.upper()} run"
    return None


def _nothing_together(items: list[QueueItem], part: str, datasets, tables, seeds) -> str:
    """The one-line error of filters that each match some run of ``items`` but leave none together."""
    given = ([f"--{part}-only"] if part != "all" else []) + (["--dataset " + " ".join(datasets)] if datasets else []) \
        + (["--table " + " ".join(repr(t) for t in tables)] if tables else []) \
        + (["--seed " + " ".join(map(str, seeds))] if seeds is not None else [])
    return f"no run in this queue matches {' with '.join(given)} together ({len(items)} run(s) before filtering)"


def _check_labels(items: list[QueueItem], tables, first) -> None:
    """Unknown ``tables`` or ``first`` (chapter, table) labels are one-line ValueErrors."""
    known = sorted({i.table for i in items})
    for table in tables or []:
        if table not in known:
            raise ValueError(f"--table: no table {table[:60]!r} in the queue; known: {', '.join(known)}")
    for chapter, table in first or []:
        of_chapter = sorted({i.table for i in items if i.chapter == chapter})
        if not of_chapter:
            raise ValueError(f"--first: no run of chapter {chapter[:60]!r} in the queue")
        if table is not None and table not in of_chapter:
            raise ValueError(f"--first: chapter {chapter} has no table {table[:60]!r}; known: {', '.join(of_chapter)}")


def _hms(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


def summary(entries: list[Entry], workers: int = 1) -> list[dict[str, Any]]:
    """One row per chapter and table: stored, pending, not runnable here, pending cost."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for e in entries:
        row = rows.setdefault((e.item.chapter, e.item.table), {"chapter": e.item.chapter, "table": e.item.table,
                                                              "stored": 0, "pending": 0, "not runnable": 0,
                                                              "pending hours": 0.0})
        if e.stored:
            row["stored"] += 1
        elif e.missing:
            row["not runnable"] += 1
        else:
            row["pending"] += 1
            row["pending hours"] += e.cost / 3600 / max(1, workers)
    return list(rows.values())


def format_list(entries: list[Entry], workers: int = 1, items: bool = True) -> str:
    lines = []
    if items:
        lines.append(f"{'state':8} {'est.':>9}  run")
        for e in entries:
            state = "stored" if e.stored else ("absent" if e.missing else "pending")
            lines.append(f"{state:8} {_hms(e.cost):>9}  {e.item.describe()} [{e.item.dataset}, {e.how}]"
                         + (f" (damaged file: {e.damaged[-160:]})" if e.damaged and not e.stored else ""))
        lines.append("")
    lines.append(f"{'chapter':12} {'table':28} {'stored':>6} {'pending':>7} {'absent':>6} {'pending h':>9}")
    rows = summary(entries, workers)
    for r in rows:
        lines.append(f"{r['chapter']:12} {r['table'][:28]:28} {r['stored']:6d} {r['pending']:7d} "
                     f"{r['not runnable']:6d} {r['pending hours']:9.1f}")
    total = [sum(r[k] for r in rows) for k in ("stored", "pending", "not runnable", "pending hours")]
    lines.append(f"{'total':12} {'':28} {total[0]:6d} {total[1]:7d} {total[2]:6d} {total[3]:9.1f}"
                 f"  (hours with {workers} worker(s))")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- running

def check_device(device: str) -> str:
    """``device`` when runs can start on it here ('cpu'; 'cuda' or 'cuda:N' when that CUDA device is on
    this machine: ``fedlib.limits.check_device``), else a one-line ``ConfigError`` (a ValueError)."""
    from ..limits import check_device as checked

    return checked(device, present=True, what="--device")


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
    """The finished results of ``items`` on ``device``, not stored: one item by its runner, or (``packed``)
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
        from ..scm_pipeline import run_pipelines

        return run_pipelines(configs, on_done=on_done)
    from ..run import run_pack

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


# ----------------------------------------------------------------------------- packs

# Until a packed GPU run is stored (meta.pack), a pack of R runs on CUDA is assumed to take the time of
# R / min(R, ASSUMED_GPU_PACK_SPEEDUP) separate runs, shown as "assumed". 1.5: packed over separate at
# R = 25 and 75 on an H100 (benchmarks/results/packed_nvidia-h100.json, CELM Table 1 CIFAR-10, reduced).
ASSUMED_GPU_PACK_SPEEDUP = 1.5
# A unit whose estimate is not measured (fallback or assumed) starts only if this many times its estimate
# fits in the budget: a pack's runs finish together, so one stopped at the budget stores none of them.
UNCALIBRATED_MARGIN = 1.5


def reserved(unit: "Entry | Pack") -> float:
    """Seconds of budget a unit needs before it starts: its estimate, with a margin unless measured."""
    return unit.cost * (1.0 if unit.how.startswith("measured") else UNCALIBRATED_MARGIN)


def item_value(item: QueueItem) -> float:
    """What storing a run is worth: the paper cells it backs, doubled for a first seed (it makes a cell
    measured) and for a headline row, divided by 1 + the table's rank (appendix tables count less)."""
    return len(item.cells) * (2.0 if item.first_seed else 1.0) * (2.0 if item.headline else 1.0) / (1 + item.table_rank)


def pack_cost(entries: list[Entry], device: str, cost_model: "CostModel") -> tuple[float, str]:
    """(seconds, how) of one pack: the measured seconds per sample pass of stored packed runs like these
    when there are any (for a model with none on this kind of device, other models' scaled by FLOPs:
    not counted as measured); else the separate runs' estimates, which on a CPU add up (it is arithmetic-bound)
    and on CUDA are divided by the assumed speed-up."""
    found = [cost_model.packed_estimate(e.item.config, device) for e in entries]
    if all(f is not None for f in found):  # each run at its method's share of the pack
        scaled = next((how for _, how in found if not how.startswith("measured")), None)
        return (STARTUP_SECONDS + sum(rate * work(e.item.config) for (rate, _), e in zip(found, entries)),
                "measured pack" if scaled is None else f"pack {scaled}")
    separate = sum(e.cost - STARTUP_SECONDS for e in entries)
    if device_kind(device) == "cuda":
        return STARTUP_SECONDS + separate / min(len(entries), ASSUMED_GPU_PACK_SPEEDUP), "assumed pack speed-up"
    return STARTUP_SECONDS + separate, "separate estimates"


def recost(units: list[Entry | Pack], stored: list[QueueItem], model: CostModel, device: str) -> None:
    """Re-estimate pending ``units`` in place once ``stored`` runs (just stored by this queue) are in the
    cost model as fresh measurements: a budgeted queue's first runs on a device calibrate the rest."""
    for item in stored:
        model.read(ResultCache(runs_dir(results_root()), protect=True).path(item.key), fresh=True)
    for unit in units:
        for entry in (unit.entries if isinstance(unit, Pack) else [unit]):
            entry.cost, entry.how = model.estimate(entry.item.config, device)
        if isinstance(unit, Pack):
            unit.cost, unit.how = pack_cost(unit.entries, device, model)


def plan_packs(entries: list[Entry], device: str = "cpu", max_rows: int = 256, max_runs: int | None = None,
               cost_model: "CostModel | None" = None,
               first: list[tuple[str, str | None]] | None = None) -> list[Entry | Pack]:
    """The pending runnable entries grouped into packs, most valuable per device-second first.

    Engine runs with equal ``fedlib.packing.pack_signature`` join one pack, taken in queue order, up
    to ``max_rows`` client rows per round (clients per round x runs) and ``max_runs`` runs; FedSCM
    federations with equal ``scm_pack_signature`` join packs of at most ``SCM_PACK_RUNS``
    (``fedlib.scm_pipeline.execute_many``); other runs stay single. Units are ordered by their best member's place (seed 0
    before seeds 1-2, then the ``first`` (chapter, table) in their order), then by value
    (:func:`item_value`) per estimated second."""
    from ..packing import pack_signature

    model = cost_model or CostModel.from_results()
    pending = [e for e in entries if not e.stored and not e.missing]
    groups: dict[tuple, list[list[Entry]]] = {}
    singles: list[Entry] = []
    for e in pending:
        if e.item.runner is run_scm and os.environ.get("FEDLIB_SCM_PACK", "on") != "off":  # (preflight's fallback)
            packs = groups.setdefault(("scm", *scm_pack_signature(e.item.config)), [[]])
            if len(packs[-1]) >= SCM_PACK_RUNS:
                packs.append([])
            packs[-1].append(e)
            continue
        if e.item.runner is not run_round:
            singles.append(e)
            continue
        packs = groups.setdefault(pack_signature(e.item.config), [[]])
        current = packs[-1]
        rows = sum(x.item.config.per_round for x in current) + e.item.config.per_round
        if current and (rows > max_rows or (max_runs is not None and len(current) >= max_runs)):
            packs.append(current := [])
        current.append(e)
    units: list[Entry | Pack] = list(singles)
    for sig, packs in groups.items():
        for members in packs:
            if len(members) == 1:
                units.append(members[0])
            elif sig[0] == "scm":  # only the one-shot stage and the post-training rounds share calls
                units.append(Pack(members, STARTUP_SECONDS + sum(e.cost - STARTUP_SECONDS for e in members),
                                  "separate estimates"))
            else:
                units.append(Pack(members, *pack_cost(members, device, model)))
    place = {id(e): n for n, e in enumerate(pending)}

    def order(unit) -> tuple:
        members = unit.entries if isinstance(unit, Pack) else [unit]
        best = min(place[id(e)] for e in members)
        first_seed = any(e.item.first_seed for e in members)
        wanted = min(priority(e.item, e.cost, first)[1] for e in members)  # its place in --first
        value = sum(item_value(e.item) for e in members)
        return (not first_seed, wanted, -value / max(unit.cost, 1e-9), best)

    return sorted(units, key=order)


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
    from ..cache import write_failure
    from ..results import stored_payload

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
                problem = f"could not store it ({write_failure(err, runs_dir(results_root()))})"
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
            from ..cache import write_failure

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
    share = (unit.cost - STARTUP_SECONDS) * len(kept) / len(unit.entries)
    return kept[0] if len(kept) == 1 else Pack(kept, STARTUP_SECONDS + share, unit.how)


def next_unit(pending: list[Entry | Pack], left: float | None, log=print,
              accept: Callable[[Entry | Pack], bool] | None = None) -> Entry | Pack | None:
    """Take from ``pending`` the next unit to start with ``left`` seconds of budget (None: no budget): the
    first whose :func:`reserved` fits (and that ``accept`` takes now: a backend with a free slot for it); a
    first pack too long for it is split first into the part that fits."""
    head = pending[0]
    if left is not None and isinstance(head, Pack) and reserved(head) > left:  # the part of it that fits
        margin = reserved(head) / head.cost
        per_run = margin * (head.cost - STARTUP_SECONDS) / len(head.entries)
        runs = int((left - margin * STARTUP_SECONDS) // max(per_run, 1e-9))
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
