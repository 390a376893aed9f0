"""The book pipeline: sources, profiles, papermill execution, failures, stored results."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from fedlib import book
from fedlib.chapters import chapter_module

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_source_notebooks_have_no_outputs_and_a_parameters_cell(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name} carries outputs"
    assert any("parameters" in c.metadata.get("tags", []) for c in code), f"{path.name}: no parameters cell"


@pytest.mark.parametrize("chapter", [p.stem for p in NOTEBOOKS if p.stem != book.STATUS_PAGE])
def test_every_chapter_has_three_profiles_matching_its_parameters_cell(chapter):
    nb = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    for profile in book.PROFILES:
        params = book.load_profile(chapter, profile)
        for key in params:
            assert f"{key} =" in cell.source, f"{chapter}/{profile}.yaml sets {key!r}, unknown to the notebook"


def test_toc_lists_existing_chapters_status_last():
    chapters = book.toc_chapters()
    assert chapters[-1] == book.STATUS_PAGE and "fedavg" in chapters


def test_protocol_differences_name_each_changed_parameter():
    quick = book.load_profile("fedavg", "quick")
    diffs = book.protocol_differences("fedavg", quick)
    assert any(d.startswith("`rounds`: 20 (paper protocol: 100)") for d in diffs)
    assert not book.protocol_differences("fedavg", book.load_profile("fedavg", "paper"))
    with pytest.raises(ValueError, match="profile: must be one of"):
        book.load_profile("fedavg", "fast")


def test_reference_numbers_load():
    ref = book.load_reference("celm")
    assert book.reference_value(ref, "Table 1", "F.MNIST PLS", "FedAvg") == (80.62, 0.52)
    with pytest.raises(KeyError):
        book.reference_value(ref, "Table 1", "nowhere", "FedAvg")


def _mini_repo(tmp_path, cell_source):
    """A repository with one chapter whose code cell is ``cell_source``."""
    (tmp_path / "book").mkdir()
    (tmp_path / "params" / "mini").mkdir(parents=True)
    (tmp_path / "book" / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: mini\n")
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('profile = "quick"\nvalue = 1')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(cell_source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "book" / "mini.ipynb")
    for profile in book.PROFILES:
        (tmp_path / "params" / "mini" / f"{profile}.yaml").write_text("value: 2\n")
    return tmp_path


def test_a_failing_chapter_fails_the_build_and_shows_its_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_REPO", str(_mini_repo(tmp_path, "assert value == 3, 'value was %d' % value")))
    monkeypatch.setenv("FEDLIB_BOOK_OUT", str(tmp_path / "out"))
    with pytest.raises(book.BookError) as info:
        book.build("smoke", html=False, log=lambda *a: None)
    message = str(info.value)
    assert "chapter 'mini' failed" in message and "AssertionError: value was 2" in message


def test_unchanged_chapters_are_not_re_executed(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_REPO", str(_mini_repo(tmp_path, "print('value', value)")))
    monkeypatch.setenv("FEDLIB_BOOK_OUT", str(tmp_path / "out"))
    stage = book.build("smoke", html=False, log=lambda *a: None)
    executed = nbformat.read(stage / "mini.ipynb", as_version=4)
    assert "value 2" in executed.cells[-1].outputs[0]["text"]
    _, ran = book.execute_chapter("mini", "smoke", stage)
    assert not ran
    with pytest.raises(ValueError, match="unknown chapter 'nope'"):
        book.build("smoke", only=["nope"], html=False)


def test_stored_results_round_trip_and_stale_files_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_REPO", str(tmp_path))
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "params").mkdir()
    shutil.copytree(ROOT / "params" / "fedavg", tmp_path / "params" / "fedavg")
    params = {**book.load_profile("fedavg", "smoke"), "splits": ["PLS"], "methods": ["fedavg"], "rounds": 1}
    configs = chapter_module("fedavg").configs(params)
    written = book.store_results("fedavg", configs, progress=False)
    assert len(written) == 1 and book.store_results("fedavg", configs, progress=False) == []  # resumes
    payload = json.loads(written[0].read_text())["payload"]
    assert payload["config"]["split"]["name"] == "pls" and payload["device"].startswith("cpu")
    stored = book.stored_results("fedavg", configs)
    assert list(stored.results) == [configs[0].key()] and not stored.skipped
    assert written[0].parent == tmp_path / "results" / "runs"  # one store for every chapter
    other = book.stored_results("fedavg", chapter_module("fedavg").configs({**params, "rounds": 2}))
    assert not other.results and not other.skipped and not other.stale  # another config's run: not this page's
    written[0].write_text("{")  # damaged
    assert book.stored_results("fedavg", configs).skipped == [f"{written[0].name} (unreadable (JSONDecodeError))"]


def test_progress_events_reach_the_builder_and_timings_are_stored(tmp_path, monkeypatch):
    cell = "from fedlib.progress import report\nreport('batch', total=3)\nfor _ in range(3): report('run', cached=True)"
    monkeypatch.setenv("FEDLIB_REPO", str(_mini_repo(tmp_path, cell)))
    monkeypatch.setenv("FEDLIB_BOOK_OUT", str(tmp_path / "out"))
    lines = []
    stage = book.build("smoke", html=False, log=lines.append)
    assert lines[0].startswith("1 chapter(s), 1 to execute") and "no timing yet for mini" in lines[0]
    assert "[1/1] mini: executing" in lines[1]
    assert "[1/1] mini: executed in" in lines[2] and "3 runs (3 from the cache)" in lines[2]
    assert lines[-1].startswith("Time per chapter:") and "mini" in lines[-1] and "total" in lines[-1]
    timing = book.load_timings(stage)["mini"]
    assert timing["runs"] == 3 and timing["cached"] == 3 and timing["wall"] > 0
    lines.clear()
    book.build("smoke", html=False, log=lines.append, force=True)  # now the estimate is known
    assert "by the last build's timings" in lines[0] and "(last time" in lines[1]


def test_a_failure_names_chapter_cell_and_error_and_the_other_chapters_still_build(tmp_path, monkeypatch):
    repo = _mini_repo(tmp_path, "print('fine')")
    broken = nbformat.read(repo / "book" / "mini.ipynb", as_version=4)
    broken.cells[-1].source = "# a comment first\nnumbers = [1, 2]\nnumbers[value]"
    nbformat.write(broken, repo / "book" / "broken.ipynb")
    shutil.copytree(repo / "params" / "mini", repo / "params" / "broken")
    toc = "format: jb-book\nroot: intro\nchapters:\n  - file: broken\n  - file: mini\n"
    (repo / "book" / "_toc.yml").write_text(toc)
    monkeypatch.setenv("FEDLIB_REPO", str(repo))
    monkeypatch.setenv("FEDLIB_BOOK_OUT", str(tmp_path / "out"))
    lines = []
    with pytest.raises(book.BookError) as info:
        book.build("smoke", html=False, log=lines.append)
    message = str(info.value)
    assert "chapter 'broken' failed in cell" in message and "(`numbers = [1, 2]`)" in message
    assert "IndexError: list index out of range" in message and len(message.splitlines()) < 30
    assert any("[2/2] mini: executed" in line for line in lines)  # built after the failure
    assert "broken" in lines[-1] and "FAILED" in lines[-1]


def test_injected_parameters_are_removed_and_long_logs_collapsed(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_REPO", str(_mini_repo(tmp_path, "for i in range(40): print(i)")))
    monkeypatch.setenv("FEDLIB_BOOK_OUT", str(tmp_path / "out"))
    stage = book.build("smoke", html=False, log=lambda *a: None)
    cells = nbformat.read(stage / "mini.ipynb", as_version=4).cells
    injected = [c for c in cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "remove-cell" in injected[0].metadata.tags
    assert "hide-output" in cells[-1].metadata.tags  # 40 lines > LONG_OUTPUT_LINES
    assert "hide-output" not in cells[0].metadata.get("tags", [])


def test_parameters_table_compares_this_build_with_the_paper():
    table = book.parameters_table("fedavg", book.load_profile("fedavg", "quick"))
    row = table.set_index("parameter").loc["rounds"]
    assert (row["this build"], row["paper"]) == ("20", "100")
    assert book.parameters_table("fedavg", book.load_profile("fedavg", "paper")).empty


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_pages_read_like_papers_code_is_collapsed_and_parameters_removed(path):
    nb = nbformat.read(path, as_version=4)
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        tags = set(cell.metadata.get("tags", []))
        if "parameters" in tags:
            assert "remove-cell" in tags, f"{path.name}: the parameters cell is shown (the header has the table)"
        else:
            assert tags & {"hide-input", "remove-input", "remove-cell"}, f"{path.name}: code shown in {cell.id}"


def test_chapter_header_is_one_small_html_table_of_differences():
    html = book.chapter_header("fedavg", "quick", book.load_profile("fedavg", "quick")).data
    # the header row + fraction, lr_milestones, rounds, seeds, test_samples
    assert "<b>Reduced protocol.</b>" in html and html.count("<tr>") == 6
    assert "<td><code>rounds</code></td><td>20</td><td>100</td>" in html
    same = book.chapter_header("fedavg", "paper", book.load_profile("fedavg", "paper")).data
    assert "follows the paper's protocol" in same and "<table" not in same


def test_chapters_execute_side_by_side_each_in_its_own_kernel(tmp_path, monkeypatch):
    cell = "import os\nprint(os.getcwd(), os.environ['FEDLIB_BOOK_STAGE'], value)"
    repo = _mini_repo(tmp_path, cell)
    shutil.copy(repo / "book" / "mini.ipynb", repo / "book" / "twin.ipynb")
    shutil.copytree(repo / "params" / "mini", repo / "params" / "twin")
    (repo / "book" / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: mini\n  - file: twin\n")
    monkeypatch.setenv("FEDLIB_REPO", str(repo))
    monkeypatch.setenv("FEDLIB_BOOK_OUT", str(tmp_path / "out"))
    monkeypatch.delenv("FEDLIB_BOOK_STAGE", raising=False)
    lines = []
    stage = book.build("smoke", html=False, log=lines.append, jobs=2)
    assert "2 to execute, 2 at a time" in lines[0]
    for chapter in ("mini", "twin"):
        text = nbformat.read(stage / f"{chapter}.ipynb", as_version=4).cells[-1].outputs[0]["text"]
        assert text.split() == [str(stage), str(stage), "2"]  # the kernel's cwd and environment
        assert book.load_timings(stage)[chapter]["jobs"] == 2
    assert "FEDLIB_BOOK_STAGE" not in __import__("os").environ  # the builder's own environment is untouched


def test_a_chapter_without_its_profile_fails_alone(tmp_path, monkeypatch):
    repo = _mini_repo(tmp_path, "print('fine')")
    shutil.copy(repo / "book" / "mini.ipynb", repo / "book" / "orphan.ipynb")  # no params/orphan/
    toc = "format: jb-book\nroot: intro\nchapters:\n  - file: orphan\n  - file: mini\n"
    (repo / "book" / "_toc.yml").write_text(toc)
    monkeypatch.setenv("FEDLIB_REPO", str(repo))
    monkeypatch.setenv("FEDLIB_BOOK_OUT", str(tmp_path / "out"))
    lines = []
    with pytest.raises(book.BookError, match="chapter 'orphan' failed: FileNotFoundError: orphan: no parameter file"):
        book.build("smoke", html=False, log=lines.append, jobs=2)
    assert any("mini: executed" in line for line in lines)


def test_api_tables_list_every_config_field_and_every_registered_method(tmp_path):
    from fedlib.config import RunConfig
    from fedlib.methods import METHODS

    config_md, methods_md = (path.read_text() for path in book.write_api_tables(tmp_path))
    assert all(f"| `{name}` |" in config_md for name in RunConfig.model_fields)
    assert "| `rounds` | `int` | `20` |" in config_md
    for name in METHODS:
        assert f"(method-{name})=\n### `{name}`" in methods_md
    cgsv = next(line for line in methods_md.splitlines() if line.startswith("| [`cgsv`]"))
    assert "`alpha=0.95`" in cgsv and "github.com/XinyiYS/Gradient-Driven-Rewards" in cgsv  # its docstring's source
    assert (ROOT / "book" / "api.md").is_file() and "file: api" in (ROOT / "book" / "_toc.yml").read_text()
