"""The book pipeline: sources, profiles, papermill execution, failures, stored results."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from fedlib.app import book, pagecheck
from fedlib.app.chapters import chapter_module
from fedlib.app.chapters.base import chapter_header
from fedlib.app.kit.pages import parameters_table, protocol_differences
from fedlib.app.kit.sources import PROFILES, load_reference, reference_value
from fedlib.app.kit.stored import evidence_summary, stored_results
from fedlib.cache import load_entry, zd_compress

ROOT = Path(__file__).resolve().parents[2]
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
    for profile in PROFILES:
        params = book.load_profile(chapter, profile)
        for key in params:
            assert f"{key} =" in cell.source, f"{chapter}/{profile}.yaml sets {key!r}, unknown to the notebook"


def test_toc_lists_existing_chapters_status_last():
    chapters = book.toc_chapters()
    assert chapters[-1] == book.STATUS_PAGE and "fedavg" in chapters


def test_protocol_differences_name_each_changed_parameter():
    quick = book.load_profile("fedavg", "quick")
    diffs = protocol_differences("fedavg", quick)
    assert any(d.startswith("`rounds`: 20 (paper protocol: 100)") for d in diffs)
    assert not protocol_differences("fedavg", book.load_profile("fedavg", "paper"))
    with pytest.raises(ValueError, match="profile: must be one of"):
        book.load_profile("fedavg", "fast")


def test_reference_numbers_load():
    ref = load_reference("celm")
    assert reference_value(ref, "Table 1", "F.MNIST PLS", "FedAvg") == (80.62, 0.52)
    with pytest.raises(KeyError):
        reference_value(ref, "Table 1", "nowhere", "FedAvg")


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
    for profile in PROFILES:
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


def test_a_build_from_a_damaged_store_names_each_file_left_out_and_is_not_reused_once_repaired(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("FEDLIB_REPO", str(_mini_repo(tmp_path, "print('value', value)")))
    monkeypatch.setenv("FEDLIB_BOOK_OUT", str(tmp_path / "out"))
    runs = tmp_path / "results" / "runs"
    runs.mkdir(parents=True)
    (runs / "dangling.json.gz").symlink_to("nowhere")
    with open(os.path.join(os.fsencode(runs), b"ab\xffcd.json.gz"), "wb") as fh:
        fh.write(b"x")
    lines = []
    stage = book.build("smoke", html=False, log=lines.append)
    assert [line for line in lines if line.startswith("results/runs/")] == [
        "results/runs/ab\\xffcd.json.gz (its name is not valid UTF-8): left out, not read (left as it is)",
        "results/runs/dangling.json.gz (a dangling symbolic link (to nowhere), not a regular file): left out, not read "
        "(left as it is)"]
    assert book.is_current("mini", "smoke", stage)
    (runs / "dangling.json.gz").unlink()  # repaired: the page is executed again, not kept as unchanged
    assert not book.is_current("mini", "smoke", stage)


def test_stored_results_round_trip_and_stale_files_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_REPO", str(tmp_path))
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "params").mkdir()
    shutil.copytree(ROOT / "params" / "fedavg", tmp_path / "params" / "fedavg")
    params = {**book.load_profile("fedavg", "smoke"), "splits": ["PLS"], "methods": ["fedavg"], "rounds": 1}
    configs = chapter_module("fedavg").configs(params)
    written = book.store_results("fedavg", configs, progress=False)
    assert len(written) == 1 and book.store_results("fedavg", configs, progress=False) == []  # resumes
    payload = load_entry(written[0])["payload"]
    assert payload["config"]["split"]["name"] == "pls" and payload["device"].startswith("cpu")
    stored = stored_results("fedavg", configs)
    assert list(stored.results) == [configs[0].key()] and not stored.skipped
    assert written[0].parent == tmp_path / "results" / "runs"  # one store for every chapter
    other = stored_results("fedavg", chapter_module("fedavg").configs({**params, "rounds": 2}))
    assert not other.results and not other.skipped and not other.stale  # another config's run: not this page's
    written[0].write_bytes(zd_compress(b"{"))  # damaged: a valid container, not JSON
    assert stored_results("fedavg", configs).skipped == [f"{written[0].name} (unreadable (JSONDecodeError))"]


def test_progress_events_reach_the_builder_and_timings_are_stored(tmp_path, monkeypatch):
    cell = "from fedlib.app.progress import report\nreport('batch', total=3)\nfor _ in range(3): report('run', cached=True)"
    monkeypatch.setenv("FEDLIB_REPO", str(_mini_repo(tmp_path, cell)))
    monkeypatch.setenv("FEDLIB_BOOK_OUT", str(tmp_path / "out"))
    lines = []
    stage = book.build("smoke", html=False, log=lines.append)
    assert lines[0].startswith("plan: ")  # the thread plan first
    assert lines[1].startswith("1 chapter(s), 1 to execute; about 1 min 00 s") and "no timing yet for mini" in lines[1]
    assert "[1/1] mini: executing" in lines[2]
    assert "[1/1] mini: executed in" in lines[3] and "3 runs (3 from the cache)" in lines[3]
    assert lines[-1].startswith("Time per chapter:") and "mini" in lines[-1] and "total" in lines[-1]
    timing = book.load_timings(stage)["mini"]
    assert timing["runs"] == 3 and timing["cached"] == 3 and timing["wall"] > 0
    lines.clear()
    book.build("smoke", html=False, log=lines.append, force=True)  # now the estimate is known
    assert "by the last build's timings" in lines[1] and "(last time" in lines[2]


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
    table = parameters_table("fedavg", book.load_profile("fedavg", "quick"))
    row = table.set_index("parameter").loc["rounds"]
    assert (row["this build"], row["paper"]) == ("20", "100")
    assert parameters_table("fedavg", book.load_profile("fedavg", "paper")).empty


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
    html = chapter_header("fedavg", "quick", book.load_profile("fedavg", "quick")).data
    # the header row + fraction, lr_milestones, rounds, seeds, test_samples
    assert "<b>Reduced protocol.</b>" in html and html.count("<tr>") == 6
    assert "<td><code>rounds</code></td><td>20</td><td>100</td>" in html
    same = chapter_header("fedavg", "paper", book.load_profile("fedavg", "paper")).data
    assert "follows the paper's protocol" in same and "<table" not in same


def test_chapters_execute_side_by_side_each_in_its_own_kernel(tmp_path, monkeypatch):
    cell = ("import os\nprint(os.getcwd(), os.environ['FEDLIB_BOOK_STAGE'], value, os.environ['FEDLIB_CPU_WORKERS'], "
            "os.environ['OMP_NUM_THREADS'])")
    repo = _mini_repo(tmp_path, cell)
    shutil.copy(repo / "book" / "mini.ipynb", repo / "book" / "twin.ipynb")
    shutil.copytree(repo / "params" / "mini", repo / "params" / "twin")
    (repo / "book" / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: mini\n  - file: twin\n")
    monkeypatch.setenv("FEDLIB_REPO", str(repo))
    monkeypatch.setenv("FEDLIB_BOOK_OUT", str(tmp_path / "out"))
    monkeypatch.delenv("FEDLIB_BOOK_STAGE", raising=False)
    monkeypatch.setattr(book, "available_cores", lambda: 2)
    lines = []
    stage = book.build("smoke", html=False, log=lines.append, jobs=2)
    assert lines[0].startswith("plan: 2 core(s); 2 chapter(s) at a time × 1 engine worker(s)")
    assert "2 to execute, 2 at a time" in lines[1]
    for chapter in ("mini", "twin"):
        text = nbformat.read(stage / f"{chapter}.ipynb", as_version=4).cells[-1].outputs[0]["text"]
        # the kernel's cwd and environment: 2 chapters on 2 cores, so 1 engine worker and 1 thread each
        assert text.split() == [str(stage), str(stage), "2", "1", "1"]
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


# ----------------------------------------------------------------------------- the evidence profile (#32)


def test_the_evidence_profile_is_the_paper_profile_by_inheritance(tmp_path, monkeypatch):
    for chapter in ("fedavg", "celm", "fedscm", "performance"):
        assert book.load_profile(chapter, book.EVIDENCE) == book.load_profile(chapter, "paper")
    (tmp_path / "params" / "mini").mkdir(parents=True)
    (tmp_path / "params" / "mini" / "paper.yaml").write_text("rounds: 100\nseeds: [0, 1]\n")
    (tmp_path / "params" / "mini" / "evidence.yaml").write_text("inherit: paper\nseeds: [0]\n")
    (tmp_path / "params" / "mini" / "quick.yaml").write_text("inherit: quick\n")
    monkeypatch.setenv("FEDLIB_REPO", str(tmp_path))
    assert book.load_profile("mini", "evidence") == {"rounds": 100, "seeds": [0]}  # overrides win
    with pytest.raises(ValueError, match="quick.yaml: inherit must name another profile"):
        book.load_profile("mini", "quick")


def test_the_evidence_build_of_fedavg_trains_nothing_and_shows_the_stored_runs(tmp_path, monkeypatch):
    """The chapter's runs are the stored paper-protocol runs: no batch or run event on the progress channel,
    nothing written to an empty result cache, and every number of Table 1 a stored run's."""
    from fedlib.app.chapters.fedavg import FedAvg

    channel, cache = tmp_path / "progress.jsonl", tmp_path / "cache"
    monkeypatch.setenv("FEDLIB_PROGRESS", str(channel))
    monkeypatch.setenv("FEDLIB_CACHE", str(cache))
    ch = FedAvg(book.EVIDENCE, book.load_profile("fedavg", book.EVIDENCE))
    runs = ch.run()
    assert not channel.exists() and not any((cache / "runs").rglob("*.json"))  # 0 runs announced, 0 computed
    stored = stored_results("fedavg", ch.configs(ch.paper_params))
    assert len(runs) == len(stored.results) > 0 and set(ch.results) == set(stored.results)
    assert [source for source, _, _ in ch.by_source()] == ["stored paper profile"]  # one source, not twice
    table, _, values = ch.table1()
    assert not any("ours (" in c for c in table.columns)
    column = f"{values['own_protocol']}, stored paper profile: FedAvg (uniform)"
    shown = 0
    make = chapter_module("fedavg").config
    for split in ch.params["splits"]:  # each cell: the mean of the stored runs' final accuracies
        runs_of_split = [ch.result(make(ch.params, split, "fedavg_uniform", seed)) for seed in ch.params["seeds"]]
        finals = [100 * r.final["accuracy"] for r in runs_of_split if r is not None]
        if finals:
            shown += 1
            assert table.loc[split, column].startswith(f"{sum(finals) / len(finals):.2f}")
    assert shown > 0


