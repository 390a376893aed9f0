"""The papers' main claims as computable statements, judged on stored runs.

A :class:`Claim` is a list of :class:`Comparison`\\ s that must all come out positive: each
compares a metric of one run cell (``(table, row, column)`` as the chapter's queue items
label it, see ``fedlib.app.queue``) with another's, seed by seed (paired on the seeds both
have), and states the margin as mean ± sample std (n) over those seeds with its 95 %
t-interval (``fedlib.stats``). The same comparison is made on the paper's published numbers
where the reference YAML has both cells.

A comparison's verdict (``stats.margin_verdict``): with n ≥ 3 paired seeds it *holds* when
the interval lies above 0, *does not hold* when it lies below, is *within noise* (its sign is
open) when it contains 0; with fewer it is *indicative (n seeds)*. Orthogonal to those, with
n ≥ 3 and a margin the paper reports, **the paper's margin is rejected** when our interval
excludes it (below it, or above it: a margin much larger than the paper's rejects it too), and
*inside our interval* otherwise (:func:`paper_margin_check`); below 3 seeds there is no
verdict of either kind.

A claim's verdict (:func:`judge`), the first that applies: *not yet measured* (no comparison
measured), *does not hold* (one comparison does not), *within noise* (one is), *indicative
(n seeds)* (one rests on fewer than 3 seeds; n the fewest), *partly measured* (the measured
ones hold, others are not measured), *holds* (every comparison holds). A claim of the paper's
text over "most settings" (``Claim.quantifier == MOST``) holds when more than half of its
comparisons hold and does not hold when at least half do not (a majority can no longer hold);
otherwise the same order applies. :attr:`Verdict.summary` states the claim in one line: on how
many comparisons it holds, does not hold, has its sign open, is indicative or has no runs, and
on how many the paper's margin is rejected.

Evidence comes from stored paper-profile runs (``results/runs/``) first; where a claim
has none, from the build profile's runs in the result cache, labelled as reduced. A stored
run counts for a queue item when it was made by the item's config (same resolved config and
rule versions: a run of another protocol or a superseded rule never counts) on the data it
recorded: its file's key is the config's key on the data fingerprint the run recorded. The
data need not be on this machine; where it is, it must have that fingerprint.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import pandas as pd
from IPython.display import HTML, Markdown, display

from .. import stats
from ..cache import ResultCache
from ..store import run_of
from ..stats import FAILS, HOLDS, INDICATIVE, NOISE
from . import chapters, queue
from .kit.claim_types import EVERY, MOST, Cell, Claim, Side, final
from .kit.sources import load_reference
from .kit.stored import Evidence, StoredIndex, evidence_of

PARTIAL, UNMEASURED = "partly measured", "not yet measured"
REJECTED, INSIDE = "the paper's margin is rejected", "the paper's margin is inside our interval"
DATA_ABSENT = "data not on this machine (fingerprint recorded)"


# ----------------------------------------------------------------------------- metrics (on result dicts)


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


def reading(side: Side, result: dict) -> float:
    """``side``'s metric of one run (:func:`metric`), given its ``arg`` where it has one."""
    fn = metric(side.metric)
    return fn(result) if side.arg is None else fn(result, side.arg)


# ----------------------------------------------------------------------------- claims


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

    @property
    def paper_check(self) -> str | None:
        """REJECTED / INSIDE (:func:`paper_margin_check`); None without a paper margin or 3 seeds."""
        return paper_margin_check(self.values, self.paper)

    @property
    def rejected(self) -> bool:
        return self.paper_check == REJECTED

    def verdict_text(self) -> str:
        """The sign verdict and, where it can be judged, the paper's margin's: "within noise; the paper's
        margin is rejected"."""
        verdict = self.verdict or UNMEASURED
        return verdict + (f"; {self.paper_check}" if self.paper_check else "")

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
        w = self.shown
        return "—" if w is None or w.paper is None else f"{w.paper:+.{digits}f}"

    @property
    def shown(self) -> Margin | None:
        """The comparison a claim's row shows: the deciding one, else (none measured) the first."""
        return self.worst if self.worst is not None else (self.margins[0] if self.margins else None)

    @property
    def n_rejected(self) -> int:
        return sum(m.rejected for m in self.margins)

    @property
    def n_testable(self) -> int:
        """Comparisons whose paper margin can be judged: one the paper reports, on ≥ 3 paired seeds."""
        return sum(m.paper_check is not None for m in self.margins)

    @property
    def summary(self) -> str:
        """The claim in one line: "does not hold on 2 of 3, sign open on 1 of 3; the paper's margin is
        rejected on 3 of 3" (:func:`summary_line`)."""
        return summary_line(self.margins)


