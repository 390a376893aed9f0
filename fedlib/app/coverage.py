"""What backs each of our numbers: for every cell of every paper table, the best evidence we have.

A cell is a (table, row, column) of ``book/reference/<paper>.yaml``, or of a chapter's own
tables that the paper gives no numbers for. The chapter's queue items (``fedlib.app.queue``)
say which runs back which cells; a cell's level is:

  paper protocol, all seeds    every seed of the paper profile stored under results/
  paper protocol, fewer seeds  some of them stored
  reduced protocol only        nothing stored; the book's build profile runs it, reduced
  queued, not run yet          in the paper profile's queue, not in the build profile
  not runnable here            nothing stored, and its data is absent here or no run of ours backs it

A cell whose runs' data is absent says what it needs and the command that stores its runs where the
data is present ("needs EMNIST (not on this machine): python -m fedlib results --chapter celm --table
'Table 7' where it is present"). The papers' cells are those of the reference YAMLs, all of them
(``reference_cells``: every entry of the five YAMLs, CELM's Table 7 included); ``per_level`` counts them apart
from our own tables' cells.

A stored run counts whether or not its data is on this machine (``kit.stored.StoredIndex``: judged by
the data fingerprint the run recorded); such cells say "data not on this machine (fingerprint
recorded)". The data only decides what can be re-run here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd
from IPython.display import Markdown, display

from . import claims, queue
from .chapters import papers as every_paper
from .chapters import record
from .claims import DATA_ABSENT
from .kit.sources import load_reference
from .kit.stored import StoredIndex

LEVELS = ("paper protocol, all seeds", "paper protocol, fewer seeds", "reduced protocol only",
          "queued, not run yet", "not runnable here")
COLOURS = dict(zip(LEVELS, ("#2e7d32", "#a5d6a7", "#fff59d", "#ffe0b2", "#e0e0e0")))
SHORT = dict(zip(LEVELS, ("all seeds", "fewer seeds", "reduced", "queued", "absent")))  # a grid cell's text
# first words of reference rows/columns naming data we do not have anywhere
DATA_NAMES = {"CIFAR-100": "cifar100", "EuroSAT": "eurosat", "SVHN": "svhn", "FedISIC": "FedISIC-2019"}
# how a cell's note names a dataset its runs need (fedlib.data's names; others as they are)
DATA_LABELS = {"mnist": "MNIST", "fmnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
               "svhn": "SVHN", "emnist": "EMNIST", "eurosat": "EuroSAT"}


def needs(dataset: str, chapter: str, table: str) -> str:
    """A cell's note when its runs' data is absent here: the data it needs and the command that stores its runs."""
    return (f"needs {DATA_LABELS.get(dataset, dataset)} (not on this machine): python -m fedlib results "
            f"--chapter {chapter} --table '{table}' where it is present")


def reference_cells(papers: list[str] | None = None) -> dict[str, int]:
    """The papers' cells per paper (None: every paper with a reference YAML): its distinct (table, row,
    column) entries, read from ``book/reference/<paper>.yaml``."""
    out = {}
    for paper in _papers(papers):
        name = record(paper).reference
        if name is not None:
            ref = load_reference(name)
            out[paper] = len(set(zip(ref.table, ref.row, ref.column)))
    return out


def _matches(pattern: tuple[str, str, str], cell: tuple[str, str, str]) -> bool:
    return all(p == "*" or p == c for p, c in zip(pattern, cell))


def _backs(item, cell: tuple[str, str, str], in_paper: bool) -> bool:
    """Whether a queue item's run backs ``cell``: a paper cell its ``cells`` match, else its own cell."""
    return any(_matches(p, cell) for p in item.cells) if in_paper else (item.table, item.row, item.column) == cell


@dataclass
class Cell:
    table: str
    row: str
    column: str
    level: str
    detail: str
    in_paper: bool


