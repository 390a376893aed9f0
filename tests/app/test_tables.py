"""The chapters' one table type (fedlib.app.kit.tables.Table, issue 46): what ``show`` displays, in which order,
and that every table method of the guarded pages returns one."""

import inspect

import pandas as pd
import pytest
from IPython.display import Markdown

from fedlib.app.kit import tables
from fedlib.app.kit.tables import Table


@pytest.fixture
def shown(monkeypatch):
    """What ``Table.show`` shows, in order: ("display", object), ("print", text), ("figure", None)."""
    import IPython.display
    import matplotlib.pyplot as plt

    out = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: out.append(("display", obj)))
    monkeypatch.setattr(plt, "show", lambda: out.append(("figure", None)))
    monkeypatch.setattr(tables, "print", lambda text: out.append(("print", text)), raising=False)

    def run(table: Table):
        out.clear()
        table.show()
        return list(out)

    return run


def test_a_frame_then_its_figure_then_its_caption(shown):
    frame = pd.DataFrame({"a": [1]})
    assert shown(Table(frame)) == [("display", frame)]
    assert shown(Table(frame, {"x": 1}, figure=object())) == [("display", frame), ("figure", None)]
    caption = Markdown("data: here")
    assert shown(Table(frame, note=caption)) == [("display", frame), ("display", caption)]
    assert shown(Table(frame, note="data: here")) == [("display", frame), ("print", "data: here")]


def test_no_frame_shows_the_note_in_its_place_printed_or_as_a_value(shown):
    assert shown(Table(None, {"x": 1}, note="not run")) == [("print", "not run")]
    assert shown(Table(None, note="not run", print_note=False)) == [("display", "not run")]
    assert shown(Table(None, note="")) == [("print", "")]  # an empty line is still a line (cells printed it)
    assert shown(Table(None, {"x": 1})) == []


def test_formatted_styles_a_frame_or_shows_what_is_missing_as_a_value():
    frame = pd.DataFrame({"a": [1.234]})
    table = Table.formatted(frame, {"x": 1}, "no run yet", precision=2)
    assert isinstance(table.frame, pd.io.formats.style.Styler) and table.frame.data is frame and table.note is None
    assert "1.23" in table.frame.to_html() and table.values == {"x": 1}
    empty = Table.formatted(None, None, "no run yet", precision=2)
    assert empty.frame is None and empty.values == {} and empty.note == "no run yet" and not empty.print_note


def test_order_names_each_part_at_most_once(shown):
    frame = pd.DataFrame({"a": [1]})
    heading = Markdown("stale")
    assert shown(Table(frame, note=heading, order=("note", "frame"))) == [("display", heading), ("display", frame)]
    assert shown(Table(frame, figure=[], order=("figure", "frame"))) == [("figure", None), ("display", frame)]
    for order in (("frame", "frame"), ("frame", "caption")):
        with pytest.raises(ValueError, match="Table.order"):
            Table(frame, order=order)
    assert tables.PARTS == ("frame", "figure", "note")


@pytest.mark.parametrize("module, cls, methods", [
    ("celm", "CELM", ["table1", "cffl_study", "cifar10_readings", "maverick_readings", "precision_screen",
                      "table1_cifar10", "table1_cifar10_earlier", "table7", "table2", "table3", "table4",
                      "table4_uniform", "definitions", "tables5_6", "table8"]),
    ("fedms", "FedMS", ["table1", "softmax_table", "table1_cifar10", "table1_cifar10_earlier", "figs3_5", "table2",
                        "precision_screen",
                        "shortfalls", "maverick_readings", "cifar10_readings"]),
    ("fedscm", "FedSCM", ["theorem3", "theorem9", "table2", "table4", "fig5", "counts", "table1"]),
    ("logitfl", "LogitFL", ["calibration_search", "calibration_verdict", "headline", "simple_instability", "k_sweep",
                            "cifar10", "communication_table", "public_size", "dropout", "closing"]),
    ("performance", "Performance", ["live_run", "breakdown", "valuation"]),
])
def test_the_pages_table_methods_declare_one_table(module, cls, methods):
    import importlib

    chapter = getattr(importlib.import_module(f"fedlib.app.chapters.{module}"), cls)
    for name in methods:
        assert inspect.signature(getattr(chapter, name)).return_annotation in (Table, "Table"), f"{cls}.{name}"
