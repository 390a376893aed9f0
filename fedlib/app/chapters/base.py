"""The base of every paper chapter: what a chapter notebook does besides its own tables.

A notebook is its parameters cell and calls::

    ch = chapter.Chapter.from_notebook(globals())   # the profile's parameters, the paper's values
    ch.header()                                     # this build's parameters vs the paper's
    ch.run()                                        # this build's runs, then the stored paper-profile runs
    table1 = ch.table1()                            # a chapter's own table: a Table (fedlib.app.kit.tables)
    table1.show()                                   # its frame (or the note in its place), figure and note
    ch.glue(table1.values)                          # the numbers its text quotes

A subclass names its chapter (``name``; its runs: its ``Paper`` record's ``configs``) and its method
labels, and adds one method per table or figure; the comparison frames, the paper's values, the mean ± std
over seeds and the stored runs come from here (``fedlib.app.kit``: ``frames``, ``sources``, ``stored``).
"""

from __future__ import annotations

import ast
import inspect
import json
from html import escape
from typing import Any, Callable

import torch

from ... import __version__, data
from ...config import shown
from ...provenance import git_commit, repo_root
from ...run import run_many
from ..kit import frames, pages
from ..kit.items import QueueItem, run_round
from ..kit.pages import device_description, parameters_table
from ..kit.sources import EVIDENCE, book_dir, load_reference
from ..kit.stored import NothingStored, evidence_summary, stored_results
from . import CHAPTER_MODULES, defenses, profiles, record

OURS_STORED = "stored paper profile"
DATASET_LABELS = {"mnist": "MNIST", "fmnist": "F.MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
                  "svhn": "SVHN", "eurosat": "EuroSAT"}  # as the papers' tables name them


def dataset_label(dataset: str) -> str:
    return DATASET_LABELS.get(dataset, dataset)


def curve(result, key: str = "accuracy") -> tuple[list[int], list[float]]:
    """Rounds and ``key`` (%) per round: a test metric, or a diagnostic such as ``public_accuracy``."""
    values = [(h["round"] + 1, h.get(key, (h.get("diagnostics") or {}).get(key))) for h in result.history]
    return [r for r, v in values if v is not None], [100.0 * v for _, v in values if v is not None]


# ----------------------------------------------------------------------------- papermill parameters

class ChapterParameterError(profiles.ProfileError):
    """A chapter's papermill parameters do not fit its profile schema; one line, before any run."""


NOTEBOOK_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open", "display"}  # a kernel's own globals


def profiles_of(chapter: str) -> list[str]:
    """The chapter's profiles: every ``params/<chapter>/<profile>.yaml`` there is."""
    return sorted(p.stem for p in (repo_root() / "params" / chapter).glob("*.yaml"))


