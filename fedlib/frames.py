"""Paper-vs-ours numbers shared by the chapters: a value's mean ± std over seeds per method,
the paper's values of a table row, and the frame that puts them side by side."""

from __future__ import annotations

from typing import Any, Callable

from .book import mean_std, pm, reference_value


def seed_mean_std(results: dict, per_method: dict[str, list], value: Callable | None = None) -> dict[str, tuple[float, float]]:
    """Mean and std (over seeds, ddof 0) of a per-run value for each method (``per_method``:
    method -> its seeds' configs); default the final test accuracy in %. Runs not in ``results``
    (and, for the default, runs without an accuracy) are left out; NaN where none is left."""
    out = {}
    for method, cfgs in per_method.items():
        runs = [results[c.key()] for c in cfgs if c.key() in results]
        if value is None:
            values = [100.0 * r.final["accuracy"] for r in runs if r.final.get("accuracy") is not None]
        else:
            values = [value(r) for r in runs]
        out[method] = mean_std(values)
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


def comparison(rows: list[tuple[str, dict, dict]], labels: dict[str, str], digits: int = 2, index: str = "row") -> Any:
    """A paper-vs-ours frame: for each row label a 'paper' line and one line per source of ours,
    one column per method (``labels``: method -> column name). ``rows`` holds (label,
    paper {method: (mean, std)}, {source: {method: (mean, std)}})."""
    import pandas as pd

    lines = []
    for label, paper, ours in rows:
        for source, values in {"paper": paper, **ours}.items():
            lines.append({index: label, "source": source, **{labels[m]: pm(*v, digits=digits) for m, v in values.items()}})
    return pd.DataFrame(lines).set_index([index, "source"]).fillna("—")  # a method a source did not run
