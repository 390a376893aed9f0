"""The papers' main claims as computable statements, judged on stored runs.

A :class:`Claim` is a list of :class:`Comparison`\\ s that must all come out positive: each
compares a metric of one run cell (``(table, row, column)`` as the chapter's queue items
label it, see ``fedlib.app.queue``) with another's, seed by seed (paired on the seeds both
have), and states the margin as mean ± sample std (n) over those seeds with its 95 %
t-interval (``fedlib.stats``). The same comparison is made on the paper's published numbers
where the reference YAML has both cells.

A comparison's verdict (``stats.margin_verdict``): with n ≥ 3 paired seeds it *holds* when
the interval lies above 0, *does not hold* when it lies below, is *within noise* when it
contains 0; with fewer it is *indicative (n seeds)*. A claim's verdict (:func:`judge`), the
first that applies: *not yet measured* (no comparison measured), *does not hold* (one
comparison does not), *within noise* (one is), *indicative (n seeds)* (one rests on fewer
than 3 seeds; n the fewest), *partly measured* (the measured ones hold, others are not
measured), *holds* (every comparison holds).

Evidence comes from stored paper-profile runs (``results/runs/``) first; where a claim
has none, from the build profile's runs in the result cache, labelled as reduced. A stored
run counts for a queue item when it was made by the item's config (same resolved config and
rule versions: a run of another protocol or a superseded rule never counts) on the data it
recorded: its file's key is the config's key on the data fingerprint the run recorded. The
data need not be on this machine; where it is, it must have that fingerprint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .. import stats
from ..cache import ResultCache
from ..results import run_of
from ..stats import FAILS, HOLDS, INDICATIVE, NOISE
from . import chapters, queue
from .queue import StoredIndex  # noqa: F401 - read here, defined with the queue's store

PARTIAL, UNMEASURED = "partly measured", "not yet measured"
DATA_ABSENT = "data not on this machine (fingerprint recorded)"

Cell = tuple[str, str, str]


# ----------------------------------------------------------------------------- metrics (on result dicts)


def final(result: dict, key: str = "accuracy") -> float:
    """A run's final test metric ``key`` in % (NaN when it has none)."""
    value = result["final"].get(key)
    return float("nan") if value is None else 100.0 * float(value)


# the readings of a run any claim may use; a paper's own are in its record (``Paper.metrics``)
METRICS: dict[str, Callable[..., float]] = {"accuracy": final}


def metric(name: str) -> Callable[..., float]:
    """The reading of a run called ``name``: ``METRICS``' or a chapter's (``Paper.metrics``)."""
    if name in METRICS:
        return METRICS[name]
    for paper in chapters.registry().values():
        if name in paper.metrics:
            return paper.metrics[name]
    raise KeyError(f"metric: unknown metric {name!r}")


# ----------------------------------------------------------------------------- claims


@dataclass(frozen=True)
class Side:
    """A metric of one run cell; ``ref``: the reference YAML's cell for the paper's number."""

    cell: Cell
    metric: str = "accuracy"
    arg: Any = None
    ref: Cell | None = None

    def value(self, result: dict) -> float:
        fn = metric(self.metric)
        return fn(result) if self.arg is None else fn(result, self.arg)


@dataclass(frozen=True)
class Comparison:
    label: str
    better: Side
    worse: Side | None = None  # None: ``better``'s metric must be > 0


@dataclass(frozen=True)
class Claim:
    """A paper's claim; it lives in its chapter's ``Paper.claims``."""

    text: str
    decided_by: str  # the table or figure, as the chapter page names it
    anchor: str  # the section id of that table on the chapter page
    comparisons: tuple[Comparison, ...]
    unit: str = "points"