def notebook_defaults(chapter: str) -> dict[str, Any]:
    """The literal values of the notebook's parameters cell (a non-literal value: ``...``)."""
    path = book_dir() / f"{chapter}.ipynb"
    if not path.is_file():
        return {}
    cells = json.loads(path.read_text())["cells"]
    source = next(("".join(c["source"]) for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])), "")
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    try:
                        out[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        out[target.id] = ...
    return out


def _injected(namespace: dict[str, Any]) -> dict[str, Any]:
    """The notebook globals that are parameters: not private, not the kernel's, not modules, classes,
    functions or imported constants (UPPER_CASE names; no profile has one)."""
    return {k: v for k, v in namespace.items() if not k.startswith("_") and k not in NOTEBOOK_NAMES
            and not k.isupper() and not inspect.ismodule(v) and not callable(v)}


def check_parameters(chapter: str, namespace: dict[str, Any]) -> None:
    """Check a chapter notebook's parameters (papermill's ``-p``/``-y`` values and the parameters
    cell, i.e. the notebook's globals) against its profile schema (``fedlib.app.chapters.profiles``)
    before anything runs: an unknown profile (no ``params/<chapter>/<profile>.yaml``), an unknown
    or missing name or a value of the wrong type is one ``ChapterParameterError`` line."""
    known = profiles_of(chapter)
    profile = namespace.get("profile", "quick")
    if not isinstance(profile, str) or profile not in known:
        raise ChapterParameterError(f"{chapter}: unknown profile {shown(profile)}; known: {', '.join(known)}")
    values = {k: v for k, v in _injected(namespace).items() if k != "profile"}
    found = profiles.problem(profiles.schema_of(chapter), values)
    if found:
        raise ChapterParameterError(f"{chapter}: {found}")


def queue_item(chapter: str, params: dict[str, Any], table: str, row: str, column: str, config, **options):
    """A ``fedlib.app.kit.items.QueueItem`` for one run of the profile ``params`` (its seed from the config;
    ``options``: the item's other fields, the runner ``run_round`` unless given)."""
    return QueueItem(chapter, table, row, column, config.seed, config, options.pop("runner", run_round),
                     first_seed=config.seed == params["seeds"][0], **options)


def chapter_header(chapter: str, profile: str, params: dict[str, Any]):
    """The first output of every chapter: profile, device, and this build's parameters vs the
    paper's as a small table (the injected parameters cell itself is not shown)."""
    # lazy: IPython (book extra); the queue imports the chapters without it
    from IPython.display import HTML

    table = parameters_table(chapter, params)
    if profile == EVIDENCE:
        protocol = ("<p><b>Evidence build.</b> Every number of ours on this page is a stored run of the paper's "
                    "protocol (<code>results/runs/</code>); nothing was trained to build it. A cell without a "
                    "stored run says so; <code>make results CHAPTER=" + escape(chapter) + " PROFILE=paper</code> "
                    "makes the missing runs, <code>make book PROFILE=quick</code> re-runs the chapter at reduced "
                    "scale.</p>")
    elif profile == "paper" and table.empty:
        protocol = "<p>This run follows the paper's protocol.</p>"
    elif table.empty:
        protocol = "<p>Same settings as the paper profile.</p>"
    else:
        rows = "".join(f"<tr><td><code>{escape(r.parameter)}</code></td><td>{escape(r._2)}</td>"
                       f"<td>{escape(r.paper)}</td></tr>" for r in table.itertuples())
        protocol = ("<p><b>Reduced protocol.</b> This build's parameters vs the paper's:</p>"
                    "<table class=\"fedlib-parameters\"><thead><tr><th>parameter</th><th>this build</th>"
                    f"<th>paper</th></tr></thead><tbody>{rows}</tbody></table>")
    defended, commit = defenses(chapter, params), git_commit()
    version = __version__ + (f" ({commit[:10]})" if commit else "")
    return HTML(
        f"<p><b>Profile:</b> <code>{escape(profile)}</code> &nbsp;·&nbsp; <b>Device:</b> "
        f"{escape(device_description())} &nbsp;·&nbsp; <b>fedlib</b> {escape(version)}</p>{protocol}"
        + (f"<p>{escape(defended).replace('**Defenses on:**', '<b>Defenses on:</b>')}</p>" if defended else "")
    )


class Chapter:
    name = ""  # a chapter's: its Paper record's name (a page without one compares with no paper)
    labels: dict[str, str] = {}  # method -> column name
    index = "row"  # the comparison frames' first index level

    def __init__(self, profile: str, params: dict[str, Any]):
        self.profile, self.params = profile, params
        self.paper_params = profiles.load(self.name, "paper")
        reference = record(self.name).reference if self.name in CHAPTER_MODULES else None
        self.reference = None if reference is None else load_reference(reference)
        # the evidence profile's own runs are the stored paper-protocol runs: one source, no training
        self.ours = OURS_STORED if profile == EVIDENCE else f"ours ({profile})"
        self.results: dict[str, Any] = {}  # this build's runs by key
        self.runs: list = []
        self.stored = None  # fedlib.app.kit.stored.Stored: the stored paper-profile runs

    @classmethod
    def parameter_names(cls) -> list[str]:
        """Every parameter a profile of this chapter may set (its profile schema's fields)."""
        return list(profiles.schema_of(cls.name).model_fields)

    @classmethod
    def from_notebook(cls, namespace: dict[str, Any]) -> "Chapter":
        """The chapter as the notebook's parameters cell (papermill's injected values) sets it,
        once they pass :func:`check_parameters`."""
        check_parameters(cls.name, namespace)
        params = {n: namespace[n] for n in cls.parameter_names() if n in namespace}
        return cls(namespace.get("profile", "quick"), params)

    # -- the runs ------------------------------------------------------------------------
    def configs(self, params: dict[str, Any] | None = None) -> list:
        """Every run of the chapter (``params``: default this build's), by its record's ``configs``."""
        return record(self.name).configs(self.params if params is None else params)

    def run(self, configs=None, stored_configs=None, quiet: bool = False) -> list:
        """This build's runs (the cache answers what ran before; a dataset that is not under the
        data root is skipped with one line), then the stored paper-profile runs; prints a summary."""
        if self.params.get("threads"):  # the profile's torch CPU threads (small models run faster on few)
            torch.set_num_threads(self.params["threads"])
        configs = self.configs() if configs is None else configs
        if self.evidence:
            return self._stored_as_ours(configs, quiet)
        by_dataset: dict[str, list] = {}
        for c in configs:
            by_dataset.setdefault(c.dataset, []).append(c)
        for dataset, group in by_dataset.items():
            try:
                runs = run_many(group, progress=False)
            except data.DataNotFoundError as err:
                print(f"{dataset} runs skipped: {err}")
                continue
            self.runs += runs
            self.results.update({c.key(): r for c, r in zip(group, runs)})
        self.stored = self.stored_runs(stored_configs)
        if not quiet and self.runs:
            wall = sum(r.meta["wall_time"] for r in self.runs)
            print(f"{len(self.runs)} runs; {wall:.0f} s of compute when first computed; "
                  f"device {self.runs[0].meta['device']}")
            print(self.stored.describe())
        return self.runs

    @property
    def evidence(self) -> bool:
        """Whether this build shows the stored paper-protocol runs only (``make book``'s default)."""
        return self.profile == EVIDENCE

    def _stored_as_ours(self, configs, quiet: bool) -> list:
        """The evidence profile: the stored runs of ``configs`` stand for this build's runs (nothing
        trains); the ones not stored are counted and named with the command that makes them."""
        self.stored = stored_results(self.name, configs)
        self.results = dict(self.stored.results)
        self.runs = list(self.results.values())
        missing = [c for c in configs if c.key() not in self.results]
        if not quiet:
            print(evidence_summary(self.name, len(configs), len(missing)))
            if self.runs:
                print(self.stored.describe())
        if not self.runs:
            raise NothingStored(evidence_summary(self.name, len(configs), len(missing)))
        return self.runs

    def stored_runs(self, configs=None):
        return stored_results(self.name, self.configs(self.paper_params) if configs is None else configs)

    def result(self, config):
        """This build's run of ``config`` (None when it was not run, e.g. no data)."""
        return self.results.get(config.key())

    def has(self, dataset: str) -> bool:
        return any(r.config["dataset"] == dataset for r in self.runs)

    def by_source(self) -> list[tuple[str, dict, dict]]:
        """(source, runs by key, params) of this build and, when there are any, of the stored paper-profile runs."""
        out = [(self.ours, self.results, self.params)]
        if self.stored is not None and self.stored.results and not self.evidence:
            out.append((OURS_STORED, self.stored.results, self.paper_params))
        return out

    def data_source(self, dataset: str) -> str:
        """Where this build's (else the stored) runs of ``dataset`` read their data ("" when none ran)."""
        runs = self.runs + (list(self.stored.results.values()) if self.stored else [])
        return next((r.meta["dataset_source"] for r in runs if r.config["dataset"] == dataset), "")

    # -- paper vs ours -------------------------------------------------------------------
    def column_of(self, method: str) -> str:
        return self.labels[method]

    def paper_values(self, table: str, row: str, methods) -> dict[str, tuple[float, float]]:
        return frames.paper_values(self.reference, table, row, methods, self.column_of)

    def sources(self, make_configs: Callable[[dict], dict[str, list]], value=None) -> dict[str, dict]:
        """{source: {method: (mean, std)}} for this build's runs and the stored paper-profile runs;
        ``make_configs(params)`` gives each method's seeds' configs, ``value`` a run's number
        (default: final accuracy in %)."""
        return {source: frames.seed_mean_std(results, make_configs(params), value)
                for source, results, params in self.by_source()}

    @staticmethod
    def measured(rows: list[tuple[str, dict, dict]]) -> list[tuple[str, dict, dict]]:
        """The rows with a number of ours from some source (this build's runs or the stored ones)."""
        return [row for row in rows if any(v[0] == v[0] for values in row[2].values() for v in values.values())]

    def comparison(self, rows: list[tuple[str, dict, dict]], digits: int = 2):
        """The paper-vs-ours frame: per row a 'paper' line and one per source, a column per method."""
        return frames.comparison(rows, self.labels, digits, index=self.index)

    def styled(self, rows: list[tuple[str, dict, dict]]):
        """The comparison frame of ``rows``, the best method per line in bold (on the seeds they share)."""
        return frames.styled_comparison(rows, self.labels, index=self.index)

    # -- the page --------------------------------------------------------------------------
    def header(self):
        return chapter_header(self.name, self.profile, self.params)

    @staticmethod
    def glue(values: dict[str, Any]) -> None:
        """Every number a page's text quotes, glued under its name (myst-nb)."""
        # lazy: myst_nb (book extra); the queue imports the chapters without it
        from myst_nb import glue

        for name, value in values.items():
            glue(name, value, display=False)

    def record_headlines(self, rows: list[dict[str, Any]]):
        pages.record_headlines(self.name, self.profile, rows)
        import pandas as pd  # lazy: pandas (book extra); the queue imports the chapters without it

        return pd.DataFrame(rows)
