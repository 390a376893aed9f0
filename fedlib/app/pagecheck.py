"""Checks on a rendered book page (its HTML): what a reader must never see.

:func:`page_problems` lists, one line each, a Python traceback, a raw ``<Figure size ...>``
repr (a figure that was printed instead of drawn), a NaN in a table, a table without data, and a
table cell whose text runs two numbers together (``82.191.002``: a mean and its sd without the ±).
The book's browser tests run it on every page's DOM; it works on any HTML string.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|class=\"[^\"]*\b(output (traceback|error|stderr))")
_FIGURE_REPR = re.compile(r"(<|&lt;)Figure size \d+(\.\d+)?x\d+(\.\d+)?")
# two decimals glued: "82.19" + "1.002" -> "82.191.002" (a version such as 2.14.1 ends in one digit)
_RUN_TOGETHER = re.compile(r"(?<![\w.])\d+\.\d{2,}\.\d{2,}(?![\w.])")
_NAN = re.compile(r"(?<![\w.])[-+]?nan(?!\w|\.\w)", re.IGNORECASE)


class _Tables(HTMLParser):
    """Every <table>: its caption/first header text and the text of its data cells."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables: list[dict] = []
        self._stack: list[dict] = []
        self._cell: list[str] | None = None
        self._cell_kind = ""

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._stack.append({"header": [], "cells": []})
        elif tag in ("td", "th") and self._stack:
            self._cell, self._cell_kind = [], tag

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._stack and self._cell is not None:
            text = " ".join("".join(self._cell).split())
            self._stack[-1]["cells" if self._cell_kind == "td" else "header"].append(text)
            self._cell = None
        elif tag == "table" and self._stack:
            self.tables.append(self._stack.pop())

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def page_problems(html: str) -> list[str]:
    """What is wrong with a page, one line each (empty: nothing)."""
    problems = []
    if _TRACEBACK.search(html):
        problems.append("a Python traceback or error output is shown")
    if match := _FIGURE_REPR.search(html):
        problems.append(f"a raw figure repr is shown: {match.group(0).replace('&lt;', '<')}...")
    parser = _Tables()
    parser.feed(html)
    for number, table in enumerate(parser.tables, 1):
        name = f"table {number}" + (f" ({', '.join(h for h in table['header'][:3] if h)})" if table["header"] else "")
        if not any(cell for cell in table["cells"]):
            problems.append(f"{name} is empty")
        nans = [cell for cell in table["cells"] if _NAN.search(cell)]
        if nans:
            problems.append(f"{name} shows NaN: {nans[0]!r}")
        glued = [cell for cell in table["cells"] + table["header"] if _RUN_TOGETHER.search(cell)]
        if glued:
            problems.append(f"{name} runs two numbers together: {glued[0]!r}")
    return problems
