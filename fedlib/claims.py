"""The papers' main claims as computable statements, judged on stored runs.

A :class:`Claim` is a list of :class:`Comparison`\\ s that must all come out positive: each
compares a metric of one run cell (``(table, row, column)`` as the chapter's queue items
label it, see ``fedlib.queue``) with another's, seed by seed (paired on the seeds both
have), and states the margin as mean ± std over those seeds. The same comparison is made on
the paper's published numbers where the reference YAML has both cells.

Verdicts (:func:`judge`): *holds* (every comparison measured and positive), *does not
hold* (a measured comparison is ≤ 0; the worst margin is shown), *partly measured* (the
measured ones are positive, others are not yet measured), *not yet measured*.

Evidence comes from stored paper-profile runs (``results/runs/``) first; where a claim
has none, from the build profile's runs in the result cache, labelled as reduced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from . import queue
from .cache import ResultCache
from .results import RunResult, run_of, runs_dir

HOLDS, FAILS, PARTIAL, UNMEASURED = "holds", "does not hold", "partly measured", "not yet measured"

Cell = tuple[str, str, str]


# ----------------------------------------------------------------------------- metrics (on result dicts)


def _final(result: dict, key: str = "accuracy") -> float:
    value = result["final"].get(key)
    return float("nan") if value is None else 100.0 * float(value)


def _rare_class_accuracy(result: dict) -> float:
    from .chapters.celm import rare_class_accuracy

    return rare_class_accuracy(RunResult.from_dict(result))


def _maverick_reward_gap(result: dict) -> float:
    """Mean over rounds of the Maverick's MS-GTG reward minus its GTG-Shapley reward (FedMS Fig. 2)."""
    roles = np.asarray(result["meta"]["client_roles"])
    mav = np.flatnonzero(roles == "maverick")
    gtg = np.asarray([h["diagnostics"]["rewards_gtg"] for h in result["history"]], dtype=float)
    ms = np.asarray([h["diagnostics"]["rewards_ms"] for h in result["history"]], dtype=float)
    return float((ms[:, mav] - gtg[:, mav]).mean())


def _maverick_participation(result: dict) -> float:
    from .chapters.fedms import participation

    return participation(RunResult.from_dict(result))["maverick"]


def _last_100_accuracy(result: dict) -> float:
    from .chapters.flce import last_rounds_mean

    return last_rounds_mean(RunResult.from_dict(result), "accuracy", 100)


def _scm_accuracy(result: dict, label: str) -> float:
    return 100.0 * float(result["methods"][label]["accuracy"])


def _selected_minus_unselected(result: dict, gamma: str) -> float:
    from .chapters.fedscm import selected_vs_unselected

    split = selected_vs_unselected(result, gamma)
    return split["selected"]["target accuracy (%)"] - split["unselected"]["target accuracy (%)"]


METRICS: dict[str, Callable[..., float]] = {
    "accuracy": _final,
    "rare_class_accuracy": _rare_class_accuracy,
    "maverick_reward_gap": _maverick_reward_gap,
    "maverick_participation": _maverick_participation,
    "last_100_accuracy": _last_100_accuracy,
    "scm_accuracy": _scm_accuracy,
    "selected_minus_unselected": _selected_minus_unselected,
}


# ----------------------------------------------------------------------------- claims


@dataclass(frozen=True)
class Side:
    """A metric of one run cell; ``ref``: the reference YAML's cell for the paper's number."""

    cell: Cell
    metric: str = "accuracy"
    arg: Any = None
    ref: Cell | None = None

    def value(self, result: dict) -> float:
        fn = METRICS[self.metric]
        return fn(result) if self.arg is None else fn(result, self.arg)


@dataclass(frozen=True)
class Comparison:
    label: str
    better: Side
    worse: Side | None = None  # None: ``better``'s metric must be > 0


@dataclass(frozen=True)
class Claim:
    chapter: str
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
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else float("nan")

    @property
    def std(self) -> float:
        return float(np.std(self.values)) if len(self.values) > 1 else float("nan")


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    margins: list[Margin]
    source: str  # "stored paper profile" or "<profile> profile (reduced)" or "—"
    paper_verdict: str = "—"
    worst: Margin | None = None
    seeds: int = 0

    def margin_text(self, digits: int = 2) -> str:
        w = self.worst
        if w is None or not w.measured:
            return "—"
        text = f"{w.mean:+.{digits}f}" + (f" ± {w.std:.{digits}f}" if w.std == w.std else "")
        return f"{text} ({w.label}; {len(w.values)} seed{'s' if len(w.values) != 1 else ''})"