def claims_of(chapter: str) -> list[Claim]:
    """The chapter's claims (its ``Paper.claims``), in its scorecard's order."""
    return list(chapters.record(chapter).claims)


def papers() -> dict[str, str]:
    """Chapter -> title of every paper (not our own chapters), in the book's page order."""
    return {name: chapters.record(name).title for name in chapters.papers()}


# ----------------------------------------------------------------------------- evidence


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
    data this machine lacks (``fedlib.app.kit.stored.evidence_of``)."""
    return evidence_of(queue.chapter_items(chapter, "paper"), index, absent)


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
        diffs = (reading(comp.better, better[s]) - (reading(comp.worse, worse[s]) if comp.worse else 0.0)
                 for s in seeds)
        values = [v for v in diffs if not math.isnan(v)]
        pb = _paper_value(reference, comp.better.ref or comp.better.cell)
        pw = _paper_value(reference, comp.worse.ref or comp.worse.cell) if comp.worse else 0.0
        out.append(Margin(comp.label, values, None if pb is None or pw is None else pb - pw))
    return out


def paper_margin_check(values: Iterable[float], paper: float | None) -> str | None:
    """Whether our 95 % interval of a paired margin excludes the margin the paper reports: REJECTED
    when it does (whichever side), INSIDE when it contains it; None without a paper margin or below
    ``stats.MIN_SEEDS`` seeds (indicative: no verdict of either kind)."""
    values = [v for v in values if v == v]
    if paper is None or paper != paper or len(values) < stats.MIN_SEEDS:
        return None
    lo, hi = stats.interval(values)
    return INSIDE if lo <= paper <= hi else REJECTED


def summary_line(ms: list[Margin]) -> str:
    """A claim's comparisons in one line: on how many of them it holds, does not hold, has its sign open
    (within noise), is indicative (fewer than 3 seeds) or has no runs yet, then on how many of those the
    paper reports a margin for (with ≥ 3 seeds) our interval rejects the paper's margin (or that it
    rejects none, or that none can be judged yet)."""
    n = len(ms)
    if not n:
        return "no comparison"
    classes = [m.verdict if m.verdict in (HOLDS, FAILS, NOISE) else INDICATIVE if m.measured else None for m in ms]
    parts = [f"{label} on {k} of {n}" for label, k in (
        ("holds", classes.count(HOLDS)), ("does not hold", classes.count(FAILS)), ("sign open", classes.count(NOISE)),
        ("indicative (< 3 seeds)", classes.count(INDICATIVE)), ("no runs yet", classes.count(None))) if k]
    testable = [m for m in ms if m.paper_check is not None]
    rejected = sum(m.rejected for m in testable)
    if rejected:
        tail = f"the paper's margin is rejected on {rejected} of {len(testable)}"
    elif testable:
        tail = f"the paper's margin is inside our interval on {len(testable)} of {len(testable)}"
    elif all(m.paper is None for m in ms):
        tail = "the paper states no margin"
    else:
        tail = f"the paper's margin is not testable yet (< {stats.MIN_SEEDS} seeds)"
    return ", ".join(parts) + "; " + tail


def _verdict(ms: list[Margin], quantifier: str = EVERY) -> tuple[str, Margin | None]:
    """The claim's verdict from its comparisons' (module docstring) and the comparison deciding it."""
    measured = [m for m in ms if m.measured]
    if not measured:
        return UNMEASURED, None
    if quantifier == MOST:
        holding = [m for m in measured if m.verdict == HOLDS]
        failing = [m for m in measured if m.verdict == FAILS]
        if 2 * len(holding) > len(ms):
            return HOLDS, min(holding, key=lambda m: m.interval[0])
        if 2 * len(failing) >= len(ms):
            return FAILS, min(failing, key=lambda m: m.mean)
    for verdict in (FAILS, NOISE) if quantifier == EVERY else (NOISE,):  # MOST: a failing one alone does not decide
        hit = [m for m in measured if m.verdict == verdict]
        if hit:
            return verdict, min(hit, key=lambda m: m.mean)
    few = [m for m in measured if m.n < stats.MIN_SEEDS]
    if few:
        fewest = min(m.n for m in few)
        return stats.indicative(fewest), min((m for m in few if m.n == fewest), key=lambda m: m.mean)
    weakest = min(measured, key=lambda m: m.interval[0])
    return (HOLDS if len(measured) == len(ms) else PARTIAL), weakest


def paper_verdict(ms: list[Margin], quantifier: str = EVERY) -> str:
    """The same claim on the paper's own numbers: "holds", "does not hold (k of n)" (k cells against
    it); for a MOST claim, "holds (k of n)" / "does not hold (k of n)" (k cells for it)."""
    known = [m.paper for m in ms if m.paper is not None]
    if not known:
        return "stated in the text"
    if quantifier == MOST:
        k = sum(v > 0 for v in known)
        verdict = f"{'holds' if 2 * k > len(known) else 'does not hold'} ({k} of {len(known)})"
    else:
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
    verdict, worst = _verdict(ms, claim.quantifier)
    measured = [m for m in ms if m.measured]
    seeds = max((m.n for m in measured), default=0)
    cells = {side.cell for comp in claim.comparisons for side in (comp.better, comp.worse) if side is not None}
    note = DATA_ABSENT if source == "stored paper profile" and measured and cells & (absent or set()) else ""
    return Verdict(claim, verdict, ms, source if measured else "—", paper_verdict(ms, claim.quantifier), worst, seeds,
                   note)


def _inputs(chapter: str, profile: str | None, stored: Evidence | None, build: Evidence | None,
            absent: set | None = None):
    """The paper's reference values, the stored evidence and the build profile's cached evidence."""
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
                 "summary", "from"]


def table(results: list[Verdict], links: bool = False, page: str = ""):
    """One row per claim: claim, decided by (a link when ``links``), the paper's verdict and
    margin, ours, our deciding margin (mean ± sample std (seeds)) with its 95 % t-interval, the
    one-line summary (:attr:`Verdict.summary`) and the evidence (with the data note)."""
    rows = []
    for v in results:
        where = v.claim.decided_by
        if links:
            where = f'<a href="{page}#{v.claim.anchor}">{where}</a>'
        source = v.source + (f"; {v.data_note}" if v.data_note else "")
        rows.append({"claim": v.claim.text, "decided by": where, "paper": v.paper_verdict,
                     "paper's margin": v.paper_margin_text(), "ours": v.verdict,
                     "our margin ± sd (n)": v.margin_text(),
                     "95 % interval": v.worst.interval_text() if v.worst is not None else "—",
                     "summary": v.summary, "from": source})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


COMPARISON_COLUMNS = ["claim", "comparison", "paper's margin", "our margin ± sd (n)", "95 % interval", "verdict",
                      "the paper's margin"]


def comparisons(results: list[Verdict]):
    """Every comparison of every claim: the paper's margin, ours (mean ± sample std (seeds)), its
    95 % t-interval, its verdict and whether the paper's margin is rejected (:func:`paper_margin_check`;
    "—" without a paper margin or 3 seeds)."""
    rows = [{"claim": v.claim.text, "comparison": m.label,
             "paper's margin": "—" if m.paper is None else f"{m.paper:+.2f}", "our margin ± sd (n)": m.text(),
             "95 % interval": m.interval_text(), "verdict": m.verdict or UNMEASURED,
             "the paper's margin": m.paper_check or "—"}
            for v in results for m in v.margins]
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


COLOURS = {HOLDS: "#d9f2d9", FAILS: "#f8d7d7", NOISE: "#fde2c4", INDICATIVE: "#e8e0f5", PARTIAL: "#fff3cd",
           UNMEASURED: "#eeeeee"}
REPRODUCES_COLOURS = {"yes": COLOURS[HOLDS], "no": COLOURS[FAILS], INDICATIVE: COLOURS[INDICATIVE],
                      "—": COLOURS[UNMEASURED]}
METHOD_NOTE = (f"Margins are ours, paired on the seeds both cells have: mean ± sample std (ddof 1) with the number "
               f"of seeds in brackets; the interval is the {stats.INTERVAL_NAME}. A comparison holds when the "
               f"interval lies above 0, does not hold when it lies below, is within noise (its sign is open) when "
               f"it contains 0. Orthogonal to those, the paper's margin is rejected when our interval excludes the "
               f"margin the paper reports, on either side (a margin much larger than the paper's rejects it too). "
               f"Below {stats.MIN_SEEDS} seeds a comparison is only indicative, with no verdict of either kind.")


def colour(verdict: str) -> str:
    return COLOURS.get(verdict.split(" (")[0] if verdict.startswith(INDICATIVE) else verdict, "")


def _coloured(frame, column: str = "ours"):
    """A :func:`table` frame without its index, each verdict of ours on its colour."""
    return frame.style.hide(axis="index").map(lambda v: f"background-color: {colour(v)}", subset=[column])


# ----------------------------------------------------------------------------- HTML (the status page, the scorecards)
# Tables that fit the text column (about 650 px in a 1280 px window): a few columns whose long texts wrap
# (book/_static/fedlib.css, class fedlib-claims); a number "mean ± sd (n)" or an interval never wraps apart.


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _sub(inner_html: str) -> str:
    return f'<div class="fedlib-sub">{inner_html}</div>'


def _nw(text: Any) -> str:
    return f'<span class="fedlib-nowrap">{_e(text)}</span>'


def _check_badge(m: Margin | None) -> str:
    """"rejected by ours" / "inside our interval" under a paper's margin (nothing where it cannot be judged)."""
    check = None if m is None else m.paper_check
    if check == REJECTED:
        return _sub('<span class="fedlib-rejected">rejected by our interval</span>')
    return _sub("inside our interval") if check == INSIDE else ""


