"""Issue 46 (points 7 and 8): the README is a front page, the book's contents exist, and the notebooks are linted.

- README.md: at most 100 lines, the two commands (``make book``; the test command ``.ci/run`` executes) in its
  first screen, the paths it names exist, its code sample runs, its precision line matches the stored record;
- book/_toc.yml: every page it names exists, each Markdown page with one top-level heading, and their links resolve;
- book/*.ipynb: the code cells pass ruff (through nbQA) under :data:`LINT_SELECT` / :data:`LINT_IGNORE`.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BOOK = ROOT / "book"
FIRST_SCREEN = 25


def _readme() -> str:
    return README.read_text()


def _ci_command() -> str:
    """The command ``.ci/run`` runs after its set-up: its last line that is neither blank nor a comment."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")][-1]


def _code_lines(text: str) -> list[str]:
    """The lines inside the text's fenced code blocks, each stripped of a trailing ``# comment``."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]


# ----------------------------------------------------------------------------- the front page


def test_the_readme_is_a_front_page_with_the_two_commands_in_its_first_screen():
    lines = _readme().splitlines()
    assert len(lines) <= 100, f"README.md has {len(lines)} lines; the front page keeps to 100 (move detail to the book)"
    first = _code_lines("\n".join(lines[:FIRST_SCREEN]))
    assert _ci_command() == "make test"  # what CI runs on a clean clone: the README's test command
    assert "make book" in first and _ci_command() in first, \
        f"the first {FIRST_SCREEN} lines of README.md must show `make book` and `{_ci_command()}` as commands"


def test_the_readme_names_the_five_papers_and_its_sections():
    text = _readme()
    for paper in ("CELM", "FLCE", "logit-based FL", "FedMS", "FedSCM"):
        assert paper in text
    headings = re.findall(r"(?m)^## (.+)$", text)
    # "Choosing a data root" is named by the CELM chapter's Table 7 note (fedlib/app/chapters/celm/page.py)
    for section in ("The two commands", "Reading the book", "Re-executing a chapter with your own parameters",
                    "Running your own experiment", "Choosing a data root", "Determinism", "Layout",
                    "Where to go next"):
        assert section in headings, f"README.md: no section {section!r}"


def test_every_path_the_readme_and_the_library_pages_name_exists():
    pages = [README, BOOK / "how_fedlib_runs.md", BOOK / "adding_a_chapter.md", ROOT / "benchmarks" / "README.md"]
    for page in pages:
        for path in set(re.findall(r"`((?:book|benchmarks|fedlib|tests|params|examples|\.ci)/[\w./-]+)`",
                                   page.read_text())):
            if "<" not in path and "*" not in path:
                assert (ROOT / path).exists(), f"{page.relative_to(ROOT)} names {path}, which does not exist"


def test_the_readmes_precision_line_states_the_stored_measurement():
    """One line of the README gives the CIFAR-10 ``cnn_wide`` round's ratios to float32 contiguous, as
    ``benchmarks/precision.py`` stored them (medians over the repeats)."""
    record = json.loads((ROOT / "benchmarks" / "results" / "precision_cpu-2core.json").read_text())
    row = next(r for r in record["rows"] if r["model"] == "cnn_wide")
    ratio = {k: v["ratio_to_float32_contiguous"] for k, v in row["round"]["variants"].items()}
    lines = [line for line in _readme().splitlines() if "cnn_wide" in line]
    assert len(lines) == 1, "README.md: one line states the CIFAR-10 cnn_wide precision / format ratio"
    stated = re.findall(r"(\d+\.\d\d)x ([\w-]+)", lines[0])
    assert stated == [(f"{ratio['float32 channels-last']:.2f}", "channels-last"),
                      (f"{ratio['bfloat16 contiguous']:.2f}", "bfloat16"),
                      (f"{ratio['bfloat16 channels-last']:.2f}", "both")], lines[0]


def test_the_readmes_code_sample_runs(tmp_path, monkeypatch):
    """The README's ``import fedlib`` sample as written, on the synthetic dataset (no data root needed)."""
    blocks = re.findall(r"```python\n(.*?)```", _readme(), re.S)
    assert len(blocks) == 1 and "import fedlib" in blocks[0]
    assert '"dataset": "fmnist"' in blocks[0]
    code = blocks[0].replace('"dataset": "fmnist"', '"dataset": "synthetic"')
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), namespace)
    result, runs = namespace["result"], namespace["runs"]
    assert len(result.history) == 5 and len(runs) == 2
    vector = re.findall(r"(?m)^\[([^\]]*)\]$", printed.getvalue())  # print(contribution_vector(...).round(3))
    shares = [float(x) for x in vector[-1].split()]
    assert len(shares) == 10 and abs(sum(shares) - 1) < 0.01  # "sums to 1", as printed (rounded)