@dataclass
class Margin:
    label: str
    values: list[float]  # per paired seed
    paper: float | None = None

    @property
    def measured(self) -> bool:
        return bool(self.values)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return stats.mean_std(self.values).mean

    @property
    def std(self) -> float:
        """Sample std (ddof 1) over the paired seeds; NaN below 2."""
        return stats.mean_std(self.values).std

    @property
    def interval(self) -> tuple[float, float]:
        return stats.interval(self.values)

    @property
    def verdict(self) -> str | None:
        return stats.margin_verdict(self.values)

    def text(self, digits: int = 2) -> str:
        """"+1.23 ± 0.45 (3)": mean ± sample std (seeds); "—" when not measured."""
        if not self.measured:
            return "—"
        return ("+" if self.mean >= 0 else "") + stats.pm(self.mean, self.std, self.n, digits)

    def interval_text(self, digits: int = 2) -> str:
        return stats.interval_text(self.values, digits)


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    margins: list[Margin]
    source: str  # "stored paper profile" or "<profile> profile (reduced)" or "—"
    paper_verdict: str = "—"
    worst: Margin | None = None  # the comparison that decides the verdict
    seeds: int = 0
    data_note: str = ""  # DATA_ABSENT where a run it rests on used data this machine lacks

    def margin_text(self, digits: int = 2) -> str:
        """The deciding comparison's margin: "+1.23 ± 0.45 (3) (label)"."""
        w = self.worst
        if w is None or not w.measured:
            return "—"
        return f"{w.text(digits)} ({w.label})"

    def paper_margin_text(self, digits: int = 2) -> str:
        w = self.worst if self.worst is not None else (self.margins[0] if self.margins else None)
        return "—" if w is None or w.paper is None else f"{w.paper:+.{digits}f}"


def cells_row(rows: Iterable[str], better: str, worse: str, table: str = "Table 1",
              ref: str | None = None, metric: str = "accuracy") -> tuple[Comparison, ...]:
    """``better`` against ``worse`` (columns) on each of ``rows`` of ``table``; ``ref``: the reference
    table holding the paper's values of those cells, when it is another; ``metric``: how a run is read."""
    def side(row, column):
        return Side((table, row, column), metric=metric, ref=(ref, row, column) if ref else None)

    return tuple(Comparison(row, side(row, better), side(row, worse)) for row in rows)


def claims_of(chapter: str) -> list[Claim]:
    """The chapter's claims (its ``Paper.claims``), in its scorecard's order."""
    return list(chapters.record(chapter).claims)


def papers() -> dict[str, str]:
    """Chapter -> title of every paper (not our own chapters), in the book's page order."""
    return {name: chapters.record(name).title for name in chapters.papers()}


# ----------------------------------------------------------------------------- evidence


Evidence = dict[Cell, dict[int, dict]]  # queue cell -> seed -> result dict


def evidence_in(store: ResultCache, chapter: str, profile: str) -> Evidence:
    """The cells of the chapter's ``profile`` queue items (their own table/row/column) whose runs
    ``store`` holds under the items' keys (nothing is computed): the build profile's cache."""
    out: Evidence = {}
    for item in queue.chapter_items(chapter, profile):
        entry = store.get(item.key)
        if entry is not None:
            out.setdefault((item.table, item.row, item.column), {})[item.seed] = run_of(entry)
    return out


def stored_evidence(chapter: str, index: StoredIndex | None = None, absent: set | None = None) -> Evidence:
    """Stored paper-profile runs of the chapter's queue items (``results/runs/``), whether or not
    their data is on this machine; ``absent`` (when given) collects the cells whose runs used
    data this machine lacks."""
    index = StoredIndex.read() if index is None else index
    fingerprints: dict[str, dict] = {}
    out: Evidence = {}
    for item in queue.chapter_items(chapter, "paper"):
        config = item.config
        local = fingerprints.setdefault(config.dataset, config.data_fingerprint())
        hit = index.run_of(config, local)
        if hit is not None:
            cell = (item.table, item.row, item.column)
            out.setdefault(cell, {})[item.seed] = hit[0]
            if not hit[1] and absent is not None:
                absent.add(cell)
    return out


def cached_evidence(chapter: str, profile: str) -> Evidence:
    """The build profile's runs already in the result cache (fedlib.run's and the FedSCM pipeline's)."""
    return evidence_in(ResultCache(), chapter, profile)


# ----------------------------------------------------------------------------- judging


def _paper_entry(reference, cell: Cell | None) -> tuple[float, float] | None:
    """(value, std) of a reference cell (std NaN where the paper gives none), or None."""
    if reference is None or cell is None:
        return None
    hit = reference[(reference.table == cell[0]) & (reference.row == cell[1]) & (reference.column == cell[2])]
    if hit.empty:
        return None
    std = float(hit["std"].iloc[0]) if "std" in hit else float("nan")
    return float(hit.value.iloc[0]), std


