"""The status page reads at a glance (issue 44, point 5): in a 1280 px wide window, each claim's row shows its
claim, the paper's margin, our margin ± sd (n) with its interval and the verdict without horizontal scrolling,
and so does the table of the numbers behind the claims (cell, paper, ours, reproduces), its long identifiers
wrapping. The page is built alone (the introduction and the status page, executed on the stored runs with the
evidence profile) with Jupyter Book and driven in headless Chromium."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver")
                                                else None)
JUPYTER_BOOK = Path(sys.executable).parent / "jupyter-book"
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None or not JUPYTER_BOOK.exists(),
                                reason="Debian's chromium and chromium-driver, or jupyter-book, are not installed")

WIDTH = 1280
CLAIM_HEADERS = ["claim", "paper's margin", "our margin ± sd (n) 95 % interval", "verdict"]
NUMBER_HEADERS = ["cell", "paper", "ours ± sd (n)", "reproduces"]


@pytest.fixture(scope="module")
def status_html(tmp_path_factory) -> Path:
    from fedlib.app import book

    stage = tmp_path_factory.mktemp("status-book")
    old = os.environ.get("FEDLIB_CACHE")
    os.environ["FEDLIB_CACHE"] = str(stage / "cache")  # the evidence build reads stored runs only
    try:
        book._stage_sources(stage)
        (stage / "_toc.yml").write_text(yaml.safe_dump({"format": "jb-book", "root": "intro",
                                                        "chapters": [{"file": "status"}]}))
        book.execute_chapter("status", "evidence", stage, force=True)
    finally:
        os.environ.pop("FEDLIB_CACHE") if old is None else os.environ.__setitem__("FEDLIB_CACHE", old)
    proc = subprocess.run([str(JUPYTER_BOOK), "build", str(stage), "--quiet"], capture_output=True, text=True)
    page = stage / "_build" / "html" / "status.html"
    assert proc.returncode == 0 and page.is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return page


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 f"--window-size={WIDTH},1600"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


# Per table of a class: its header texts, whether its container scrolls, and for each cell of its own rows
# (not of a table nested in it) the right edge, and whether its content overflows it.
MEASURE = """
const cls = arguments[0];
return Array.from(document.querySelectorAll('table.' + cls)).filter(t => !t.parentElement.closest('table'))
  .map(t => {
    const wrap = t.closest('.fedlib-table-wrap');
    const own = Array.from(t.querySelectorAll(':scope > tbody > tr > td, :scope > thead > tr > th'));
    return {
      headers: Array.from(t.querySelectorAll(':scope > thead > tr > th')).map(th => th.innerText.replace(/\\s+/g, ' ').trim()),
      wrapScroll: wrap.scrollWidth - wrap.clientWidth,
      wrapRight: wrap.getBoundingClientRect().right,
      rows: t.querySelectorAll(':scope > tbody > tr.fedlib-claim, :scope > tbody > tr:not(.fedlib-details):not(.fedlib-group)').length,
      cells: own.map(c => ({right: c.getBoundingClientRect().right, over: c.scrollWidth - c.clientWidth,
                            text: c.innerText.slice(0, 40)})),
    };
  });
"""


def _open(browser, page: Path):
    browser.get(page.as_uri())
    assert browser.execute_script("return window.innerWidth") <= WIDTH
    browser.execute_script("document.querySelectorAll('details').forEach(d => d.open = true);")


def _assert_fits(browser, tables, headers):
    width = browser.execute_script("return window.innerWidth")
    assert tables, "no such table on the page"
    for table in tables:
        assert table["headers"] == headers
        assert table["wrapScroll"] <= 1, table["headers"]  # no horizontal scrollbar on the table's container
        assert table["wrapRight"] <= width and table["rows"] > 0
        for cell in table["cells"]:
            assert cell["right"] <= min(width, table["wrapRight"]) + 1, cell
            assert cell["over"] <= 1, cell  # nothing sticks out of its cell (a number never overflows)
    # and the page itself does not scroll sideways
    assert browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth") <= 0


def test_each_claim_row_shows_claim_margins_and_verdict_within_1280_px(status_html, browser):
    _open(browser, status_html)
    tables = browser.execute_script(MEASURE, "fedlib-claims:not(.fedlib-numbers):not(.fedlib-comparisons)")
    _assert_fits(browser, tables, CLAIM_HEADERS)
    assert len(tables) == 5  # one per paper
    # every comparison of a claim, opened under its row, fits too
    nested = browser.execute_script(
        "return Array.from(document.querySelectorAll('table.fedlib-comparisons')).map(t => {"
        " const w = t.closest('.fedlib-table-wrap');"
        " return {scroll: w.scrollWidth - w.clientWidth, right: t.getBoundingClientRect().right,"
        " over: Math.max(...Array.from(t.querySelectorAll('td')).map(c => c.scrollWidth - c.clientWidth))}; });")
    width = browser.execute_script("return window.innerWidth")
    assert nested and all(t["scroll"] <= 1 and t["right"] <= width and t["over"] <= 1 for t in nested), nested
    # a verdict cell states the claim in one line: its verdict, then the summary over its comparisons
    first = browser.execute_script("return document.querySelector('tr.fedlib-claim td.fedlib-verdict').innerText")
    assert " of " in first and "paper" in first


def test_the_numbers_behind_the_claims_show_paper_ours_and_reproduction_within_1280_px(status_html, browser):
    _open(browser, status_html)
    tables = browser.execute_script(MEASURE, "fedlib-numbers")
    _assert_fits(browser, tables, NUMBER_HEADERS)