def test_the_evidence_summary_counts_and_names_the_command():
    assert evidence_summary("celm", 10, 0) == (
        "Evidence build: 10 of the 10 paper-protocol run(s) of this page are stored under results/runs/ and shown; "
        "nothing was trained.")
    assert "The other 7 are not stored" in evidence_summary("celm", 10, 7)
    assert "`make results CHAPTER=celm PROFILE=paper` makes them" in evidence_summary("celm", 10, 7)
    assert evidence_summary("flce", 3, 3).startswith("Evidence build: none of the 3 paper-protocol run(s)")


def _executed(cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    return nb


def _error(name="AttributeError", value="'NoneType' object has no attribute 'meta'"):
    return nbformat.v4.new_output("error", ename=name, evalue=value, traceback=["Traceback ..."])


def _glued(name):
    return nbformat.v4.new_output("display_data", data={"text/plain": "1"},
                                  metadata={"scrapbook": {"name": name, "mime_prefix": ""}})


def test_a_section_without_stored_runs_says_so_and_its_paragraph_too(tmp_path):
    ok, bad = nbformat.v4.new_code_cell("ch.table1()"), nbformat.v4.new_code_cell("ch.table2()")
    ok.outputs, bad.outputs = [_glued("t1_best")], [_error()]
    bad.metadata["tags"] = [book.EVIDENCE_TAG]
    text = nbformat.v4.new_markdown_cell("## Table 2\n\n**Verdict.** CELM reaches {glue:text}`t2_rare:.1f` %.\n\n"
                                         "Best in {glue:text}`t1_best`.")
    path = tmp_path / "celm.ipynb"
    nbformat.write(_executed([ok, bad, text]), path)
    assert book._sections_without_runs(path, "celm")
    nb = nbformat.read(path, as_version=4)
    note = book.not_computed_note("celm")
    assert nb.cells[1].outputs[0].text == f"{note} (AttributeError: 'NoneType' object has no attribute 'meta')\n"
    assert nb.cells[2].source == f"## Table 2\n\n*{note}*\n\nBest in {{glue:text}}`t1_best`."
    bad.metadata["tags"] = []  # an untagged cell failing is a real failure
    nbformat.write(_executed([ok, bad]), path)
    assert not book._sections_without_runs(path, "celm")


def test_a_chapter_with_nothing_stored_ends_at_its_runs_cell(tmp_path):
    runs, after = nbformat.v4.new_code_cell("ch.run()"), nbformat.v4.new_code_cell("ch.table1()")
    runs.outputs = [_error("NothingStored", "none stored")]
    banner = nbformat.v4.new_markdown_cell('<span id="papermill-error-cell">An Exception was encountered</span>')
    banner.metadata["tags"] = ["papermill-error-cell-tag"]
    path = tmp_path / "flce.ipynb"
    nbformat.write(_executed([banner, nbformat.v4.new_markdown_cell("# FLCE"), runs, after]), path)
    book._end_at_nothing_stored(path, "none stored: make results CHAPTER=flce PROFILE=paper")
    nb = nbformat.read(path, as_version=4)
    assert [c.source for c in nb.cells] == ["# FLCE", "ch.run()"]
    assert nb.cells[1].outputs[0].text == "none stored: make results CHAPTER=flce PROFILE=paper\n"


def test_the_evidence_source_tags_the_cells_after_the_runs_only(tmp_path):
    path = book._evidence_source("celm", tmp_path)
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    runs = next(i for i, c in enumerate(code) if ".run(" in c.source)
    assert all(book.EVIDENCE_TAG not in c.metadata.get("tags", []) for c in code[:runs + 1])
    assert all(book.EVIDENCE_TAG in c.metadata.get("tags", []) for c in code[runs + 1:]) and code[runs + 1:]


# ----------------------------------------------------------------------------- the thread plan (#32)


@pytest.mark.parametrize("jobs, cores, expected", [(2, 2, (2, 1)), (4, 2, (2, 1)), (1, 2, (1, 2)), (2, 16, (2, 8)),
                                                   (3, 16, (3, 5)), (1, 1, (1, 1))])
def test_the_thread_plan_never_runs_more_compute_threads_than_cores(jobs, cores, expected):
    plan = book.ThreadPlan.make(jobs, cores=cores)
    assert (plan.jobs, plan.threads) == expected and plan.jobs * plan.threads <= cores
    assert book.thread_env(plan.threads) == dict.fromkeys(
        ("FEDLIB_CPU_WORKERS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), str(expected[1]))
    with pytest.raises(ValueError, match="jobs: must be >= 1"):
        book.ThreadPlan.make(0, cores=cores)


def test_the_plan_line_states_the_product():
    assert book.ThreadPlan.make(2, cores=2).describe() == (
        "plan: 2 core(s); 2 chapter(s) at a time × 1 engine worker(s) × 1 intra-op thread = 2 compute thread(s); "
        "performance alone with 2")


def test_chapters_without_timings_are_estimated_by_the_cost_model(tmp_path, monkeypatch):
    from fedlib.app import queue

    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path))
    assert book.estimated_seconds("fedavg", book.EVIDENCE) == book.EVIDENCE_CHAPTER_SECONDS
    assert book.estimated_seconds("performance", "quick") == book.UNMODELLED_CHAPTER_SECONDS  # no queue items
    model = queue.CostModel()  # no stored timings: the fallback rates
    items = queue.unique(queue.chapter_items("fedavg", "smoke"))
    expected = sum(model.estimate(i.config)[0] for i in items)
    assert book.estimated_seconds("fedavg", "smoke", cost_model=model) == pytest.approx(
        book.UNMODELLED_CHAPTER_SECONDS + expected)
    assert book.estimated_seconds("fedavg", "smoke", threads=2, cost_model=model) == pytest.approx(
        book.UNMODELLED_CHAPTER_SECONDS + expected / 2)


# ----------------------------------------------------------------------------- prose from the code (#32)

STALE_CELM_BASELINES = """**Baselines** (hyper-parameters in `fedlib.methods.gradient` / `fairness`): FedAvg with uniform
weights (the paper's choice: no client metadata), CFFL (server validation accuracy → reputation
`sinh(α·(fade·r + (1 − fade)·r̃))` with α = 5 and fade = 0.5, clients below 1/3 of the mean
reputation removed; the server holds out 1,000 training samples as its validation set), CGSV (cosine of each update
with the aggregate, reputation EMA α = 0.95), ShapFed (class-wise cosine of the classifier rows,
μ = 0.5)."""  # the CELM page's paragraph before issue 32


def test_the_drift_check_catches_the_stale_celm_baselines_paragraph():
    assert pagecheck.prose_drift("celm", STALE_CELM_BASELINES) == [
        "celm: the text states cffl α = 5, its paper-profile runs use α = 5(1 + t/T)",
        "celm: the text states cffl fade = 0.5, its paper-profile runs use fade = 0.8",
        "celm: the text states shapfed μ = 0.5, its paper-profile runs use μ = 0.9"]
    # main's text between the two: fade fixed, α and μ still the old variants'
    assert [line.split(",")[0] for line in pagecheck.prose_drift("celm", STALE_CELM_BASELINES.replace(
        "fade = 0.5", "fade = 0.8"))] == ["celm: the text states cffl α = 5", "celm: the text states shapfed μ = 0.5"]
    # a paragraph naming no method speaks of the chapter's own: CELM's EMA β
    assert pagecheck.prose_drift("celm", "smoothed by an EMA with β = 0.7 (Eq. 13)") == [
        "celm: the text states celm β = 0.7, its paper-profile runs use β = 0.5"]


def test_the_drift_check_reads_each_method_in_its_own_part_of_the_paragraph():
    flce_text = "Baselines: FedProx (μ = 0.1), MOON (μ = 1, τ = 0.7), CGSV (α = 0.95)"
    assert pagecheck.prose_drift("flce", flce_text) == [
        "flce: the text states fedprox μ = 0.1, its paper-profile runs use μ = 0.01",
        "flce: the text states moon τ = 0.7, its paper-profile runs use τ = 0.5"]
    assert pagecheck.prose_drift("fedms", "FedProx (μ = 1); FedMS: T = 0.1, ε_b = 0.001") == [
        "fedms: the text states fedms T = 0.1, its paper-profile runs use T = 0.01"]


@pytest.mark.parametrize("chapter", ["fedavg", "celm", "flce", "fedscm", "logitfl", "fedms", "leaderboard"])
def test_no_chapter_states_a_value_its_runs_do_not_use(chapter):
    assert pagecheck.prose_drift(chapter) == []


def test_the_celm_baselines_are_rendered_from_the_runs():
    from fedlib.app.chapters.celm import baselines_text

    text = baselines_text(book.load_profile("celm", "paper"))
    assert "α = 5(1 + t/T) and fade = 0.8" in text and "μ = 0.9" in text and "rows' parameters" in text
    assert "1,000 training samples" in text and "coefficient 1/3, or 1/6 on PLS and SLS" in text
    assert pagecheck.prose_drift("celm", text) == []


# ----------------------------------------------------------------------------- the performance page (#32)


def _bench(**extra):
    rows = [{"N": 20, "vectorized_s": 1.0, "loop_s": 1.5, "central_s": 1.1, **extra},
            {"N": 100, "vectorized_s": 2.0, "loop_s": 5.0, "central_s": 2.5, **extra}]
    return {"device_name": "x86_64, 2 cores", "rows": rows}


def test_the_live_verdict_reads_right_without_flower():
    from fedlib.app.chapters.performance import live_text

    assert live_text(_bench()) == (
        "On x86_64, 2 cores, Flower was not timed in this run, so there is no comparison with it; fedlib's round "
        "is within 1.2 × a centralized epoch at every N (largest ratio 0.91×); the per-client loop takes 1.50-2.50× "
        "as long as fedlib's round.")
    run = _bench()
    for row in run["rows"]:
        row["flower_s"] = 10 * row["vectorized_s"]
    assert "fedlib's engine is faster than Flower at every N timed; Flower takes 10.00× the time of a " \
           "fedlib round at N = 100 (smallest ratio over N: 10.00×)" in live_text(run)


def test_no_verdict_when_other_work_competed():
    from fedlib.app.chapters.performance import competed, live_text, merge_runs

    quiet, busy = {"before": 0.3, "after": 2.1, "cores": 2}, {"before": 4.3, "after": 4.6, "cores": 2}
    assert not competed(quiet) and competed(busy) and not competed(None)
    run = merge_runs([{**_bench(), "engine": "vectorized", "load": quiet, "breakdown": [{"N": 20}]},
                      {**_bench(flower_s=3.0), "engine": "flower", "load": busy}])
    assert run["rows"][0]["flower_s"] == 3.0 and run["breakdown"] == [{"N": 20}]
    assert live_text(run) == (
        "No verdict: other work competed for the CPU while Flower (simulation) ran (1-minute load average up to 4.6 "
        "on 2 cores, before and after each engine: fedlib vectorized 0.3 → 2.1; Flower (simulation) 4.3 → 4.6). The "
        "times above are as measured; ratios between engines are not comparable on a shared machine. Rebuild this "
        "page on a quiet machine for a verdict.")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_parameters_cell_is_the_profile_it_names(path):
    """Issue 31: a notebook run by hand computes what its profile says (the cell said rounds = 20 where
    params/celm/quick.yaml said 10): every key of the profile is in the cell, with the profile's value."""
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    if not cells:
        pytest.skip("no parameters cell")
    names: dict = {}
    exec(cells[0].source, {}, names)
    if not (book.repo_root() / "params" / path.stem / f"{names['profile']}.yaml").is_file():
        pytest.skip("a page without profiles")
    profile = book.load_profile(path.stem, names["profile"])
    assert set(profile) <= set(names), f"not in the cell: {sorted(set(profile) - set(names))}"
    drift = {k: (names[k], profile[k]) for k in profile if names[k] != profile[k]}
    assert not drift, f"cell value vs params/{path.stem}/{names['profile']}.yaml: {drift}"


PAGES_WITH_PROFILES = sorted(p.name for p in (ROOT / "params").iterdir() if p.is_dir())


@pytest.mark.parametrize("page", PAGES_WITH_PROFILES)
def test_every_profile_and_the_parameters_cell_fit_the_page_schema(page):
    """Issue 31 point 5: one typed schema per page (a chapter's in its Paper record); its smoke, quick
    and paper YAMLs (evidence: inherited), its notebook's parameters cell and papermill's values are
    checked against it, and it declares no key that none of them sets."""
    from fedlib.app.chapters import profiles
    from fedlib.app.chapters.base import notebook_defaults

    schema = profiles.schema_of(page)
    sources = {f"params/{page}/{p}.yaml": book.load_profile(page, p) for p in PROFILES}
    sources[f"book/{page}.ipynb"] = {k: v for k, v in notebook_defaults(page).items() if k != "profile"}
    for source, values in sources.items():
        profiles.check(schema, values, source)
    unused = set(schema.model_fields) - set().union(*sources.values()) - set(profiles.EngineProfile.model_fields)
    assert not unused, f"{page}: the schema declares keys no profile sets: {sorted(unused)}"


DROP = object()
BROKEN_PROFILES = [  # (a change to params/celm/quick.yaml, its one line)
    ({"roundz": 10}, "unknown parameter 'roundz'; known: update_clip, n_clients, rounds, batch_size, lr,"),
    ({"rounds": DROP, "roundz": 10}, "unknown parameter 'roundz'"),  # a misspelt key: named before the missing one
    ({"seeds": DROP}, "missing parameter 'seeds'"),
    ({"rounds": None}, "parameter rounds: Input should be a valid integer (got None)"),
    ({"rounds": "10"}, "parameter rounds: Input should be a valid integer (got '10')"),
    ({"lr": "0.1"}, "parameter lr: Input should be a valid number (got '0.1')"),
    ({"lr_milestones": [5.5]}, "parameter lr_milestones.0: Input should be a valid integer (got 5.5)"),
    ({"methods": []}, "parameter methods: List should have at least 1 item after validation, not 0 (got [])"),
    ({"cffl_study": {"split": "PLS", "fraction": 0.1, "rounds": 10, "lr_milestones": [5]}},
     "missing parameter 'cffl_study.seed'"),
    ({"cffl_study": {"split": "PLS", "fraction": 0.1, "rounds": 10, "lr_milestones": [5], "seed": 0, "sede": 1}},
     "unknown parameter 'cffl_study.sede'; known: split, fraction, rounds, lr_milestones, seed"),
    ({"update_clip": "off"}, "parameter update_clip: Input should be a valid number (got 'off')"),
]


@pytest.mark.parametrize("change,line", BROKEN_PROFILES, ids=[f"broken-{i}" for i in range(len(BROKEN_PROFILES))])
def test_a_broken_profile_is_one_line_naming_file_and_key(change, line):
    from fedlib.app.chapters import profiles

    params = {**book.load_profile("celm", "quick"), **change}
    params = {k: v for k, v in params.items() if v is not DROP}
    with pytest.raises(profiles.ProfileError) as info:
        profiles.check(profiles.schema_of("celm"), params, "params/celm/quick.yaml")
    assert str(info.value).startswith(f"params/celm/quick.yaml: {line}") and "\n" not in str(info.value)
    profiles.check(profiles.schema_of("celm"), book.load_profile("celm", "quick"), "params/celm/quick.yaml")


# ----------------------------------------------------------------------------- profile names and default (#44)

STALE_INTRO = """  - `smoke` — seconds; run by the test suite;
  - `quick` — the default build, sized for a 2-core CPU; a **reduced protocol**
make book                                   # every chapter, profile quick, then the HTML"""  # before issue 44


def test_the_readme_the_intro_and_the_cli_agree_with_the_makefiles_default_profile():
    assert pagecheck.default_profile() == "evidence"  # the Makefile's PROFILE ?= evidence
    assert "(default: evidence" in " ".join(pagecheck.cli_book_help().split())  # argparse prints the real default
    assert pagecheck.profile_drift() == []


def test_the_profile_drift_check_catches_a_stale_default_and_wrong_names():
    assert pagecheck.profile_drift({"book/intro.md": STALE_INTRO}, default="evidence") == [
        "book/intro.md: says the default profile is 'quick'; the Makefile's (PROFILE ?= evidence) is the default"]
    help_text = "--profile {smoke,quick,paper,evidence}\n  (default:\n quick)"
    assert pagecheck.profile_drift({"fedlib book --help": help_text}, default="evidence") == [
        "fedlib book --help: says the default profile is 'quick'; the Makefile's (PROFILE ?= evidence) is the default",
        "fedlib book --help: states no default profile (the Makefile's is 'evidence')"]
    assert pagecheck.profile_drift({"README.md": "`params/<chapter>/{smoke,quick,paper}.yaml`; make book PROFILE=fast"},
                                   default="evidence") == [
        "README.md: names the profile 'fast', not one of smoke, quick, paper, evidence",
        "README.md: lists the profiles {smoke,quick,paper}; they are smoke, quick, paper, evidence"]
    # agreeing texts: a default stated as the Makefile's, a command choosing another profile explicitly
    assert pagecheck.profile_drift({"README.md": "- **`make book`** (profile `evidence`, the default)\n"
                                                 "make book PROFILE=quick   # profile quick, reduced"},
                                   default="evidence") == []
