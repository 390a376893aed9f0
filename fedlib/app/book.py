"""The book: papermill execution of every chapter, the Jupyter Book build, the status page's
headlines; the checks that the texts agree with the code are ``fedlib.app.pagecheck``'s. What the chapters
share (profiles, paper-vs-ours tables, stored full-protocol results) is the chapter kit's, ``fedlib.app.kit``.

Layout (relative to the repository root):
    book/<chapter>.ipynb           chapter sources, stored without outputs
    book/reference/<paper>.yaml    the papers' published numbers
    params/<chapter>/<profile>.yaml  papermill parameters: smoke, quick, paper, evidence
                                   (a file may say ``inherit: <profile>`` and override some keys)
    results/runs/<key>.json.zd     stored runs (compact JSON; python -m fedlib.cache <file> prints one) (usually the paper profile) with provenance, one store for all chapters
    book/_executed/<profile>/      git-ignored: staged sources + executed notebooks + HTML
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..cache import ResultCache, atomic_write_text
from ..config import RunConfig
from ..methods import METHODS
from ..provenance import repo_root
from ..results import result_check
from ..run import run
from ..store import Store
from . import queue
from .chapters import toc, toc_chapters
from .kit.pages import _short, headline_dir
from .kit.sources import EVIDENCE, STATUS_PAGE, _check_profile, book_dir, check_only, load_profile
from .kit.stored import NothingStored, make_results_command
from .progress import ENV as PROGRESS_ENV
from .progress import Board, ChapterBar, ProgressFile, format_seconds
from .queue import CostModel


class BookError(RuntimeError):
    """A chapter failed or the book could not be built; the message says where."""


# ----------------------------------------------------------------------------- paper numbers


def bold_best(frame, columns: list[str], higher_is_better: bool = True):
    """A pandas Styler of ``frame`` with the best of ``columns`` in each row in bold.

    Cells are strings like "81.6 ± 2.7"; the leading number is compared."""

    def leading(cell) -> float:
        try:
            return float(str(cell).split()[0])
        except (ValueError, IndexError):
            return float("nan")

    def style_row(row):
        values = {c: leading(row[c]) for c in columns if c in row.index}
        finite = {c: v for c, v in values.items() if v == v}
        best = (max if higher_is_better else min)(finite.values()) if finite else None
        return ["font-weight: bold" if c in finite and finite[c] == best else "" for c in row.index]

    return frame.style.apply(style_row, axis=1)


# ----------------------------------------------------------------------------- storing runs


def store_results(chapter: str, configs, progress: bool = True) -> list[Path]:
    """Run ``configs`` and keep each result under ``results/runs/<key>.json.zd`` (resumes: files that
    exist are not recomputed); ``chapter`` names the work in the progress lines."""
    store = Store()
    written = []
    for i, config in enumerate(configs):
        fingerprint = config.data_fingerprint()
        key = config.key(fingerprint)
        stored, _ = store.read(key)
        if stored is not None and result_check(config, fingerprint)(stored.get("result") or {}) is None:
            continue
        if progress:
            print(f"[{i + 1}/{len(configs)}] {chapter}: {config.method.name} {config.split.name} seed {config.seed}",
                  flush=True)
        result = run(config, progress=progress)
        written.append(store.put(key, config.to_dict(), result.to_dict()))
    return written


# ----------------------------------------------------------------------------- headlines


def headlines_table():
    """Every chapter's recorded headline rows (the status page), ours − paper beside them, formatted."""
    import pandas as pd  # lazy: pandas (book extra); the command line imports this module

    records = [json.loads(p.read_text()) for p in sorted(headline_dir().glob("*.json"))]
    rows = [{"chapter": r["chapter"], "profile": r["profile"], **row} for r in records for row in r["rows"]]
    table = pd.DataFrame(rows, columns=["chapter", "claim", "paper", "ours", "unit", "profile"])
    table["ours − paper"] = table["ours"] - table["paper"]
    return table.style.format({"paper": "{:.2f}", "ours": "{:.2f}", "ours − paper": "{:+.2f}"}).hide(axis="index")


# ----------------------------------------------------------------------------- the build


