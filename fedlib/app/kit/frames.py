"""Paper-vs-ours numbers shared by the chapters: a value's mean ± sample std (n) over seeds per
method, the paper's values of a table row (on our scale: every reference table declares its
scale), the frame that puts them side by side, and the best method of a line on shared seeds."""

from __future__ import annotations

from typing import Any, Callable

import yaml

from ...stats import SeedSpread, mean_std, pm
from .sources import book_dir, reference_value

SCALES = ("percent", "fraction", "nats", "count", "unitless")  # what a reference table's numbers are in


def reference_scales(paper: str) -> dict[str, str]:
    """``scales`` of ``book/reference/<paper>.yaml``: table (or "table / column") -> one of
    :data:`SCALES`. Raises ValueError, one line, where a table of its entries declares none or an
    unknown one, or a table transcribed from another printed scale is not in percent."""
    data = yaml.safe_load((book_dir() / "reference" / f"{paper}.yaml").read_text())
    scales = data.get("scales") or {}
    bad = {k: v for k, v in scales.items() if v not in SCALES}
    if bad:
        raise ValueError(f"reference/{paper}.yaml: unknown scale(s) {bad}; use one of {', '.join(SCALES)}")
    undeclared = sorted({e["table"] for e in data["entries"]} - set(scales))
    if undeclared:
        raise ValueError(f"reference/{paper}.yaml: no scale declared for table(s) {', '.join(undeclared)}")
    converted = {t for t in (data.get("printed_as") or {}) if scales.get(t) != "percent"}
    if converted:
        raise ValueError(f"reference/{paper}.yaml: {', '.join(sorted(converted))} printed on another scale "
                         "must be transcribed in percent")
    return scales


def scale_of(scales: dict[str, str], table: str, column: str) -> str:
    """The scale of one reference cell: its column's override, else its table's."""
    return scales.get(f"{table} / {column}", scales[table])


def seed_mean_std(results: dict, per_method: dict[str, list],
                  value: Callable | None = None) -> dict[str, SeedSpread]:
    """Mean, sample std (ddof 1) and count over seeds of a per-run value for each method, keeping
    the value of each seed (``stats.SeedSpread``; ``per_method``: method -> its seeds' configs);
    default the final test accuracy in %. Runs not in ``results`` (and, for the default, runs
    without an accuracy) are left out; NaN where none is left."""
    out = {}
    for method, cfgs in per_method.items():
        by_seed = {}
        for i, c in enumerate(cfgs):
            run = results.get(c.key())
            if run is None or (value is None and run.final.get("accuracy") is None):
                continue
            by_seed[getattr(c, "seed", i)] = 100.0 * run.final["accuracy"] if value is None else value(run)
        out[method] = SeedSpread.of(by_seed)
    return out


def paper_values(reference, table: str, row: str, methods, column_of: Callable[[str], str]) -> dict[str, tuple[float, float]]:
    """The paper's (mean, std) of ``table``/``row`` for each method, read from the column
    ``column_of(method)`` of the chapter's reference; (NaN, NaN) where the paper has none."""
    out = {}
    for m in methods:
        try:
            out[m] = reference_value(reference, table, row, column_of(m))
        except KeyError:
            out[m] = (float("nan"), float("nan"))
    return out


def _lines(rows: list[tuple[str, dict, dict]], labels: dict[str, str], index: str, cell: Callable):
    import pandas as pd  # lazy: pandas (book extra); the queue imports the chapters without it

    lines = []
    for label, paper, ours in rows:
        for source, values in {"paper": paper, **ours}.items():
            lines.append({index: label, "source": source, **{labels[m]: cell(v) for m, v in values.items()}})
    return pd.DataFrame(lines).set_index([index, "source"])


def comparison(rows: list[tuple[str, dict, dict]], labels: dict[str, str], digits: int = 2, index: str = "row") -> Any:
    """A paper-vs-ours frame: for each row label a 'paper' line and one line per source of ours,
    one column per method (``labels``: method -> column name). ``rows`` holds (label,
    paper {method: (mean, std)}, {source: {method: Spread}}); each cell is one text, ours
    "mean ± sd (n)", the paper's "mean ± std"."""
    return _lines(rows, labels, index, lambda v: pm(*v, digits=digits)).fillna("—")  # a method a source did not run


def best_on_shared_seeds(values: dict[str, Any], higher_is_better: bool = True) -> set[str]:
    """The best of ``values`` (key -> SeedSpread, or a (mean, ...) tuple such as a paper's value):
    spreads that know their seeds are compared on the seeds all of them have (none: no best);
    plain values by their mean. Empty where nothing is comparable."""
    finite = {k: v for k, v in values.items() if v is not None and v[0] == v[0]}
    if not finite:
        return set()
    seeded = {k: v for k, v in finite.items() if isinstance(v, SeedSpread)}
    if seeded:
        shared = set.intersection(*(set(v.by_seed) for v in seeded.values()))
        if not shared:
            return set()
        means = {k: mean_std(v.by_seed[s] for s in shared).mean for k, v in seeded.items()}
    else:
        means = {k: float(v[0]) for k, v in finite.items()}
    best = (max if higher_is_better else min)(means.values())
    return {k for k, m in means.items() if m == best}


def bold_best(frame, values, higher_is_better: bool = True):
    """A Styler of ``frame`` (text cells) with each line's best in bold, judged on ``values``
    (a frame of the same shape holding the spread behind each cell) on the seeds the line's
    methods share (:func:`best_on_shared_seeds`)."""
    values = values.reindex(index=frame.index, columns=frame.columns)

    def style_row(row):
        best = best_on_shared_seeds({c: v for c, v in values.loc[row.name].items() if isinstance(v, tuple)},
                                    higher_is_better)
        return ["font-weight: bold" if c in best else "" for c in row.index]

    return frame.style.apply(style_row, axis=1)


def styled_comparison(rows: list[tuple[str, dict, dict]], labels: dict[str, str], digits: int = 2,
                      index: str = "row", higher_is_better: bool = True):
    """:func:`comparison` with each line's best method in bold, on the seeds they share."""
    return bold_best(comparison(rows, labels, digits, index), _lines(rows, labels, index, lambda v: v),
                     higher_is_better)