def _table(columns: list[tuple[str, int]], body: str, cls: str = "fedlib-claims") -> str:
    """A fixed-layout table: ``columns`` are (header html, width in %)."""
    cols = "".join(f'<col style="width: {w}%">' for _, w in columns)
    head = "".join(f"<th>{h}</th>" for h, _ in columns)
    return (f'<div class="fedlib-table-wrap"><table class="{cls}"><colgroup>{cols}</colgroup>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


def _margin_cells(m: Margin | None) -> str:
    """The paper's margin (and whether ours rejects it), then ours ± sd (n) over its 95 % interval."""
    paper = "—" if m is None or m.paper is None else f"{m.paper:+.2f}"
    ours = "—" if m is None else m.text()
    interval = "" if m is None or not m.measured else _sub(_nw(m.interval_text()))
    return (f'<td class="fedlib-num">{_nw(paper)}{_check_badge(m)}</td>'
            f'<td class="fedlib-num">{_nw(ours)}{interval}</td>')


def comparisons_html(v: Verdict) -> str:
    """Every comparison of one claim: its label, the paper's margin, ours ± sd (n) with its interval, and
    its verdict (the sign's, then the paper's margin's)."""
    body = ""
    for m in v.margins:
        verdict = m.verdict or UNMEASURED
        check = _sub(_e(m.paper_check)) if m.paper_check else ""
        body += (f"<tr><td>{_e(m.label)}</td>{_margin_cells(m)}"
                 f'<td style="background-color: {colour(verdict)}">{_e(verdict)}{check}</td></tr>')
    return _table([("comparison", 27), ("paper's margin", 19), ("ours ± sd (n)<br>95 % interval", 24),
                   ("verdict", 30)], body, "fedlib-claims fedlib-comparisons")


def claims_html(results: list[Verdict], page: str = "") -> str:
    """One row per claim that fits the text column: the claim (what decides it, which comparison the row
    shows, the evidence), the paper's margin (and whether ours rejects it), our margin ± sd (n) with its
    95 % interval, and the verdict with the one-line summary; under it, a details row with every
    comparison (:func:`comparisons_html`)."""
    body = ""
    for v in results:
        shown = v.shown
        source = "no runs yet" if v.source == "—" else v.source + (f"; {v.data_note}" if v.data_note else "")
        about = (f'decided by <a href="{_e(page)}#{_e(v.claim.anchor)}">{_e(v.claim.decided_by)}</a>'
                 + (f" · row: {_e(shown.label)}" if shown is not None and len(v.margins) > 1 else "")
                 + f" · from: {_e(source)}")
        paper = "—" if shown is None or shown.paper is None else f"{shown.paper:+.2f}"
        ours = "—" if shown is None else shown.text()
        interval = "" if shown is None or not shown.measured else _sub(_nw(shown.interval_text()))
        body += (f'<tr class="fedlib-claim"><td>{_e(v.claim.text)}{_sub(about)}</td>'
                 f'<td class="fedlib-num">{_nw(paper)}{_check_badge(shown)}{_sub("paper: " + _e(v.paper_verdict))}</td>'
                 f'<td class="fedlib-num">{_nw(ours)}{interval}</td>'
                 f'<td class="fedlib-verdict" style="background-color: {colour(v.verdict)}"><b>{_e(v.verdict)}</b>'
                 f"{_sub(_e(v.summary))}</td></tr>"
                 f'<tr class="fedlib-details"><td colspan="4"><details><summary>its {len(v.margins)} '
                 f"comparison{'s' if len(v.margins) != 1 else ''}</summary>{comparisons_html(v)}</details></td></tr>")
    return _table([("claim", 32), ("paper's margin", 15), ("our margin ± sd (n)<br>95 % interval", 23),
                   ("verdict", 30)], body)


def numbers_html(frames: dict[str | None, Any]) -> str:
    """The numbers behind the claims (:func:`numbers` frames, by paper name; None: no group row): the cell
    (table · row · column, then the metric and where ours comes from, wrapping), the paper's value,
    ours ± sd (n), and whether ours reproduces the paper's, on its colour."""
    body = ""
    for name, frame in frames.items():
        if name is not None:
            body += f'<tr class="fedlib-group"><th colspan="4">{_e(name)}</th></tr>'
        for r in frame.to_dict("records"):
            cell = f"{_e(r['table'])} · {_e(r['row'])} · {_e(r['column'])}"
            reproduces = r["reproduces"]
            key = "yes" if reproduces == "yes" else "no" if reproduces == "no" else (
                INDICATIVE if INDICATIVE in reproduces else "—")
            source = "no runs yet" if r["from"] == "—" else r["from"]
            body += (f"<tr><td>{cell}{_sub(_e(r['metric']) + ' · from: ' + _e(source))}</td>"
                     f'<td class="fedlib-num">{_nw(r["paper ± std"])}</td>'
                     f'<td class="fedlib-num">{_nw(r["ours ± sd (n)"])}</td>'
                     f'<td style="background-color: {REPRODUCES_COLOURS[key]}">{_e(reproduces)}</td></tr>')
    return _table([("cell", 46), ("paper", 16), ("ours ± sd (n)", 20), ("reproduces", 18)], body,
                  "fedlib-claims fedlib-numbers")


def scorecard(chapter: str, profile: str | None = None):
    """The chapter's claims and our verdicts, as an HTML table linking to the deciding table (every
    comparison one click away under each claim), then the numbers behind them."""
    results = verdicts(chapter, profile)
    tally = count(results)
    head = (f"<p><b>Scorecard.</b> {tally['n_claims']} claim(s) of the paper, judged on stored paper-profile runs "
            f"(the build profile's runs only where none is stored): {tally['n_hold']} hold(s); the paper's margin "
            f"is rejected on {tally['n_rejected']} of the {tally['n_testable']} comparison(s) where it can be "
            f"judged. {_e(METHOD_NOTE)} Each claim's row shows the comparison that decides it; every comparison "
            f"is under it, then the numbers behind them.</p>")
    return HTML(head + claims_html(results) + f"<p>{_e(REPRODUCTION_NOTE)}</p>"
                + numbers_html({None: numbers(chapter, profile)}))


def count(judged: list[Verdict]) -> dict[str, int]:
    """Claims per verdict, how many rest on stored paper-profile runs (and of those, how many on runs
    whose data is not on this machine), and the paper's margins: comparisons where it can be judged
    (``n_testable``), where ours rejects it (``n_rejected``), claims with at least one rejected."""
    c = Counter(v.verdict.split(" (")[0] if v.verdict.startswith(INDICATIVE) else v.verdict for v in judged)
    return {"n_claims": len(judged), "n_hold": c[HOLDS], "n_fail": c[FAILS], "n_noise": c[NOISE],
            "n_indicative": c[INDICATIVE], "n_partial": c[PARTIAL], "n_open": c[UNMEASURED],
            "n_stored": sum(v.source == "stored paper profile" for v in judged),
            "n_data_absent": sum(bool(v.data_note) for v in judged),
            "n_comparisons": sum(len(v.margins) for v in judged),
            "n_testable": sum(v.n_testable for v in judged), "n_rejected": sum(v.n_rejected for v in judged),
            "n_claims_rejected": sum(v.n_rejected > 0 for v in judged)}


def show_verdicts(profile: str | None = None) -> dict[str, int]:
    """Shows every paper's claims table (the status page), each linking to its chapter, with every
    comparison one click away; returns :func:`count`."""
    judged = []
    display(Markdown(METHOD_NOTE))
    for chapter, label in papers().items():
        judged += (results := verdicts(chapter, profile))
        display(Markdown(f"**{label}**"), HTML(claims_html(results, page=f"{chapter}.html")))
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
                    values = [v for v in (reading(side, r) for r in runs.values()) if not math.isnan(v)]
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
    """:func:`numbers` of every paper (the status page), grouped by paper: each cell (wrapping), the
    paper's value, ours "mean ± sd (n)" on the same scale (percent for accuracies), and whether ours
    reproduces it (:func:`numbers_html`)."""
    return HTML(numbers_html({name: numbers(chapter, profile) for chapter, name in papers().items()}))
