"""The checker the browser tests run on every page: each problem it must catch, on small pages."""

import pytest

from fedlib.app.pagecheck import page_problems

GOOD = """<h1>FedAvg</h1><p>Accuracy is nan-free; the financial model is fine.</p>
<table><thead><tr><th>split</th><th>FedAvg</th></tr></thead>
<tbody><tr><td>PLS</td><td>81.6 ± 2.7</td></tr><tr><td>SLS</td><td>—</td></tr></tbody></table>
<img src="data:image/png;base64,AAAA"/>"""


def test_a_good_page_has_no_problems():
    assert page_problems(GOOD) == []


@pytest.mark.parametrize("bad, expected", [
    ('<div class="output traceback"><pre>ZeroDivisionError</pre></div>', "traceback"),
    ("<pre>Traceback (most recent call last):\n  File ...</pre>", "traceback"),
    ('<div class="cell_output"><pre>&lt;Figure size 800x350 with 1 Axes&gt;</pre></div>',
     "raw figure repr is shown: <Figure size 800x350"),
    ("<table><tr><th>method</th><th>acc</th></tr><tr><td>FedAvg</td><td>nan</td></tr></table>",
     "table 2 (method, acc) shows NaN: 'nan'"),
    ("<table><tr><td>FedAvg</td><td>NaN ± 1.2</td></tr></table>", "shows NaN"),
    ("<table><tr><td>FedAvg</td><td>-nan</td></tr></table>", "shows NaN"),
    ("<table><thead><tr><th>method</th></tr></thead><tbody></tbody></table>", "table 2 (method) is empty"),
    ("<table><tr><td> </td><td></td></tr></table>", "table 2 is empty"),
])
def test_each_problem_is_caught(bad, expected):
    problems = page_problems(GOOD + bad)
    assert len(problems) == 1 and expected in problems[0], problems


def test_words_containing_nan_are_not_nan():
    page = "<table><tr><td>Nanjing</td><td>financial</td><td>0.5</td><td>nan.jpg</td></tr></table>"
    assert page_problems(page) == []


@pytest.mark.parametrize("cell", ["82.191.002", "82.191.002 (3)", "0.9512.34"])
def test_a_cell_running_two_numbers_together_is_caught(cell):
    page = f"<table><tr><th>split</th><th>CELM</th></tr><tr><td>PLS</td><td>{cell}</td></tr></table>"
    assert page_problems(GOOD + page) == [f"table 2 (split, CELM) runs two numbers together: {cell!r}"]


def test_separated_numbers_and_versions_are_not_run_together():
    page = ("<table><tr><td>82.19 ± 1.00 (3)</td><td>torch 2.14.1</td><td>python 3.11.7</td><td>1.5.0</td>"
            "<td>2026-11-26</td><td>82.19</td></tr></table>")
    assert page_problems(page) == []