def stored_items(index=None) -> Callable:
    """Whether a queue item's run is stored (``kit.stored.StoredIndex``: the item's config on the data
    fingerprint the run recorded, the data here or not)."""
    index = StoredIndex.read() if index is None else index
    fingerprints: dict[str, dict] = {}

    def stored(item) -> bool:
        local = fingerprints.setdefault(item.dataset, item.config.data_fingerprint())
        return index.run_of(item.config, local) is not None

    return stored


def coverage(chapter: str, build_profile: str = "quick", paper_items=None, build_items=None, stored=None,
             reference=None) -> list[Cell]:
    """Every cell of ``chapter``'s paper tables (and its own tables) with its level.

    ``stored``: whether an item's run is stored (default :func:`stored_items`), or a set of the
    stored keys."""
    paper_items = queue.chapter_items(chapter, "paper") if paper_items is None else paper_items
    build_items = queue.chapter_items(chapter, build_profile) if build_items is None else build_items
    if stored is None:
        stored = stored_items()
    elif not callable(stored):
        stored = (lambda keys: lambda item: item.key in keys)(set(stored))
    if reference is None:
        reference = load_reference(chapter)
    missing = queue.missing_data(paper_items)
    ref_cells = [(t, r, c) for t, r, c in zip(reference.table, reference.row, reference.column)]
    ref_tables = set(reference.table)
    own = []  # the chapter's own cells: tables the paper gives no numbers for, or runs backing no paper cell
    for item in paper_items:
        cell = (item.table, item.row, item.column)
        backs_paper = any(_matches(p, r) for p in item.cells for r in ref_cells)
        if (item.table not in ref_tables or not backs_paper) and cell not in own:
            own.append(cell)
    out = []
    for cell, in_paper in [(c, True) for c in dict.fromkeys(ref_cells)] + [(c, False) for c in own]:
        backing = [i for i in paper_items if _backs(i, cell, in_paper)]
        out.append(Cell(*cell, *_level(cell, backing, build_items, stored, missing, in_paper, chapter), in_paper))
    return out


def _level(cell, backing, build_items, stored, missing, in_paper, chapter) -> tuple[str, str]:
    if not backing:
        name = next((n for label, n in DATA_NAMES.items() if cell[1].startswith(label) or cell[2].startswith(label)),
                    None)
        return LEVELS[4], f"{name} data absent" if name else "no run of ours backs it"
    absent = sorted({i.dataset for i in backing if missing.get(i.dataset)})
    seeds = sorted({i.seed for i in backing})
    have = [i for i in backing if stored(i)]
    if have:
        level = LEVELS[0] if sorted({i.seed for i in have}) == seeds else LEVELS[1]
        detail = f"{len({i.seed for i in have})} of {len(seeds)} seeds stored"
        return level, detail + (f"; {DATA_ABSENT}" if any(missing.get(i.dataset) for i in have) else "")
    if absent and len(absent) == len({i.dataset for i in backing}):
        return LEVELS[4], "; ".join(needs(d, chapter, cell[0]) for d in absent)
    if any(_backs(i, cell, in_paper) for i in build_items):
        return LEVELS[2], "the build profile's run"
    return LEVELS[3], f"{len(backing)} run(s) queued"


def frame(cells: list[Cell]):
    return pd.DataFrame([c.__dict__ for c in cells])


def grid(cells: list[Cell], table: str):
    """Row x column of one table: each cell's level."""
    f = frame([c for c in cells if c.table == table])
    rows = list(dict.fromkeys(f.row))
    cols = list(dict.fromkeys(f.column))
    return f.pivot(index="row", columns="column", values="level").reindex(index=rows, columns=cols)


def styled_grid(cells: list[Cell], table: str):
    """The grid coloured by level (the cell text is the level's short name)."""
    g = grid(cells, table)
    return (g.style.map(lambda v: f"background-color: {COLOURS.get(v, '#ffffff')}; font-size: 85%")
            .format(lambda v: SHORT.get(v, "") if isinstance(v, str) else ""))