def _stage_sources(stage: Path) -> None:
    """Copy everything but notebooks and build outputs into the stage."""
    src = book_dir()
    stage.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name.startswith(("_executed", "_build", ".")) or item.suffix == ".ipynb":
            continue
        target = stage / item.name
        if item.is_dir():
            shutil.copytree(item, target, dirs_exist_ok=True)
        else:
            shutil.copy2(item, target)
    contents = toc()
    if contents != yaml.safe_load((src / "_toc.yml").read_text()):  # chapters _toc.yml does not name
        atomic_write_text(stage / "_toc.yml", yaml.safe_dump(contents, sort_keys=False))


API_TABLES = ("api_config.md", "api_methods.md")  # generated into the stage, included by api.md


def write_api_tables(stage: Path) -> list[Path]:
    """The API page's generated parts: RunConfig's fields, and every registered method with its
    hyper-parameters, the source it follows and its docstring (equations included)."""
    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, info in RunConfig.model_fields.items():
        kind = getattr(info.annotation, "__name__", None) or str(info.annotation).replace("typing.", "")
        default = "required" if info.is_required() else _short(info.get_default(call_default_factory=True))
        rows.append(f"| `{name}` | `{cell(kind)}` | `{cell(default)}` | {cell(info.description or '')} |")
    config_md = "\n".join(rows) + "\n"

    source = re.compile(r"(github\.com/[\w.\-]+/[\w.\-]+[^\s,;)]*"  # the authors' repository
                        r"|Algorithm \d+|§\s?\d+(\.\d+)*|Eq\.\s?\(\d+\)|Eq\.\s?\d+)")
    table = ["| method | class | hyper-parameters (defaults) | follows (from its docstring) |", "|---|---|---|---|"]
    sections = []
    for name in sorted(METHODS):
        cls = METHODS[name]
        doc = inspect.cleandoc(cls.__doc__) if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") else ""
        params = {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        hyper = ", ".join(f"`{k}={_short(v)}`" for k, v in params.items()) or "none"
        cites = list(dict.fromkeys(m.group(0) for m in source.finditer(doc)))
        follows = ", ".join(cites[:3]) or "see the docstring"
        table.append(f"| [`{name}`](method-{name}) | `{cls.__module__}.{cls.__name__}` | {cell(hyper)} | "
                     f"{cell(follows)} |")
        sections.append(f"(method-{name})=\n### `{name}`: `{cls.__module__}.{cls.__name__}`\n\n"
                        f"Hyper-parameters: {hyper}.\n\n```text\n{doc or '(no docstring)'}\n```\n")
    methods_md = "\n".join(table) + "\n\n" + "\n".join(sections)
    for name, text in zip(API_TABLES, (config_md, methods_md)):
        atomic_write_text(stage / name, text)
    return [stage / name for name in API_TABLES]


def _fingerprint(chapter: str, profile: str, stage: Path) -> str:
    """Hash of what a chapter's output depends on: source, parameters, fedlib, references, and the
    store of runs as a whole (:func:`fedlib.results.list_store`'s signature: every entry's content and
    every file left out, by name and why), so a page built while the store was damaged (a link, a
    FIFO, an odd name, an invalid entry) is executed again once the store is repaired."""
    h = hashlib.sha256()
    root = repo_root()
    parts = [book_dir() / f"{chapter}.ipynb", root / "params" / chapter / f"{profile}.yaml"]
    parts += sorted((root / "fedlib").rglob("*.py")) + sorted((book_dir() / "reference").glob("*.yaml"))
    if chapter == STATUS_PAGE:
        parts += sorted((stage / "_headlines").glob("*.json"))
    for path in parts:
        if path.is_file():
            h.update(os.fsencode(path.name))
            h.update(path.read_bytes())
    h.update(f"store {Store().listing().signature}".encode())  # one store for all
    return h.hexdigest()


def execute_chapter(chapter: str, profile: str, stage: Path, force: bool = False,
                    progress_file: Path | None = None, threads: int | None = None) -> tuple[Path, bool]:
    """Execute one chapter with papermill into the stage; skipped when nothing changed.

    ``progress_file`` becomes the kernel's ``$FEDLIB_PROGRESS`` (see :mod:`fedlib.app.progress`);
    ``threads``, the kernel's compute threads (:func:`thread_env`). Returns (executed notebook, whether it ran)."""
    import papermill  # lazy: papermill (book extra); the command line imports this module

    out = stage / f"{chapter}.ipynb"
    stamp = stage / ".stamps" / f"{chapter}.sha256"
    fingerprint = _fingerprint(chapter, profile, stage)
    if not force and is_current(chapter, profile, stage, fingerprint):
        return out, False
    params = {**(load_profile(chapter, profile) if chapter != STATUS_PAGE else {}), "profile": profile}
    source = book_dir() / f"{chapter}.ipynb"
    if profile == EVIDENCE:  # sections after the runs may lack stored runs: they say so instead of failing
        source = _evidence_source(chapter, stage)
    env = {"FEDLIB_BOOK_STAGE": str(stage),
           # figures must be displayed inline even when the caller runs with MPLBACKEND=Agg
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    if progress_file:
        env[PROGRESS_ENV] = str(progress_file)
    if threads:
        env.update(thread_env(threads))
    sockets = tempfile.TemporaryDirectory(prefix="fedlib-kernel-")
    try:  # the kernel gets its cwd and environment from its manager: chapters can run side by side
        papermill.execute_notebook(
            str(source), str(out), parameters=params,
            kernel_name="python3", progress_bar=False, log_output=False,
            kernel_manager_class=_local_kernel_manager(Path(sockets.name), stage, env),
        )
    except papermill.PapermillExecutionError as err:
        if err.ename == NothingStored.__name__:  # the evidence build of a chapter with no stored run: ends there
            _end_at_nothing_stored(out, err.evalue)
            atomic_write_text(stamp, fingerprint)
            return out, True
        if profile == EVIDENCE and _sections_without_runs(out, chapter):  # only tagged cells failed
            _tag_for_reading(out)
            atomic_write_text(stamp, fingerprint)
            return out, True
        stamp.unlink(missing_ok=True)
        _tag_for_reading(out)
        raise BookError(describe_failure(chapter, err, out)) from None
    finally:
        sockets.cleanup()
    _tag_for_reading(out)
    atomic_write_text(stamp, fingerprint)  # written only after the chapter succeeded
    return out, True


EVIDENCE_TAG = "raises-exception"  # nbclient runs on past a failing cell with this tag
_GLUE_REF = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)(?::[^`]*)?`")


def _evidence_source(chapter: str, stage: Path) -> Path:
    """The chapter's notebook for the evidence build: every code cell after its runs cell (the first
    calling ``.run(``) tagged to let execution go on when it fails for want of a stored run."""
    import nbformat  # lazy: nbformat (book extra, ~2 s); the command line imports this module

    nb = nbformat.read(book_dir() / f"{chapter}.ipynb", as_version=4)
    after_runs = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if after_runs:
            cell.metadata["tags"] = list(dict.fromkeys([*cell.metadata.get("tags", []), EVIDENCE_TAG]))
        after_runs = after_runs or ".run(" in cell.source
    path = stage / ".sources" / f"{chapter}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, nbformat.writes(nb))
    return path


def not_computed_note(chapter: str) -> str:
    return (f"Not computed: the stored paper-protocol runs do not cover this yet; "
            f"`{make_results_command(chapter)}` makes them.")


def _sections_without_runs(path: Path, chapter: str) -> bool:
    """After an evidence build that raised in tagged cells: each failing cell shows one line (what
    failed, and the command that makes the missing runs) instead of its traceback, and each paragraph
    quoting a number that was never computed (a glue key no cell glued) is replaced by a note. False
    when an untagged cell failed (a real failure)."""
    import nbformat  # lazy: nbformat (book extra, ~2 s); the command line imports this module

    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if "papermill-error-cell-tag" not in c.metadata.get("tags", [])
             and 'id="papermill-error-cell"' not in "".join(c.source)]
    glued = set()
    for cell in cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        if errors and EVIDENCE_TAG not in cell.metadata.get("tags", []):
            return False
        if errors:
            kept = [o for o in cell.outputs if o.get("output_type") != "error"]
            cell.outputs = kept + [nbformat.v4.new_output(
                "stream", name="stdout", text=f"{not_computed_note(chapter)} ({errors[0].ename}: "
                                               f"{str(errors[0].evalue)[:200]})\n")]
        glued |= {o.get("metadata", {}).get("scrapbook", {}).get("name") for o in cell.outputs}
    for cell in cells:
        if cell.cell_type == "markdown" and any(k not in glued for k in _GLUE_REF.findall(cell.source)):
            cell.source = "\n\n".join(
                f"*{not_computed_note(chapter)}*" if any(k not in glued for k in _GLUE_REF.findall(part)) else part
                for part in cell.source.split("\n\n"))
    nb.cells = cells
    atomic_write_text(path, nbformat.writes(nb))
    return True


def _end_at_nothing_stored(path: Path, message: str) -> None:
    """The executed notebook up to the cell that raised NothingStored, that cell showing ``message``
    as its output; the cells after it (which need the runs) are dropped, papermill's error banner too."""
    import nbformat  # lazy: nbformat (book extra, ~2 s); the command line imports this module

    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if "papermill-error-cell-tag" not in c.metadata.get("tags", [])
             and 'id="papermill-error-cell"' not in "".join(c.source)]
    stop = next(i for i, c in enumerate(cells) if c.cell_type == "code"
                and any(o.get("ename") == NothingStored.__name__ for o in c.get("outputs", [])))
    cells[stop].outputs = [nbformat.v4.new_output("stream", name="stdout", text=message + "\n")]
    nb.cells = cells[:stop + 1]
    atomic_write_text(path, nbformat.writes(nb))
    _tag_for_reading(path)


def _local_kernel_manager(folder: Path, cwd: Path, env: dict[str, str]):
    """A kernel manager whose kernel runs in ``cwd`` with ``env`` added to this process's
    environment (without touching it, so chapters can execute in parallel threads), and talks
    over local IPC sockets in ``folder`` instead of unencrypted TCP (no warning on the terminal)."""
    # lazy: jupyter_client (book extra); the command line imports this module
    from jupyter_client import AsyncKernelManager

    class LocalKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.transport = "ipc"
            self.ip = str(folder / "kernel")

        async def _async_launch_kernel(self, kernel_cmd, **kw):
            kw["env"] = {**(kw.get("env") or os.environ), **env}
            kw["cwd"] = str(cwd)
            return await super()._async_launch_kernel(kernel_cmd, **kw)

    return LocalKernelManager


def is_current(chapter: str, profile: str, stage: Path, fingerprint: str | None = None) -> bool:
    """Whether the stage holds this chapter executed from its current sources and parameters."""
    stamp = stage / ".stamps" / f"{chapter}.sha256"
    fingerprint = fingerprint or _fingerprint(chapter, profile, stage)
    return (stage / f"{chapter}.ipynb").is_file() and stamp.is_file() and stamp.read_text() == fingerprint


def describe_failure(chapter: str, err, notebook: Path, traceback_lines: int = 12) -> str:
    """One screen: the chapter, the failing cell (number and first line), the error, the end
    of the traceback, and where the executed notebook is."""
    source = (getattr(err, "source", "") or "").strip().splitlines()
    first = next((line for line in source if line.strip() and not line.lstrip().startswith("#")), "")
    cell = f"cell {err.exec_count}" + (f" (`{first[:70]}`)" if first else "")
    trace = re.sub(r"\x1b\[[0-9;]*m", "", "".join(err.traceback or [])).rstrip().splitlines()[-traceback_lines:]
    return (f"chapter {chapter!r} failed in {cell}: {err.ename}: {err.evalue}\n"
            + "\n".join("    " + line for line in trace) + f"\n(executed notebook: {notebook})")


LONG_OUTPUT_LINES = 15  # stream outputs longer than this go into a collapsed block


def _tag_for_reading(path: Path) -> None:
    """After execution: papermill's injected-parameters cell is removed from the page (the
    chapter header shows the parameters as a table), and cells printing long logs get their
    output collapsed (Jupyter Book's hide-output)."""
    import nbformat  # lazy: nbformat (book extra, ~2 s); the command line imports this module

    if not path.is_file():
        return
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        tags = list(cell.metadata.get("tags", []))
        if "injected-parameters" in tags:
            tags.append("remove-cell")
        if cell.cell_type == "code":
            lines = sum(str(o.get("text", "")).count("\n") for o in cell.outputs if o.get("output_type") == "stream")
            if lines > LONG_OUTPUT_LINES:
                tags.append("hide-output")
        if tags != list(cell.metadata.get("tags", [])):
            cell.metadata["tags"] = list(dict.fromkeys(tags))
    atomic_write_text(path, nbformat.writes(nb))


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; os.cpu_count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_env(threads: int) -> dict[str, str]:
    """A chapter kernel's environment for ``threads`` compute threads: the engine trains ``threads`` client
    groups (``FEDLIB_CPU_WORKERS``), each with one intra-op thread, or one vectorized call with ``threads``
    OpenMP/torch threads; never more."""
    n = str(max(1, int(threads)))
    return {"FEDLIB_CPU_WORKERS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}


EXCLUSIVE = ("performance",)  # chapters that time engines: they run alone with every core (then the status page)


@dataclass(frozen=True)
class ThreadPlan:
    """How a build uses the cores: ``jobs`` chapters at a time, each kernel with ``threads`` compute
    threads (engine workers × 1 intra-op thread), so jobs × threads ≤ cores; the chapters in
    EXCLUSIVE run alone with ``cores`` threads."""

    cores: int
    jobs: int
    threads: int

    @classmethod
    def make(cls, jobs: int, cores: int | None = None) -> "ThreadPlan":
        if jobs < 1:
            raise ValueError(f"jobs: must be >= 1 (got {jobs})")
        cores = available_cores() if cores is None else cores
        jobs = min(jobs, cores)
        return cls(cores, jobs, max(1, cores // jobs))

    def describe(self) -> str:
        return (f"plan: {self.cores} core(s); {self.jobs} chapter(s) at a time × {self.threads} engine worker(s) "
                f"× 1 intra-op thread = {self.jobs * self.threads} compute thread(s); "
                f"{', '.join(EXCLUSIVE)} alone with {self.cores}")


EVIDENCE_CHAPTER_SECONDS = 20.0  # an evidence-build kernel: start, imports, reading the store (no training)
UNMODELLED_CHAPTER_SECONDS = 60.0  # a chapter without queue items (explore, coverage, performance, status)


def estimated_seconds(chapter: str, profile: str, threads: int = 1, cost_model=None) -> float:
    """A chapter's time without a recorded timing: its runs not yet in the result cache, by the queue's
    cost model (fedlib.app.queue.CostModel, one CPU thread per run), over ``threads``; a fixed guess for
    chapters without runs."""
    if profile == EVIDENCE:
        return EVIDENCE_CHAPTER_SECONDS

    try:
        items = queue.unique(queue.chapter_items(chapter, profile))
    except (ValueError, FileNotFoundError):
        return UNMODELLED_CHAPTER_SECONDS
    model = cost_model or queue.CostModel.from_results()
    cache = ResultCache()
    todo = [i for i in items if not cache.path(i.key).is_file()]
    return UNMODELLED_CHAPTER_SECONDS + sum(model.estimate(i.config)[0] for i in todo) / max(1, threads)


TIMINGS = "timings.json"  # in the stage: each chapter's last execution (wall time, runs)


def load_timings(stage: Path) -> dict[str, dict[str, Any]]:
    """chapter -> {"wall", "runs", "cached", "date"} of its last execution in this stage."""
    try:
        data = json.loads((stage / TIMINGS).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data.get("chapters", {}) if isinstance(data, dict) else {}


_TIMINGS_LOCK = threading.Lock()  # chapters executing in parallel threads finish at any time


def _save_timing(stage: Path, chapter: str, record: dict[str, Any]) -> None:
    with _TIMINGS_LOCK:
        timings = load_timings(stage)
        timings[chapter] = record
        atomic_write_text(stage / TIMINGS, json.dumps({"chapters": timings}, indent=1))


def _run_with_progress(chapter: str, profile: str, stage: Path, force: bool, label: str,
                       expected: dict[str, Any] | None, board, threads: int | None = None,
                       estimate: float | None = None) -> tuple[bool, dict[str, Any]]:
    """execute_chapter, its runs shown on ``board`` (fed by the kernel's progress events)."""
    handle, name = tempfile.mkstemp(prefix=f"fedlib-progress-{chapter}-", suffix=".jsonl")
    os.close(handle)
    channel = Path(name)
    bar = ChapterBar(label, expected.get("wall") if expected else estimate, 0.0,
                     expected_runs=int(expected.get("runs", 0)) if expected else 0, stream=board.stream)
    bar.reader = ProgressFile(channel)  # read by the build's watcher thread, under board.lock
    with board.lock:
        board.bars[chapter] = bar
    try:
        _, ran = execute_chapter(chapter, profile, stage, force=force, progress_file=channel, threads=threads)
    finally:
        with board.lock:
            bar.update(bar.reader.read())
            board.bars.pop(chapter, None)
        channel.unlink(missing_ok=True)
    return ran, {"runs": bar.done, "cached": bar.cached}


def build(profile: str = "quick", only: list[str] | None = None, html: bool = True, force: bool = False,
          log=print, jobs: int = 1) -> Path:
    """Execute the chapters (all, or ``only``) and build the HTML; returns index.html (or the stage).

    ``jobs`` chapters execute at a time (at most the cores), each kernel with cores // jobs compute
    threads (:class:`ThreadPlan`, printed first); the chapters in EXCLUSIVE, then the status page, run
    last, alone. ``log`` gets one line per chapter as it starts and as it ends (executed
    or unchanged, its time), with an estimate of the time left from the last build's timings
    (``timings.json`` in the stage); the runs inside the chapters are shown as bars on stderr.
    A failing chapter is reported and the others still build (the HTML too); then BookError
    lists the failures.
    """
    _check_profile(profile)
    plan = ThreadPlan.make(jobs)  # jobs × threads ≤ cores
    jobs = plan.jobs
    chapters = toc_chapters()
    check_only(only, chapters)
    env = os.environ.get("FEDLIB_BOOK_OUT")  # where executed notebooks and the HTML go
    stage = (Path(env) if env else book_dir() / "_executed") / profile
    _stage_sources(stage)
    write_api_tables(stage)
    todo = [c for c in chapters
            if not (only and c not in only and c != STATUS_PAGE and (stage / f"{c}.ipynb").is_file())]
    # --only: other chapters keep their executed notebooks (executed once if missing)
    forced = {c: force and (not only or c in only) for c in todo}
    will_run = {c: forced[c] or not is_current(c, profile, stage) for c in todo}  # status: decided at its turn
    timings = load_timings(stage)
    expected = {c: timings.get(c, {}).get("wall") for c in todo}
    unknown_time = [c for c in todo if will_run[c] and expected[c] is None]
    model = None
    if unknown_time and profile != EVIDENCE:
        model = CostModel.from_results()
    threads_of = {c: plan.cores if c in EXCLUSIVE else plan.threads for c in todo}
    estimate = {c: estimated_seconds(c, profile, threads_of[c], model) for c in unknown_time}
    board = Board(jobs=jobs)
    raw_log = log

    def log(line: str) -> None:  # noqa: F811 - a log line replaces the bars' line on a terminal
        board.clear()
        raw_log(line)

    board.queued_seconds = sum(expected[c] or estimate.get(c, 0.0) for c in todo if will_run[c])
    left = board.queued_seconds / jobs
    log(plan.describe())
    log(f"{len(todo)} chapter(s), {sum(will_run.values())} to execute"
        + (f", {jobs} at a time" if jobs > 1 else "")
        + (f"; about {format_seconds(left)} by the last build's timings" if left else "")
        + (f" (no timing yet for {', '.join(unknown_time)}: "
           + ("a fixed guess per evidence chapter)" if profile == EVIDENCE else "the queue's cost model for their "
              "runs not in the cache)") if unknown_time else ""))
    for line in Store().listing().left_out:  # one line per file no page reads; each page lists them too
        log(f"results/runs/{line}: left out, not read (left as it is)")
    failures, summary = [], {}
    started = time.perf_counter()

    def one(n: int, chapter: str):
        label = f"[{n}/{len(todo)}] {chapter}"
        if chapter == STATUS_PAGE:  # its inputs, the chapters' headlines, are final only now
            will_run[chapter] = forced[chapter] or not is_current(chapter, profile, stage)
        if will_run[chapter]:
            with board.lock:
                board.queued_seconds = max(board.queued_seconds - (expected[chapter] or estimate.get(chapter, 0.0)),
                                           0.0)
            log(f"  {label}: executing" + (f" (last time {format_seconds(expected[chapter])})"
                                           if expected[chapter] else ""))
        t0 = time.perf_counter()
        try:
            ran, counts = _run_with_progress(chapter, profile, stage, forced[chapter], label,
                                             timings.get(chapter), board, threads_of[chapter], estimate.get(chapter))
        except Exception as err:  # noqa: BLE001 - a dead kernel, a missing profile...: the others still build
            if not isinstance(err, BookError):
                err = BookError(f"chapter {chapter!r} failed: {type(err).__name__}: {err}")
            failures.append(str(err))
            summary[chapter] = ("FAILED", time.perf_counter() - t0)
            log(f"  {label}: FAILED after {format_seconds(summary[chapter][1])}\n{err}")
            return
        seconds = time.perf_counter() - t0
        summary[chapter] = ("executed" if ran else "unchanged", seconds)
        if ran:
            _save_timing(stage, chapter, {"wall": seconds, "runs": counts["runs"], "cached": counts["cached"],
                                          "jobs": jobs, "date": time.strftime("%Y-%m-%dT%H:%M:%S")})
            runs = f", {counts['runs']} runs ({counts['cached']} from the cache)" if counts["runs"] else ""
            rest = board.remaining()
            log(f"  {label}: executed in {format_seconds(seconds)}{runs}"
                + (f"; about {format_seconds(rest)} left" if rest else ""))
        else:
            log(f"  {label}: unchanged, kept ({seconds:.1f} s)")

    stop = threading.Event()

    def watch():
        while not stop.wait(0.5):
            with board.lock:
                for bar in board.bars.values():
                    bar.update(bar.reader.read())
            board.draw()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        numbered = list(enumerate(todo, 1))
        queue = [i for i in numbered if i[1] != STATUS_PAGE and i[1] not in EXCLUSIVE]
        if jobs > 1:  # longest first (by the last build's times): the parallel build ends sooner
            queue.sort(key=lambda item: -(expected[item[1]] or estimate.get(item[1], 0.0)))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(lambda item: one(*item), queue))
        for n, chapter in numbered:  # alone: the engine timings, then the status page
            if chapter in EXCLUSIVE:
                one(n, chapter)
        for n, chapter in numbered:
            if chapter == STATUS_PAGE:
                one(n, chapter)
    finally:
        stop.set()
        watcher.join()
        board.clear()
    order = [(c, *summary[c]) for c in todo if c in summary]
    index = stage
    if html:
        t0 = time.perf_counter()
        log("  HTML: building with Jupyter Book")
        jb = Path(sys.executable).parent / "jupyter-book"
        proc = subprocess.run([str(jb) if jb.exists() else "jupyter-book", "build", str(stage), "--quiet", "-W",
                               "--keep-going"], capture_output=True, text=True)
        if proc.returncode != 0:
            failures.append(f"jupyter-book build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        index = stage / "_build" / "html" / "index.html"
        order.append(("HTML", "built" if proc.returncode == 0 else "FAILED", time.perf_counter() - t0))
        log(f"  HTML: {'built' if proc.returncode == 0 else 'FAILED'} in {format_seconds(time.perf_counter() - t0)}")
    log(closing_note(order, time.perf_counter() - started))
    if failures:
        error = BookError(f"{len(failures)} part(s) failed with profile {profile!r}:\n\n" + "\n\n".join(failures))
        error.index = index if html and index.is_file() else None  # the pages that did build
        raise error
    return index


def closing_note(summary: list[tuple[str, str, float]], total: float) -> str:
    """The time of each chapter (and the HTML) in this build, one line each, then the total."""
    width = max([len(name) for name, _, _ in summary] + [5])
    lines = [f"  {name:<{width}}  {state:<9}  {format_seconds(seconds):>12}" for name, state, seconds in summary]
    return "\n".join(["Time per chapter:", *lines, f"  {'total':<{width}}  {'':<9}  {format_seconds(total):>12}"])
