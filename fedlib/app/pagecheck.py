"""Checks on a rendered book page (its HTML): what a reader must never see.

:func:`page_problems` lists, one line each, a Python traceback, a raw ``<Figure size ...>``
repr (a figure that was printed instead of drawn), a NaN in a table, a table without data, and a
table cell whose text runs two numbers together (``82.191.002``: a mean and its sd without the ±).
The book's browser tests run it on every page's DOM; it works on any HTML string.

And checks on the book's prose, which a reader must not find stale: :func:`prose_drift`, a hyper-parameter a
chapter's text states by hand that its runs do not use; :func:`profile_drift`, what the README, the library's
pages and the CLI's help say of the book's profiles that the code does not.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser

from ..provenance import repo_root
from .chapters import chapter_module, resolved_methods
from .kit.pages import PROSE_SYMBOLS
from .kit.sources import PROFILES, book_dir

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


# ----------------------------------------------------------------------------- prose from the code

_STATED = re.compile(r"(?<![\w‖])(α|β|γ|μ|λ|η|τ|L|T|q|fade)\s*=\s*([0-9][0-9.]*(?:\([^)]*\))?)")


def stated_value_matches(stated: str, runs: str) -> bool:
    stated, runs = stated.rstrip(".,;").replace(" ", ""), runs.replace(" ", "")
    try:
        return float(stated) == float(runs)
    except ValueError:
        return stated == runs


def prose_drift(chapter: str, text: str | None = None, profile: str = "paper") -> list[str]:
    """Hyper-parameter values a chapter's text states by hand (``α = 5`` after the method's label, in the
    same paragraph; a paragraph naming no method speaks of the chapter's own) that differ from what its
    ``profile`` runs resolve, one line each (empty: the text agrees). ``text``: default the notebook's
    markdown cells (glued values are rendered from the code and are not in them)."""
    if text is None:
        import nbformat  # lazy: nbformat (~2 s); only reading a notebook's text needs it

        nb = nbformat.read(book_dir() / f"{chapter}.ipynb", as_version=4)
        text = "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    labels = {label: method for method, label in getattr(chapter_module(chapter), "METHOD_LABELS", {}).items()}
    methods = resolved_methods(chapter, profile)
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        marks = sorted((m.start(), labels[m.group(0)]) for m in
                       re.finditer(r"\b(" + "|".join(map(re.escape, labels)) + r")\b", paragraph)) if labels else []
        bounds = [(0, chapter)] + marks + [(len(paragraph), None)]
        for (start, method), (end, _) in zip(bounds, bounds[1:]):
            symbols = PROSE_SYMBOLS.get(method, {})
            for m in _STATED.finditer(paragraph[start:end]):
                if m.group(1) in symbols and method in methods:
                    runs = symbols[m.group(1)](methods[method])
                    if not stated_value_matches(m.group(2), runs):
                        found.append(f"{chapter}: the text states {method} {m.group(1)} = {m.group(2).rstrip('.,;')}, "
                                     f"its {profile}-profile runs use {m.group(1)} = {runs}")
    return found


# The texts that name the book's profiles and its default one (repository paths; and the CLI's help, read live).
PROFILE_TEXTS = ("README.md", "book/intro.md", "book/adding_a_chapter.md", "book/how_fedlib_runs.md",
                 "benchmarks/README.md")
CLI_BOOK_HELP = "fedlib book --help"
_PROFILE = r"(" + "|".join(PROFILES) + r")"
_DEFAULT_CLAIMS = (  # "`quick` — the default build", "(profile `evidence`, the default)", "default: evidence"
    re.compile(r"\b" + _PROFILE + r"\b`?[^.;\n`]{0,15}?\bthe default\b"),
    re.compile(r"\b" + _PROFILE + r"\b`? by default\b"),  # "profile evidence by default"
    re.compile(r"\bdefault\b[^.;\n`(]{0,12}?`?\b" + _PROFILE + r"\b"),
    re.compile(r"\bmake book\b(?![^\n]*PROFILE=)[^\n#]*#[^\n]*?\bprofile `?" + _PROFILE + r"\b"),  # a command's comment
)
_NAMED = re.compile(r"(?:--profile[ =]|PROFILE=)`?(\w+)")  # a profile a command line names
_LISTS = re.compile(r"\{(\w+(?:,\w+)+)\}|PROFILE=(\w+(?:\|\w+)+)")  # {smoke,quick,...} or PROFILE=a|b|...


def default_profile() -> str:
    """The book's default profile: the Makefile's ``PROFILE ?= ...`` (what ``make book`` builds), the one source
    the CLI's default (``python -m fedlib book``), the README and the intro must agree with."""
    found = re.search(r"(?m)^PROFILE\s*\?=\s*(\S+)", (repo_root() / "Makefile").read_text())
    if found is None:
        raise ValueError("Makefile: no 'PROFILE ?= ...' line (the book's default profile)")
    return found.group(1)


def cli_book_help() -> str:
    """``python -m fedlib book --help`` as the CLI prints it (argparse fills in the real default). Run as a
    command, so the build does not import the command line that imports it (no import cycle)."""
    done = subprocess.run([sys.executable, "-m", "fedlib", "book", "--help"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "100"})
    return done.stdout


def profile_drift(texts: dict[str, str] | None = None, default: str | None = None) -> list[str]:
    """What the texts of ``PROFILE_TEXTS`` (the README, the intro, the library's pages on chapters and on how
    fedlib runs, the benchmarks' README) and the CLI's help say of the book's profiles that differs from the code, one
    line each (empty: they agree): a default other than ``default`` (the Makefile's, :func:`default_profile`) in a
    sentence saying so or in a ``make book`` comment; a profile a command names (``--profile x``, ``PROFILE=x``)
    that does not exist; a list of profiles (``{a,b}``, ``PROFILE=a|b``) other than all of ``PROFILES``; and a CLI
    help stating no default. ``texts``: {name: text}, default those files and :func:`cli_book_help`."""
    default = default_profile() if default is None else default
    if texts is None:
        texts = {name: (repo_root() / name).read_text() for name in PROFILE_TEXTS}
        texts[CLI_BOOK_HELP] = cli_book_help()
    found = []
    for name, text in texts.items():
        flat = " ".join(text.split()) if name == CLI_BOOK_HELP else text  # argparse wraps its lines
        claims = [m.group(1) for pattern in _DEFAULT_CLAIMS for m in pattern.finditer(flat)]
        found += [f"{name}: says the default profile is {c!r}; the Makefile's (PROFILE ?= {default}) is the default"
                  for c in dict.fromkeys(claims) if c != default]
        if name == CLI_BOOK_HELP and default not in claims:
            found.append(f"{name}: states no default profile (the Makefile's is {default!r})")
        found += [f"{name}: names the profile {p!r}, not one of {', '.join(PROFILES)}"
                  for p in dict.fromkeys(m.group(1) for m in _NAMED.finditer(flat)) if p not in PROFILES]
        for m in _LISTS.finditer(flat):
            listed = re.split(r"[,|]", m.group(1) or m.group(2))
            if set(listed) & set(PROFILES) and sorted(listed) != sorted(PROFILES):
                found.append(f"{name}: lists the profiles {m.group(0)}; they are {', '.join(PROFILES)}")
    return found
