"""A paper's claims as a chapter declares them (``Paper.claims``): :class:`Claim`, a list of
:class:`Comparison`\\ s of one run cell's metric (:class:`Side`) with another's, :func:`cells_row` (the
comparisons of one table row by row) and :func:`final` (a run's final test metric, the reading every
claim may use). Judging them on stored runs is ``fedlib.app.claims``'s; a :class:`Side` names its
reading (``metric``), which ``fedlib.app.claims.metric`` finds among ``METRICS`` and the chapters'."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

EVERY, MOST = "every", "most"  # a claim's quantifier over its comparisons

Cell = tuple[str, str, str]


def final(result: dict, key: str = "accuracy") -> float:
    """A run's final test metric ``key`` in % (NaN when it has none)."""
    value = result["final"].get(key)
    return float("nan") if value is None else 100.0 * float(value)


@dataclass(frozen=True)
class Side:
    """A metric of one run cell; ``ref``: the reference YAML's cell for the paper's number."""

    cell: Cell
    metric: str = "accuracy"
    arg: Any = None
    ref: Cell | None = None


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
    quantifier: str = EVERY  # MOST: the paper claims it "in most settings" (more than half of the comparisons)

    def __post_init__(self):
        if self.quantifier not in (EVERY, MOST):
            raise ValueError(f"Claim: quantifier must be {EVERY!r} or {MOST!r}, not {self.quantifier!r}")


def cells_row(rows: Iterable[str], better: str, worse: str, table: str = "Table 1",
              ref: str | None = None, metric: str = "accuracy") -> tuple[Comparison, ...]:
    """``better`` against ``worse`` (columns) on each of ``rows`` of ``table``; ``ref``: the reference
    table holding the paper's values of those cells, when it is another; ``metric``: how a run is read."""
    def side(row, column):
        return Side((table, row, column), metric=metric, ref=(ref, row, column) if ref else None)

    return tuple(Comparison(row, side(row, better), side(row, worse)) for row in rows)
