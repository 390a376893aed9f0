"""Issue 31: the book's "Adding a method" page (book/adding_a_method.md) runs as written."""

import contextlib
import io
import re
from pathlib import Path

import pytest

from fedlib.methods import METHODS

PAGE = Path(__file__).resolve().parents[2] / "book" / "adding_a_method.md"


@pytest.fixture
def page_blocks():
    yield re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    METHODS.pop("validation_weighted", None)  # the page registers it; other tests see the library's methods


def test_the_page_defines_registers_and_runs_its_method(page_blocks):
    assert len(page_blocks) == 3
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for block in page_blocks:
            exec(compile(block, str(PAGE), "exec"), namespace)
    result = namespace["result"]
    assert "validation_weighted" in METHODS and len(result.history) == 3
    last = result.history[-1]
    weights = last["weights"]
    accuracy = last["diagnostics"]["validation_accuracy"]
    assert sum(weights) == pytest.approx(1.0, abs=1e-5) and len(weights) == len(accuracy) == 4
    best = max(range(4), key=lambda k: accuracy[k])  # the softmax gives the most accurate client the most
    assert max(range(4), key=lambda k: weights[k]) == best
    assert "method 'validation_weighted': temperature must be > 0 (got 0)" in printed.getvalue()