def _paper_value(reference, cell: Cell | None) -> float | None:
    entry = _paper_entry(reference, cell)
    return None if entry is None else entry[0]


def margins(claim: Claim, evidence: Evidence, reference=None) -> list[Margin]:
    """Each comparison's per-seed margins, paired on the seeds both cells have."""
    out = []
    for comp in claim.comparisons:
        better = evidence.get(comp.better.cell, {})
        worse = evidence.get(comp.worse.cell, {}) if comp.worse else None
        seeds = sorted(set(better) & set(worse)) if worse is not None else sorted(better)
        diffs = (comp.better.value(better[s]) - (comp.worse.value(worse[s]) if comp.worse else 0.0) for s in seeds)
        values = [v for v in diffs if not math.isnan(v)]
        pb = _paper_value(reference, comp.better.ref or comp.better.cell)
        pw = _paper_value(reference, comp.worse.ref or comp.worse.cell) if comp.worse else 0.0
        out.append(Margin(comp.label, values, None if pb is None or pw is None else pb - pw))
    return out


def _verdict(ms: list[Margin]) -> tuple[str, Margin | None]:
    """The claim's verdict from its comparisons' (module docstring) and the comparison deciding it."""
    measured = [m for m in ms if m.measured]
    if not measured:
        return UNMEASURED, None
    for verdict in (FAILS, NOISE):
        hit = [m for m in measured if m.verdict == verdict]
        if hit:
            return verdict, min(hit, key=lambda m: m.mean)
    few = [m for m in measured if m.n < stats.MIN_SEEDS]
    if few:
        fewest = min(m.n for m in few)
        return stats.indicative(fewest), min((m for m in few if m.n == fewest), key=lambda m: m.mean)
    weakest = min(measured, key=lambda m: m.interval[0])
    return (HOLDS if len(measured) == len(ms) else PARTIAL), weakest


def paper_verdict(ms: list[Margin]) -> str:
    known = [m.paper for m in ms if m.paper is not None]
    if not known:
        return "stated in the text"
    verdict = "holds" if all(v > 0 for v in known) else f"does not hold ({sum(v <= 0 for v in known)} of {len(known)})"
    return verdict + ("" if len(known) == len(ms) else f" on the {len(known)} cells it reports")


def judge(claim: Claim, stored: Evidence, build: Evidence | None = None, profile: str | None = None,
          reference=None, absent: set | None = None) -> Verdict:
    """The claim's verdict from stored runs; from the build profile's runs only where no
    comparison has a stored run. ``absent``: cells whose stored runs used data not on this machine."""
    ms = margins(claim, stored, reference)
    source = "stored paper profile"
    if not any(m.measured for m in ms) and build is not None:
        ms_build = margins(claim, build, reference)
        if any(m.measured for m in ms_build):
            ms, source = ms_build, f"{profile} profile (reduced protocol)"
    verdict, worst = _verdict(ms)
    measured = [m for m in ms if m.measured]
    seeds = max((m.n for m in measured), default=0)
    cells = {side.cell for comp in claim.comparisons for side in (comp.better, comp.worse) if side is not None}
    note = DATA_ABSENT if source == "stored paper profile" and measured and cells & (absent or set()) else ""
    return Verdict(claim, verdict, ms, source if measured else "—", paper_verdict(ms), worst, seeds, note)


def _inputs(chapter: str, profile: str | None, stored: Evidence | None, build: Evidence | None,
            absent: set | None = None):
    """The paper's reference values, the stored evidence and the build profile's cached evidence."""
    from .sources import load_reference

    name = chapters.record(chapter).reference
    try:
        reference = None if name is None else load_reference(name)
    except FileNotFoundError:
        reference = None
    stored = stored_evidence(chapter, absent=absent) if stored is None else stored
    if build is None and profile is not None and profile != "paper":
        build = cached_evidence(chapter, profile)
    return reference, stored, build


def verdicts(chapter: str, profile: str | None = None, stored: Evidence | None = None,
             build: Evidence | None = None) -> list[Verdict]:
    """Every claim of ``chapter`` judged (stored runs; the build ``profile``'s cached runs beside)."""
    absent: set = set()
    reference, stored, build = _inputs(chapter, profile, stored, build, absent)
    return [judge(c, stored, build, profile, reference, absent) for c in claims_of(chapter)]


