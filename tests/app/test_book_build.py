"""The whole book with the smoke profile: every chapter executes through papermill, the
HTML builds, and each page renders in headless Chromium with its figures and tables and
no error output."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from fedlib.app import book
from fedlib.app.pagecheck import page_problems

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def smoke_book(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    env = {"FEDLIB_BOOK_OUT": str(out / "executed"), "FEDLIB_CACHE": str(out / "cache")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        # two chapters at a time (ThreadPlan caps it at the cores): on two cores the build takes half as long
        index = book.build("smoke", log=lambda *a: None, jobs=2)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return index


def test_every_chapter_executes_with_the_smoke_profile(smoke_book):
    stage = smoke_book.parent.parent.parent
    for chapter in book.toc_chapters():
        nb = nbformat.read(stage / f"{chapter}.ipynb", as_version=4)
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        assert not [o for o in outputs if o.output_type == "error"], chapter
        assert nb.metadata["papermill"]["parameters"]["profile"] == "smoke"
    status = nbformat.read(stage / "status.ipynb", as_version=4)
    assert "FedAvg (uniform) accuracy" in str(status.cells)


def _dom(page: Path) -> str:
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={page.parent / ('.chromium-' + page.stem)}", "--virtual-time-budget=8000",
            "--dump-dom", page.as_uri()]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize("chapter", ["intro", "api", "adding_a_method"] + [c for c in book.toc_chapters()])
def test_pages_render_in_headless_chromium(smoke_book, chapter):
    dom = _dom(smoke_book.parent / f"{chapter}.html")
    assert "<h1" in dom
    assert not re.search(r'class="[^"]*(output traceback|output stderr|output error)', dom), chapter
    assert "Traceback (most recent call last)" not in dom
    assert page_problems(dom) == [], chapter  # no traceback, figure repr, NaN cell or empty table
    assert "tag_injected-parameters" not in dom and "tag_parameters" not in dom  # shown as the header's table
    if chapter == "api":  # generated from the docstrings: the engine, RunConfig, every method
        assert 'id="fedlib.run"' in dom and "method-celm" in dom and "lr_milestones" in dom
    elif chapter == "adding_a_method":  # a guide: its code is the point, shown (and run by a test)
        assert "validation_weighted" in dom and 'class="math' in dom
    elif chapter not in ("intro", "explore"):  # code is collapsed, one click away
        assert 'class="cell tag_hide-input' in dom or "tag_remove-input" in dom
    if chapter == "fedavg":
        assert dom.count("<img") >= 2 and "<table" in dom and "Reduced protocol" in dom
    if chapter == "celm":
        assert dom.count("<img") >= 4 and dom.count("<table") >= 6 and "Verdict (computed)" in dom
    if chapter == "status":
        assert "<table" in dom and "FedAvg (uniform) accuracy" in dom
    if chapter == "fedms":
        assert dom.count("<img") >= 2 and dom.count("<table") >= 3
        assert "Table 2: participation of adversaries, free-riders and Mavericks" in dom
    if chapter == "flce":
        assert dom.count("<img") >= 5 and dom.count("<table") >= 6 and "Table 4: communication cost" in dom
        assert "272,474" in dom and "278,324" in dom
    if chapter == "fedscm":
        assert dom.count("<img") >= 3 and dom.count("<table") >= 6
        assert "Theorem 3: exact sparsity for several" in dom and dom.count("Verdict (computed)") >= 6
    if chapter == "logitfl":
        assert dom.count("<img") >= 2 and dom.count("<table") >= 7 and "UWA weights on the public set" in dom
        assert dom.count("Verdict (computed)") >= 5
    if chapter == "leaderboard":
        assert dom.count("<table") >= 6 and dom.count("<img") >= 1
        for question in ("Which method values Mavericks?", "Which catches free-riders?", "Which costs least?"):
            assert question in dom
    if chapter == "performance":  # live run plot, the stored H200 run, valuation overhead
        assert dom.count("<img") >= 3 and dom.count("<table") >= 3 and "NVIDIA H200" in dom
        assert "Verdict (computed)" in dom
    if chapter == "explore":
        assert "widget-button" in dom  # the saved widget view was rendered by the widget JavaScript
        assert "<img" in dom