def _cells_row(rows: Iterable[str], better: str, worse: str, table: str = "Table 1",
               ref: str | None = None) -> tuple[Comparison, ...]:
    """``better`` against ``worse`` (columns) on each of ``rows`` of ``table``; ``ref``: the reference
    table holding the paper's values of those cells, when it is another."""
    def side(row, column):
        return Side((table, row, column), ref=(ref, row, column) if ref else None)

    return tuple(Comparison(row, side(row, better), side(row, worse)) for row in rows)


def _celm_rows(prefixes=("F.MNIST", "CIFAR-10")) -> list[str]:
    return [f"{p} {s}" for p in prefixes for s in ("Dir. (0.01)", "Dir. (0.05)", "Dir. (0.10)", "PLS", "SLS")]


def _fedms_rows(prefixes=("MNIST", "CIFAR-10")) -> list[str]:
    return [f"{p} {s}" for p in prefixes for s in ("Dir(10)", "Dir(1)", "Dir(0.1)")]


def _scm_columns() -> list[str]:
    return [f"CIFAR-10 α={a}" for a in ("1.0", "0.1", "0.01")]


CLAIMS: tuple[Claim, ...] = (
    Claim("celm", "CELM beats uniform FedAvg on every Table 1 split", "Table 1", "table-1-accuracy-under-label-skew",
          _cells_row(_celm_rows(), "CELM", "FedAvg")),
    Claim("celm", "CELM beats ShapFed, the strongest contribution-aware baseline, on every Table 1 split", "Table 1",
          "table-1-accuracy-under-label-skew", _cells_row(_celm_rows(), "CELM", "ShapFed")),
    Claim("celm", "CELM has the best rare-class accuracy under a Maverick split (F.MNIST)", "Table 2",
          "table-2-mavericks",
          tuple(Comparison(f"vs {m}", Side(("Table 2", "F.MNIST Maverick", "CELM"), "rare_class_accuracy",
                                           ref=("Table 2", "F.MNIST Rare Class Acc.", "CELM")),
                           Side(("Table 2", "F.MNIST Maverick", m), "rare_class_accuracy",
                                ref=("Table 2", "F.MNIST Rare Class Acc.", m)))
                for m in ("FedAvg", "CFFL", "CGSV", "ShapFed"))),
    Claim("logitfl", "UWA beats simple averaging at k = 2 (MNIST)", "Headline", "the-headline-mnist-two-classes-per-client",
          _cells_row(["MNIST k=2"], "UWA", "Simple avg.", "k sweep", ref="Headline")),
    Claim("logitfl", "The meta-model beats UWA at k = 2 (MNIST)", "Headline", "the-headline-mnist-two-classes-per-client",
          _cells_row(["MNIST k=2"], "Meta-model", "UWA", "k sweep", ref="Headline")),
    Claim("logitfl", "UWA beats simple averaging at every k (2, 5, 8)", "k sweep",
          "accuracy-versus-heterogeneity-k-classes-per-client",
          _cells_row([f"MNIST k={k}" for k in (2, 5, 8)], "UWA", "Simple avg.", "k sweep", ref="Headline")),
    Claim("fedms", "FedMS gives the Maverick a larger reward than GTG-Shapley (Fig. 2)", "Fig. 2",
          "fig-2-the-maverick-matters-and-ms-gtg-rewards-it",
          (Comparison("MS-GTG − GTG reward of the Maverick",
                      Side(("Fig. 2", "with Maverick", "GTG / MS-GTG rewards"), "maverick_reward_gap")),),
          unit="reward"),
    Claim("fedms", "FedMS beats FedAvg on every Table 1 split (Mavericks + Dir)", "Table 1",
          "table-1-accuracy-with-two-mavericks-mnist", _cells_row(_fedms_rows(), "FedMS", "FedAvg")),
    Claim("fedms", "FedMS lets the Mavericks take part more often than FedAvg (Table 2)", "Table 2",
          "table-2-participation-of-adversaries-free-riders-and-mavericks",
          (Comparison("Maverick participation", Side(("Table 2", "FedMS", "participation"), "maverick_participation",
                                                     ref=("Table 2", "FedMS", "Mavericks")),
                      Side(("Table 2", "FedAvg", "participation"), "maverick_participation",
                           ref=("Table 2", "FedAvg", "Mavericks"))),), unit="% of rounds"),
    Claim("flce", "FLCE is more accurate than FedAvg on CIFAR-10 (IID and Non-IID)", "Table 2",
          "table-2-accuracy-and-f1-fidelity",
          tuple(Comparison(row, Side(("Table 2", row, "FLCE"), "last_100_accuracy", ref=("Table 2", row, "FLCE Acc")),
                           Side(("Table 2", row, "FedAvg"), "last_100_accuracy", ref=("Table 2", row, "FedAvg Acc")))
                for row in ("CIFAR-10 Non-IID", "CIFAR-10 IID"))),
    Claim("fedscm", "FedSCM (γ = 0.67) beats FedAvg on every CIFAR-10 Table 2 column", "Table 2",
          "tables-23-label-and-quantity-shift",
          tuple(Comparison(col, Side(("Table 2", "all methods", col), "scm_accuracy", "FedSCM (γ = 0.67)",
                                     ref=("Table 2", "FedSCM (γ = 0.67)", col)),
                           Side(("Table 2", "all methods", col), "scm_accuracy", "FedAvg", ref=("Table 2", "FedAvg", col)))
                for col in _scm_columns())),
    Claim("fedscm", "FedSCM's selection recovers the experts: the selected clients are more accurate on the target "
          "than the others (γ = 0.67)", "Fig. 5", "fig-5-which-clients-does-fedscm-pick",
          tuple(Comparison(col, Side(("Table 2", "all methods", col), "selected_minus_unselected", "0.67"))
                for col in _scm_columns())),
)