TABLE_COLUMNS = ["claim", "decided by", "paper", "paper's margin", "ours", "our margin ± sd (n)", "95 % interval",
                 "from"]


def table(results: list[Verdict], links: bool = False, page: str = ""):
    """One row per claim: claim, decided by (a link when ``links``), the paper's verdict and
    margin, ours, our deciding margin (mean ± sample std (seeds)) with its 95 % t-interval,
    and the evidence (with the data note)."""
    import pandas as pd

    rows = []
    for v in results:
        where = v.claim.decided_by
        if links:
            where = f'<a href="{page}#{v.claim.anchor}">{where}</a>'
        source = v.source + (f"; {v.data_note}" if v.data_note else "")
        rows.append({"claim": v.claim.text, "decided by": where, "paper": v.paper_verdict,
                     "paper's margin": v.paper_margin_text(), "ours": v.verdict,
                     "our margin ± sd (n)": v.margin_text(),
                     "95 % interval": v.worst.interval_text() if v.worst is not None else "—", "from": source})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def comparisons(results: list[Verdict]):
    """Every comparison of every claim: the paper's margin, ours (mean ± sample std (seeds)),
    its 95 % t-interval and its verdict."""
    import pandas as pd

    rows = [{"claim": v.claim.text, "comparison": m.label,
             "paper's margin": "—" if m.paper is None else f"{m.paper:+.2f}", "our margin ± sd (n)": m.text(),
             "95 % interval": m.interval_text(), "verdict": m.verdict or UNMEASURED}
            for v in results for m in v.margins]
    return pd.DataFrame(rows, columns=["claim", "comparison", "paper's margin", "our margin ± sd (n)",
                                       "95 % interval", "verdict"])


COLOURS = {HOLDS: "#d9f2d9", FAILS: "#f8d7d7", NOISE: "#fde2c4", INDICATIVE: "#e8e0f5", PARTIAL: "#fff3cd",
           UNMEASURED: "#eeeeee"}
METHOD_NOTE = (f"Margins are ours, paired on the seeds both cells have: mean ± sample std (ddof 1) with the number "
               f"of seeds in brackets; the interval is the {stats.INTERVAL_NAME}. A comparison holds when the "
               f"interval lies above 0, does not hold when it lies below, is within noise when it contains 0; "
               f"below {stats.MIN_SEEDS} seeds it is only indicative.")


def colour(verdict: str) -> str:
    return COLOURS.get(verdict.split(" (")[0] if verdict.startswith(INDICATIVE) else verdict, "")


def _coloured(frame, column: str = "ours"):
    """A :func:`table` frame without its index, each verdict of ours on its colour."""
    return frame.style.hide(axis="index").map(lambda v: f"background-color: {colour(v)}", subset=[column])


def scorecard(chapter: str, profile: str | None = None):
    """The chapter's claims and our verdicts, as an HTML table linking to the deciding table,
    then every comparison with its margin, interval and seeds."""
    from IPython.display import HTML

    results = verdicts(chapter, profile)
    frame = table(results, links=True)
    n_holds = int((frame["ours"] == HOLDS).sum())
    head = (f"<p><b>Scorecard.</b> {len(frame)} claim(s) of the paper, judged on stored paper-profile runs "
            f"(the build profile's runs only where none is stored): {n_holds} hold(s). {METHOD_NOTE} The deciding "
            f"comparison is shown; every comparison follows, then the numbers behind them.</p>")
    cells = numbers(chapter, profile)[NUMBER_COLUMNS].drop(columns="paper").rename(columns={"paper ± std": "paper"})
    return HTML(head + _coloured(frame).to_html() + _coloured(comparisons(results), "verdict").to_html()
                + f"<p>{REPRODUCTION_NOTE}</p>" + cells.style.hide(axis="index").to_html())


def count(judged: list[Verdict]) -> dict[str, int]:
    """Claims per verdict, and how many rest on stored paper-profile runs (and of those, how many
    on runs whose data is not on this machine)."""
    from collections import Counter

    c = Counter(v.verdict.split(" (")[0] if v.verdict.startswith(INDICATIVE) else v.verdict for v in judged)
    return {"n_claims": len(judged), "n_hold": c[HOLDS], "n_fail": c[FAILS], "n_noise": c[NOISE],
            "n_indicative": c[INDICATIVE], "n_partial": c[PARTIAL], "n_open": c[UNMEASURED],
            "n_stored": sum(v.source == "stored paper profile" for v in judged),
            "n_data_absent": sum(bool(v.data_note) for v in judged)}


