"""Planning the queue: every chapter's items, their order (:func:`priority`), the entries to run (:func:`plan`), their
list and summary (the CLI's report), and packing runs that train together (:func:`plan_packs`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

from ...packing import pack_signature
from ...store import Store
from .. import chapters
from ..chapters import profiles
from ..kit.items import QueueItem, run_round, run_scm, work
from ..kit.sources import check_only

# read as costs.STARTUP_SECONDS: one value, where a test patches it
from . import cost as costs
from .cost import CostModel, device_kind
from .store import missing_data, stored_state

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
    """Every item of a chapter's profile (its ``Paper.runs``), duplicates included; a profile that
    does not fit the chapter's schema is one ``ProfileError`` line."""
    return list(chapters.record(chapter).runs(profiles.load(chapter, profile)))


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
            return Pack(entries, costs.STARTUP_SECONDS + (self.cost - costs.STARTUP_SECONDS) * len(entries) / len(self.entries),
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
        return (costs.STARTUP_SECONDS + sum(rate * work(e.item.config) for (rate, _), e in zip(found, entries)),
                "measured pack" if scaled is None else f"pack {scaled}")
    separate = sum(e.cost - costs.STARTUP_SECONDS for e in entries)
    if device_kind(device) == "cuda":
        return costs.STARTUP_SECONDS + separate / min(len(entries), ASSUMED_GPU_PACK_SPEEDUP), "assumed pack speed-up"
    return costs.STARTUP_SECONDS + separate, "separate estimates"


def recost(units: list[Entry | Pack], stored: list[QueueItem], model: CostModel, device: str) -> None:
    """Re-estimate pending ``units`` in place once ``stored`` runs (just stored by this queue) are in the
    cost model as fresh measurements: a budgeted queue's first runs on a device calibrate the rest."""
    for item in stored:
        model.read(Store.writing().path(item.key), fresh=True)
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
                units.append(Pack(members, costs.STARTUP_SECONDS + sum(e.cost - costs.STARTUP_SECONDS for e in members),
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