def claims_of(chapter: str) -> list[Claim]:
    return [c for c in CLAIMS if c.chapter == chapter]


# ----------------------------------------------------------------------------- evidence


Evidence = dict[Cell, dict[int, dict]]  # queue cell -> seed -> result dict


def evidence_in(store: ResultCache, chapter: str, profile: str) -> Evidence:
    """The cells of the chapter's ``profile`` queue items (their own table/row/column) whose runs
    ``store`` holds (nothing is computed)."""
    out: Evidence = {}
    for item in queue.chapter_items(chapter, profile):
        entry = store.get(item.key)
        if entry is not None:
            out.setdefault((item.table, item.row, item.column), {})[item.seed] = run_of(entry)
    return out


def stored_evidence(chapter: str) -> Evidence:
    """Stored paper-profile runs (``results/runs/``; a reader never moves a stored run)."""
    return evidence_in(ResultCache(runs_dir(queue.repo_results()), protect=True), chapter, "paper")


def cached_evidence(chapter: str, profile: str) -> Evidence:
    """The build profile's runs already in the result cache (fedlib.run's and the FedSCM pipeline's)."""
    return evidence_in(ResultCache(), chapter, profile)


# ----------------------------------------------------------------------------- judging


def _paper_value(reference, cell: Cell | None) -> float | None:
    if reference is None or cell is None:
        return None
    hit = reference[(reference.table == cell[0]) & (reference.row == cell[1]) & (reference.column == cell[2])]
    return None if hit.empty else float(hit.value.iloc[0])


def margins(claim: Claim, evidence: Evidence, reference=None) -> list[Margin]:
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


def _verdict(ms: list[Margin]) -> str:
    measured = [m for m in ms if m.measured]
    if not measured:
        return UNMEASURED
    if any(m.mean <= 0 for m in measured):
        return FAILS
    return HOLDS if len(measured) == len(ms) else PARTIAL


def paper_verdict(ms: list[Margin]) -> str:
    known = [m.paper for m in ms if m.paper is not None]
    if not known:
        return "stated in the text"
    verdict = "holds" if all(v > 0 for v in known) else f"does not hold ({sum(v <= 0 for v in known)} of {len(known)})"
    return verdict + ("" if len(known) == len(ms) else f" on the {len(known)} cells it reports")


def judge(claim: Claim, stored: Evidence, build: Evidence | None = None, profile: str | None = None,
          reference=None) -> Verdict:
    """The claim's verdict from stored runs; from the build profile's runs only where no
    comparison has a stored run."""
    ms = margins(claim, stored, reference)
    source = "stored paper profile"
    if not any(m.measured for m in ms) and build is not None:
        ms_build = margins(claim, build, reference)
        if any(m.measured for m in ms_build):
            ms, source = ms_build, f"{profile} profile (reduced protocol)"
    verdict = _verdict(ms)
    measured = [m for m in ms if m.measured]
    worst = min(measured, key=lambda m: m.mean) if measured else None
    seeds = max((len(m.values) for m in measured), default=0)
    return Verdict(claim, verdict, ms, source if measured else "—", paper_verdict(ms), worst, seeds)


def _inputs(chapter: str, profile: str | None, stored: Evidence | None, build: Evidence | None):
    """The paper's reference values, the stored evidence and the build profile's cached evidence."""
    from .book import load_reference

    try:
        reference = load_reference(chapter)
    except FileNotFoundError:
        reference = None
    stored = stored_evidence(chapter) if stored is None else stored
    if build is None and profile is not None and profile != "paper":
        build = cached_evidence(chapter, profile)
    return reference, stored, build


def verdicts(chapter: str, profile: str | None = None, stored: Evidence | None = None,
             build: Evidence | None = None) -> list[Verdict]:
    """Every claim of ``chapter`` judged (stored runs; the build ``profile``'s cached runs beside)."""
    reference, stored, build = _inputs(chapter, profile, stored, build)
    return [judge(c, stored, build, profile, reference) for c in claims_of(chapter)]