def show_verdicts(profile: str | None = None) -> dict[str, int]:
    """Shows every paper's claims table (the status page), each linking to its chapter, and its
    comparisons; returns :func:`count`."""
    from IPython.display import HTML, Markdown, display

    judged = []
    display(Markdown(METHOD_NOTE))
    for chapter, label in papers().items():
        judged += (results := verdicts(chapter, profile))
        display(Markdown(f"**{label}**"), HTML(_coloured(table(results, links=True, page=f"{chapter}.html")).to_html()),
                HTML(f"<details><summary>{label}: every comparison</summary>"
                     + _coloured(comparisons(results), "verdict").to_html() + "</details>"))
    return count(judged)


REPRODUCTION_NOTE = (f"A cell of ours reproduces the paper's when |ours − paper| ≤ "
                     f"max({stats.TOLERANCE_POINTS:g} points, the paper's std, our 95 % t-interval's half-width); "
                     f"below {stats.MIN_SEEDS} seeds the answer is indicative.")
NUMBER_COLUMNS = ["table", "row", "column", "metric", "paper", "paper ± std", "ours ± sd (n)", "reproduces", "from"]


def numbers(chapter: str, profile: str | None = None, stored: Evidence | None = None,
            build: Evidence | None = None):
    """The numbers behind the claims: for each side of each comparison, the paper's value (± its
    std) and ours (stored paper-profile runs, mean ± sample std (seeds); the build profile's runs
    only where none is stored), and whether ours reproduces the paper (``stats.reproduces``).
    Also the columns ``ours``, ``± std`` and ``seeds`` as numbers."""
    import pandas as pd

    absent: set = set()
    reference, stored, build = _inputs(chapter, profile, stored, build, absent)
    rows, seen = [], set()
    for claim in claims_of(chapter):
        for comp in claim.comparisons:
            for side in (comp.better, comp.worse):
                if side is None or (side.cell, side.metric, side.arg) in seen:
                    continue
                seen.add((side.cell, side.metric, side.arg))
                entry = _paper_entry(reference, side.ref or side.cell)
                ref = (side.ref or side.cell) if entry is not None else side.cell  # the paper's cell, else ours
                paper, paper_std = entry or (float("nan"), float("nan"))
                source, values = "—", []
                for name, ev in (("stored paper profile", stored), (f"{profile} profile (reduced)", build or {})):
                    runs = ev.get(side.cell, {})
                    values = [v for v in (side.value(r) for r in runs.values()) if not math.isnan(v)]
                    if values:
                        source = name + (f"; {DATA_ABSENT}" if ev is stored and side.cell in absent else "")
                        break
                spread = stats.mean_std(values)
                label = side.metric if side.arg is None else f"{side.metric} ({side.arg})"
                rows.append({"table": ref[0], "row": ref[1], "column": ref[2] if side.arg is None else side.arg,
                             "metric": label, "paper": paper, "paper ± std": stats.pm(paper, paper_std),
                             "ours ± sd (n)": stats.pm(*spread) if values else "—",
                             "reproduces": stats.reproduction_text(values, paper if paper == paper else None,
                                                                   paper_std),
                             "from": source, "ours": spread.mean, "± std": spread.std if spread.n > 1 else None,
                             "seeds": spread.n})
    return pd.DataFrame(rows, columns=NUMBER_COLUMNS + ["ours", "± std", "seeds"])


def all_numbers(profile: str | None = None):
    """:func:`numbers` of every paper (the status page), a column naming the paper; each value of
    ours is one text "mean ± sd (n)" beside the paper's on the same scale (percent for accuracies)."""
    import pandas as pd

    frame = pd.concat([numbers(chapter, profile).assign(**{"paper (name)": name})
                       for chapter, name in papers().items()])
    shown = ["paper (name)", "table", "row", "column", "metric", "paper ± std", "ours ± sd (n)", "reproduces", "from"]
    return frame[shown].rename(columns={"paper ± std": "paper"}).style.hide(axis="index")