def counts(cells: list[Cell]):
    """Cells per table and level."""
    f = frame(cells)
    out = f.groupby(["table", "level"]).size().unstack(fill_value=0)
    return out.reindex(columns=[lv for lv in LEVELS if lv in out.columns])


def _papers(papers: list[str] | None) -> list[str]:
    """The chapters a page shows: ``papers``, or (None) every paper's, in the book's order."""
    return every_paper() if papers is None else list(papers)


def show(papers: list[str] | None, build_profile: str = "quick") -> dict[str, list[Cell]]:
    """Shows the legend, then per paper (None: every paper) its grids (its tables, then ours) and the cells not
    runnable here with the reason; returns {paper: its cells}."""
    display(Markdown(" · ".join(f'<span style="background-color: {COLOURS[lv]}; padding: 0 6px">{s}</span> {lv}'
                                for lv, s in SHORT.items())))
    cells_by_paper = {paper: coverage(paper, build_profile) for paper in _papers(papers)}
    for paper, cells in cells_by_paper.items():
        display(Markdown(f"**{paper}**: paper tables, then ours"))
        for table in dict.fromkeys(c.table for c in cells):
            ours = "" if any(c.in_paper for c in cells if c.table == table) else " (ours; no published numbers)"
            display(Markdown(f"**{table}**{ours}"), styled_grid(cells, table))
        absent = frame([c for c in cells if c.level == LEVELS[4]])
        if len(absent):
            display(Markdown("Not runnable here, and why:"),
                    absent.groupby(["table", "detail"]).size().rename("cells").reset_index().style.hide(axis="index"))
        away = sum(DATA_ABSENT in c.detail for c in cells)
        if away:
            display(Markdown(f"{away} cell(s) rest on stored runs whose data is not on this machine: they count as "
                             f"measured ({DATA_ABSENT}); only re-running them needs the data."))
    return cells_by_paper


def reproduction(papers: list[str] | None, build_profile: str = "quick"):
    """Per paper (None: every paper), the cells its claims compare that have a number of ours and one of the
    paper's, and how many reproduce it (``stats.reproduces``, the rule of the status page and the scorecards:
    |ours − paper| ≤ max(2 points, the paper's std, our 95 % interval's half-width)); below 3
    seeds a yes or no is indicative and counted apart."""
    rows = []
    for paper in _papers(papers):
        f = claims.numbers(paper, build_profile)
        judged = f[f["reproduces"] != "—"]
        firm = judged[~judged["reproduces"].str.contains("indicative")]
        rows.append({"paper": paper, "cells compared": len(judged),
                     "reproduce": int((firm["reproduces"] == "yes").sum()),
                     "do not": int((firm["reproduces"] == "no").sum()),
                     "indicative (< 3 seeds)": len(judged) - len(firm)})
    return pd.DataFrame(rows).set_index("paper")


def per_level(cells_by_paper: dict[str, list[Cell]]):
    """Cells per paper and level; glue values: cells in all, those backed by stored paper-protocol runs, and
    the papers' cells (``n_paper_cells``, every cell of the reference YAMLs) with their stored share
    (``n_stored_paper_cells``)."""
    total = pd.concat({paper: frame(cells).groupby("level").size() for paper, cells in cells_by_paper.items()},
                      axis=1).T
    total = total.reindex(columns=[lv for lv in LEVELS if lv in total.columns]).fillna(0).astype(int)
    stored = int(total.reindex(columns=list(LEVELS[:2]), fill_value=0).values.sum())
    paper = [c for cells in cells_by_paper.values() for c in cells if c.in_paper]
    return total, {"n_cells": int(total.values.sum()), "n_stored_cells": stored, "n_paper_cells": len(paper),
                   "n_stored_paper_cells": sum(c.level in LEVELS[:2] for c in paper)}