def table(results: list[Verdict], links: bool = False, page: str = ""):
    """One row per claim: claim, decided by (a link when ``links``), paper, ours, margin, source."""
    import pandas as pd

    rows = []
    for v in results:
        where = v.claim.decided_by
        if links:
            where = f'<a href="{page}#{v.claim.anchor}">{where}</a>'
        rows.append({"claim": v.claim.text, "decided by": where, "paper": v.paper_verdict, "ours": v.verdict,
                     "our worst margin": v.margin_text(), "from": v.source})
    return pd.DataFrame(rows, columns=["claim", "decided by", "paper", "ours", "our worst margin", "from"])


COLOURS = {HOLDS: "#d9f2d9", FAILS: "#f8d7d7", PARTIAL: "#fff3cd", UNMEASURED: "#eeeeee"}
PAPERS = {"celm": "CELM", "fedms": "FedMS", "flce": "FLCE", "logitfl": "Logit-based FL", "fedscm": "FedSCM"}


def _coloured(frame):
    """A :func:`table` frame without its index, each verdict of ours on its colour."""
    return frame.style.hide(axis="index").map(lambda v: f"background-color: {COLOURS.get(v, '')}", subset=["ours"])


def scorecard(chapter: str, profile: str | None = None):
    """The chapter's claims and our verdicts, as an HTML table linking to the deciding table."""
    from IPython.display import HTML

    frame = table(verdicts(chapter, profile), links=True)
    n_holds = int((frame["ours"] == HOLDS).sum())
    head = (f"<p><b>Scorecard.</b> {len(frame)} claim(s) of the paper, judged on stored paper-profile runs "
            f"(the build profile's runs only where none is stored): {n_holds} hold(s). Margins are ours, "
            f"mean ± std over the seeds stored; the worst comparison is shown.</p>")
    return HTML(head + _coloured(frame).to_html())


def show_verdicts(profile: str | None = None) -> dict[str, int]:
    """Shows every paper's claims table (the status page), each linking to its chapter; returns the
    number of claims per verdict and how many rest on stored paper-profile runs."""
    from collections import Counter

    from IPython.display import HTML, Markdown, display

    judged = []
    for chapter, label in PAPERS.items():
        judged += (results := verdicts(chapter, profile))
        display(Markdown(f"**{label}**"), HTML(_coloured(table(results, links=True, page=f"{chapter}.html")).to_html()))
    count = Counter(v.verdict for v in judged)
    return {"n_claims": len(judged), "n_hold": count[HOLDS], "n_fail": count[FAILS], "n_partial": count[PARTIAL],
            "n_open": count[UNMEASURED], "n_stored": sum(v.source == "stored paper profile" for v in judged)}


def numbers(chapter: str, profile: str | None = None, stored: Evidence | None = None,
            build: Evidence | None = None):
    """The numbers behind the claims: for each side of each comparison, the paper's value and
    ours (stored paper-profile runs, mean ± std over the seeds stored; the build profile's
    runs only where none is stored)."""
    import pandas as pd

    reference, stored, build = _inputs(chapter, profile, stored, build)
    rows, seen = [], set()
    for claim in claims_of(chapter):
        for comp in claim.comparisons:
            for side in (comp.better, comp.worse):
                if side is None or (side.cell, side.metric, side.arg) in seen:
                    continue
                seen.add((side.cell, side.metric, side.arg))
                ref = side.ref or side.cell
                paper = _paper_value(reference, ref)
                source, values = "—", []
                for name, ev in (("stored paper profile", stored), (f"{profile} profile (reduced)", build or {})):
                    runs = ev.get(side.cell, {})
                    values = [v for v in (side.value(r) for r in runs.values()) if not math.isnan(v)]
                    if values:
                        source = name
                        break
                mean, std = (float(np.mean(values)), float(np.std(values))) if values else (float("nan"),) * 2
                label = side.metric if side.arg is None else f"{side.metric} ({side.arg})"
                rows.append({"table": ref[0], "row": ref[1], "column": ref[2] if side.arg is None else side.arg,
                             "metric": label, "paper": paper, "ours": mean, "± std": std if len(values) > 1 else None,
                             "seeds": len(values), "from": source})
    return pd.DataFrame(rows, columns=["table", "row", "column", "metric", "paper", "ours", "± std", "seeds", "from"])


def all_numbers(profile: str | None = None):
    """:func:`numbers` of every paper (the status page), formatted, a column naming the paper."""
    import pandas as pd

    frame = pd.concat([numbers(chapter, profile).assign(**{"paper (name)": name}) for chapter, name in PAPERS.items()])
    return frame.style.format({"paper": "{:.2f}", "ours": "{:.2f}", "± std": "{:.2f}"}, na_rep="—").hide(axis="index")
