"""Claims judged on synthetic stored runs: holds, does not hold, partly measured, not measured."""

import math

import pandas as pd
import pytest

from fedlib import claims
from fedlib.claims import Claim, Comparison, Side

CLAIM = Claim("celm", "A beats B on both rows", "Table 1", "table-1", (
    Comparison("r1", Side(("Table 1", "r1", "A")), Side(("Table 1", "r1", "B"))),
    Comparison("r2", Side(("Table 1", "r2", "A")), Side(("Table 1", "r2", "B"))),
))
REFERENCE = pd.DataFrame([
    {"table": "Table 1", "row": "r1", "column": "A", "value": 80.0},
    {"table": "Table 1", "row": "r1", "column": "B", "value": 78.0},
    {"table": "Table 1", "row": "r2", "column": "A", "value": 70.0},
    {"table": "Table 1", "row": "r2", "column": "B", "value": 71.0},
])


def run(acc):
    return {"final": {"accuracy": acc}, "history": [], "meta": {}}


def evidence(cells):
    """{(row, column): {seed: accuracy}} -> evidence with result dicts."""
    return {("Table 1", row, col): {s: run(a) for s, a in seeds.items()} for (row, col), seeds in cells.items()}


def test_holds_with_the_margin_mean_and_std_over_paired_seeds():
    ev = evidence({("r1", "A"): {0: 0.82, 1: 0.84, 2: 0.90}, ("r1", "B"): {0: 0.80, 1: 0.80},
                   ("r2", "A"): {0: 0.75}, ("r2", "B"): {0: 0.74}})
    v = claims.judge(CLAIM, ev, reference=REFERENCE)
    assert v.verdict == claims.HOLDS
    r1 = v.margins[0]
    # seeds 0 and 1 are paired (seed 2 of A has no B): margins 2 and 4 points -> 3 ± 1
    assert r1.values == pytest.approx([2.0, 4.0]) and r1.mean == pytest.approx(3.0) and r1.std == pytest.approx(1.0)
    assert v.worst.label == "r2" and v.worst.mean == pytest.approx(1.0) and math.isnan(v.worst.std)
    assert v.margin_text() == "+1.00 (r2; 1 seed)"
    # the paper's own numbers: +2 on r1, -1 on r2
    assert v.paper_verdict == "does not hold (1 of 2)"
    assert v.source == "stored paper profile" and v.seeds == 2


def test_does_not_hold_when_one_measured_row_is_not_positive_even_if_others_are_missing():
    ev = evidence({("r1", "A"): {0: 0.70}, ("r1", "B"): {0: 0.70}})
    v = claims.judge(CLAIM, ev)
    assert v.verdict == claims.FAILS and v.worst.mean == 0.0


def test_partly_measured_and_not_measured():
    ev = evidence({("r1", "A"): {0: 0.9}, ("r1", "B"): {0: 0.8}, ("r2", "A"): {0: 0.9}})  # r2 lacks B
    assert claims.judge(CLAIM, ev).verdict == claims.PARTIAL
    v = claims.judge(CLAIM, {})
    assert v.verdict == claims.UNMEASURED and v.source == "—" and v.margin_text() == "—"


def test_build_profile_numbers_only_where_nothing_is_stored():
    stored = evidence({("r1", "A"): {0: 0.5}, ("r1", "B"): {0: 0.6}})
    build = evidence({("r1", "A"): {0: 0.9}, ("r1", "B"): {0: 0.1}, ("r2", "A"): {0: 0.9}, ("r2", "B"): {0: 0.1}})
    v = claims.judge(CLAIM, stored, build, "smoke")
    assert v.verdict == claims.FAILS and v.source == "stored paper profile"
    v = claims.judge(CLAIM, {}, build, "smoke")
    assert v.verdict == claims.HOLDS and v.source == "smoke profile (reduced protocol)"


def test_a_one_sided_claim_needs_a_positive_metric():
    claim = Claim("fedms", "gap > 0", "Fig. 2", "fig-2", (Comparison("gap", Side(("Fig. 2", "r", "c"), "accuracy")),))
    ev = {("Fig. 2", "r", "c"): {0: run(-0.01), 1: run(0.03)}}
    v = claims.judge(claim, ev)
    assert v.margins[0].values == pytest.approx([-1.0, 3.0]) and v.verdict == claims.HOLDS  # mean +1
    assert v.paper_verdict == "stated in the text"


def test_every_claim_names_cells_its_chapter_queue_produces():
    from fedlib import queue

    for chapter in {c.chapter for c in claims.CLAIMS}:
        cells = {(i.table, i.row, i.column) for i in queue.chapter_items(chapter, "paper")}
        for claim in claims.claims_of(chapter):
            for comp in claim.comparisons:
                for side in (comp.better, comp.worse):
                    if side is not None:
                        assert side.cell in cells, (claim.text, side.cell)
                        assert side.metric in claims.METRICS


def test_fedms_reward_gap_metric_by_hand():
    # two rounds, the Maverick is client 1: MS-GTG - GTG = (0.5 - 0.25) and (0.25 - 0.5) -> mean 0
    result = {"meta": {"client_roles": ["benign", "maverick"]}, "history": [
        {"diagnostics": {"rewards_gtg": [0.1, 0.25], "rewards_ms": [0.0, 0.5]}},
        {"diagnostics": {"rewards_gtg": [0.1, 0.5], "rewards_ms": [0.0, 0.25]}}]}
    assert claims.METRICS["maverick_reward_gap"](result) == pytest.approx(0.0)


def test_table_and_scorecard_render_links():
    v = claims.judge(CLAIM, {})
    frame = claims.table([v], links=True)
    assert frame.loc[0, "decided by"] == '<a href="#table-1">Table 1</a>'
    assert frame.loc[0, "ours"] == claims.UNMEASURED


def test_numbers_prefer_stored_runs_and_count_seeds(monkeypatch):
    monkeypatch.setattr(claims, "claims_of", lambda chapter: [CLAIM])
    monkeypatch.setattr("fedlib.book.load_reference", lambda chapter: REFERENCE)
    stored = evidence({("r1", "A"): {0: 0.80, 1: 0.84}})
    build = evidence({("r1", "A"): {0: 0.10}, ("r1", "B"): {0: 0.20}})
    f = claims.numbers("celm", "smoke", stored=stored, build=build).set_index(["row", "column"])
    assert f.loc[("r1", "A"), "ours"] == pytest.approx(82.0) and f.loc[("r1", "A"), "± std"] == pytest.approx(2.0)
    assert f.loc[("r1", "A"), "seeds"] == 2 and f.loc[("r1", "A"), "from"] == "stored paper profile"
    assert f.loc[("r1", "B"), "ours"] == pytest.approx(20.0) and f.loc[("r1", "B"), "from"] == "smoke profile (reduced)"
    assert f.loc[("r2", "A"), "seeds"] == 0 and f.loc[("r2", "A"), "paper"] == 70.0


def test_every_claim_links_to_a_section_of_its_chapter_page():
    """The anchor is the section id Sphinx gives one of the chapter's headings (docutils make_id)."""
    from pathlib import Path

    import nbformat
    from docutils.nodes import make_id

    root = Path(__file__).resolve().parent.parent / "book"
    for chapter in {c.chapter for c in claims.CLAIMS}:
        nb = nbformat.read(root / f"{chapter}.ipynb", as_version=4)
        ids = {make_id(line.lstrip("#").strip()) for c in nb.cells if c.cell_type == "markdown"
               for line in c.source.splitlines() if line.startswith("#")}
        for claim in claims.claims_of(chapter):
            assert claim.anchor in ids, (chapter, claim.anchor)