# ----------------------------------------------------------------------------- the book's contents


def _toc_files() -> list[str]:
    from fedlib.app.chapters import _toc_files

    return list(_toc_files(yaml.safe_load((BOOK / "_toc.yml").read_text())))


def test_every_page_the_toc_names_exists_with_a_title():
    files = _toc_files()
    assert {"how_fedlib_runs", "adding_a_method", "adding_a_chapter"} <= set(files)
    for name in files:
        found = [BOOK / f"{name}{suffix}" for suffix in ("", ".md", ".ipynb") if (BOOK / f"{name}{suffix}").is_file()]
        assert found, f"book/_toc.yml names {name!r}; there is no book/{name}.md or .ipynb"
        if found[0].suffix == ".md":
            prose = re.sub(r"(?ms)^```.*?^```", "", found[0].read_text())  # a code block's "# comment" is no heading
            titles = re.findall(r"(?m)^# \S", prose)
            assert len(titles) == 1, f"{found[0].relative_to(ROOT)}: one top-level '# ' heading (has {len(titles)})"


def _anchors(page: Path) -> set[str]:
    """The heading anchors of a Markdown page, as GitHub and MyST slug them."""
    prose = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"(?m)^#+ (.+)$", prose)}


def test_the_readmes_and_the_book_pages_links_resolve():
    for page in [README, *BOOK.glob("*.md"), ROOT / "benchmarks" / "README.md"]:
        for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)]*))?\)", page.read_text()):
            if re.match(r"[a-z]+:", target):  # http(s):, mailto:
                continue
            where = page.parent / target
            assert where.exists(), f"{page.relative_to(ROOT)} links to {target}, which is missing"
            if anchor and where.suffix == ".md":
                assert anchor in _anchors(where), f"{page.relative_to(ROOT)} links to {target}#{anchor}: no such heading"


# ----------------------------------------------------------------------------- notebook lint (issue 46.8)

# pyflakes (F: undefined names, unused imports and variables, ...), pycodestyle's errors that are not style
# (E4 imports, E7 statements, E9 syntax), W6 deprecations, and bugbear (B: likely bugs).
LINT_SELECT = "F,E4,E7,E9,W6,B"
LINT_IGNORE = ",".join([
    "E402",  # a chapter's imports follow papermill's parameters cell and check_parameters, by design
    "B018",  # a cell's last bare expression is its displayed output (a table, a widget)
])


def test_the_notebooks_code_cells_pass_ruff():
    notebooks = sorted(str(p.relative_to(ROOT)) for p in BOOK.glob("*.ipynb"))  # the sources, not _executed/
    assert len(notebooks) >= 10
    done = subprocess.run([sys.executable, "-m", "nbqa", "ruff", *notebooks, "--isolated", "--select", LINT_SELECT,
                           "--ignore", LINT_IGNORE, "--output-format", "concise", "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, "ruff on the notebooks' code cells (nbqa):\n" + done.stdout + done.stderr
