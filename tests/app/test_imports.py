"""Issue 46 (point 4): imports sit at the top of their module. An import inside a function stays only where
it says why, in a ``# lazy: <why>`` comment on its line or the line above (one comment above a block of
consecutive imports covers the block): a heavy or optional dependency (the book extra's pandas, IPython,
nbformat, ...; matplotlib, scipy, torchvision, which ``import fedlib``, the command line and the queue do not
load) in a module imported where it must not be paid for or required, or an import that breaks a real cycle.
And the contexts those comments name keep importing without them: the queue reads every chapter's runs
without the book extra, and ``import fedlib``, the command line and the queue load no heavy library."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fedlib"
MARK = "# lazy:"


def function_imports(source: str) -> list[ast.stmt]:
    """Every ``import`` and ``from ... import`` inside a function (or method, or a function in a function)."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(source), False)
    return found


def unmarked(source: str) -> list[int]:
    """The lines of the function-level imports in ``source`` that say nowhere why they are lazy: no ``# lazy:``
    comment on the statement's lines, on the comment lines right above it, or on the import right above it that
    it follows without a break (a block of imports under one comment)."""
    lines = source.splitlines()
    imports = function_imports(source)
    ending = {node.end_lineno: node for node in imports}

    def marked(node: ast.stmt) -> bool:
        if any(MARK in lines[i - 1] for i in range(node.lineno, node.end_lineno + 1)):
            return True
        above = node.lineno - 1
        while above >= 1 and lines[above - 1].strip().startswith("#"):
            if MARK in lines[above - 1]:
                return True
            above -= 1
        return above in ending and marked(ending[above])

    return [node.lineno for node in imports if not marked(node)]


def test_every_function_level_import_is_hoisted_or_says_why_it_is_lazy():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        problems += [f"{name}:{line}" for line in unmarked(path.read_text())]
    assert not problems, ("hoist these imports to the module's top, or say why they are lazy with a "
                          f"'{MARK} <why>' comment on the line or the line above: {problems}")


def test_the_check_finds_an_import_that_does_not_say_why():
    source = '''
import os  # module level: not the check's business


def plain():
    import json  # a comment that is not the mark

    return json


def marked_on_its_line():
    import pandas as pd  # lazy: pandas (book extra)
    return pd


def marked_above():
    """Docstring."""
    # lazy: matplotlib (~0.5 s)
    # (a second comment line)
    import matplotlib.pyplot as plt
    from IPython.display import display
    import numpy as np

    from . import later
    return plt, display, np, later


class Page:
    def method(self):
        if True:
            from .x import (
                y,
            )
        return y

    async def coroutine(self):
        def inner():
            import re

            return re
        return inner
'''
    lines = source.splitlines()
    found = unmarked(source)
    assert [lines[i - 1].strip() for i in found] == [
        "import json  # a comment that is not the mark", "from . import later", "from .x import (", "import re"]
    assert len(function_imports(source)) == 8
    assert unmarked("def f():\n    # lazy: a cycle (fedlib.a imports this module)\n    from . import a\n") == []
    assert unmarked("def f():\n    # lazy: why\n\n    from . import a\n") == [4]  # a blank line breaks the tie


BOOK_EXTRA = ("pandas", "matplotlib", "IPython", "nbformat", "papermill", "myst_nb", "ipywidgets", "jinja2",
              "jupyter_client", "jupyter_server", "distributed")
HEAVY = ("pandas", "matplotlib", "IPython", "nbformat", "scipy", "sklearn", "torchvision", "distributed")
BOOK_ONLY = {"fedlib.app.chapters.performance"}  # a page only the book imports (pandas, matplotlib at the top)

WITHOUT_THE_BOOK = f"""
import importlib, pkgutil, sys
for name in {BOOK_EXTRA!r}:
    sys.modules[name] = None  # importing it raises ImportError, as without the book extra
import fedlib, fedlib.__main__, fedlib.app.queue
from fedlib.app import chapters, cluster, explore, kit
assert len(chapters.registry()) == len(chapters.CHAPTER_MODULES) >= 5
for package in (chapters, kit, fedlib.app.queue):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if module.name not in {sorted(BOOK_ONLY)!r} and not module.name.endswith("__main__"):
            importlib.import_module(module.name)
print("ok")
"""


def test_the_queue_and_the_chapters_import_without_the_book_extra():
    """The queue imports every chapter (its record, protocol, page and analysis modules), the command line
    the queue, the build, the explorer and the cluster: all of them without pandas, matplotlib, IPython,
    nbformat, ... (a chapter's page takes them inside the functions that draw and show)."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_THE_BOOK], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_chapter_that_imports_pandas_at_the_top_is_found(tmp_path):
    """The check above on a copy of fedlib where a chapter imports pandas at the top."""
    shutil.copytree(PACKAGE, tmp_path / "fedlib", ignore=shutil.ignore_patterns("__pycache__"))
    chapter = tmp_path / "fedlib" / "app" / "chapters" / "fedavg.py"
    chapter.write_text(chapter.read_text().replace("import numpy as np\n", "import numpy as np\nimport pandas\n", 1))
    done = subprocess.run([sys.executable, "-c", WITHOUT_THE_BOOK], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode != 0 and "import of pandas halted" in done.stderr, done.stderr[-2000:]
    assert "fedavg.py" in done.stderr


def _loaded(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_import_fedlib_the_command_line_and_the_queue_load_no_heavy_library():
    """What the ``# lazy:`` comments promise: scipy, torchvision, matplotlib, pandas, ... stay out of
    ``import fedlib``, of the command line and of the queue with every chapter loaded."""
    assert _loaded("import fedlib") == []
    assert _loaded("import fedlib.__main__\nfrom fedlib.app import chapters\nchapters.registry()") == []
