"""Issue 31 point 2: one declaration per chapter. Each chapter module declares one ``Paper`` record;
the queue's, the claims', the coverage page's and the command line's chapter lists are derived
from them (a new record shows up in all of them). No test here names the chapters: they are read from
``fedlib/app/chapters/``, and ``book/_toc.yml`` places a chapter only where it names one."""

import ast
import copy
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from fedlib.app import book, chapters, claims, coverage, queue
from fedlib.app.chapters import Paper, profiles
from fedlib.app.kit import sources
from fedlib.app.kit.claim_types import Claim, Comparison, Side

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "fedlib" / "app" / "chapters"  # a chapter: a module <name>.py, or a package <name>/ (its __init__)


def _declarations(path: Path) -> int:
    """How many top-level ``PAPER = Paper(...)`` statements a module has."""
    return sum(isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
               and getattr(node.value.func, "id", None) == "Paper"
               and [getattr(t, "id", None) for t in node.targets] == ["PAPER"]
               for node in ast.parse(path.read_text()).body)


def _source_chapters() -> set[str]:
    """The chapters of the sources, read from the folder: every module or package that declares a ``PAPER``."""
    found = {p.stem: p for p in FOLDER.glob("*.py") if p.stem != "__init__"}
    found |= {p.parent.name: p for p in FOLDER.glob("*/__init__.py")}
    return {name for name, path in found.items() if _declarations(path)}


def test_the_registry_is_the_chapters_the_sources_declare():
    registry = chapters.registry()
    assert registry and set(registry) == _source_chapters()
    assert tuple(registry) == chapters.CHAPTER_MODULES == chapters.declared_chapters()
    assert list(registry) == sorted(registry, key=lambda name: (registry[name].rank, name))  # the queue's order
    papers = [name for name, paper in registry.items() if not paper.ours]
    assert papers and sorted(chapters.papers()) == sorted(papers)
    assert claims.papers() == {name: registry[name].title for name in chapters.papers()}
    assert list(claims.papers()) == [page for page in book.toc_chapters() if page in papers]  # the book's order
    for name, paper in registry.items():
        assert paper.engine == issubclass(paper.profile_schema, profiles.EngineProfile), name
        assert (chapters.defenses(name, {}) is not None) == paper.engine, name
        if paper.ours:  # ours compare with no paper's numbers or with a paper's
            assert paper.reference is None or paper.reference in papers, name
        else:  # a paper's published tables: book/reference/<name>.yaml
            assert paper.reference == name


def test_every_chapter_module_declares_exactly_one_paper():
    declared = {p.stem: _declarations(p) for p in sorted(FOLDER.glob("*.py"))}
    declared |= {p.parent.name: _declarations(p) for p in sorted(FOLDER.glob("*/__init__.py"))}
    declared |= {f"{p.parent.name}.{p.stem}": _declarations(p) for p in sorted(FOLDER.glob("*/*.py"))
                 if p.stem != "__init__"}  # a package's other modules declare none
    assert {name: n for name, n in declared.items() if n} == dict.fromkeys(chapters.CHAPTER_MODULES, 1)
    for name, paper in chapters.registry().items():
        assert paper.name == name and chapters.chapter_module(name).PAPER is paper
        assert (ROOT / "book" / f"{name}.ipynb").is_file() and (ROOT / "params" / name / "paper.yaml").is_file()
        assert name in book.toc_chapters(), f"{name}: not in the book's contents"
        assert paper.reference is None or (ROOT / "book" / "reference" / f"{paper.reference}.yaml").is_file()


def test_claims_and_their_metrics_live_with_their_paper():
    registry = chapters.registry()
    for name, paper in registry.items():
        assert bool(paper.claims) != paper.ours, name  # a paper's chapter states its claims, ours none
        assert claims.claims_of(name) == list(paper.claims)  # in its scorecard's order
        assert all(claims.metric(metric) is reading for metric, reading in paper.metrics.items())
    names = [name for paper in registry.values() for name in paper.metrics]
    assert len(names) == len(set(names)) and not set(names) & set(claims.METRICS)  # one reading per name
    for name, paper in registry.items():
        for claim in paper.claims:
            for side in (s for c in claim.comparisons for s in (c.better, c.worse) if s is not None):
                assert side.metric in claims.METRICS or side.metric in paper.metrics, (name, side.metric)
    with pytest.raises(KeyError, match="unknown metric 'nowhere'"):
        claims.metric("nowhere")


@dataclass(frozen=True)
class FakeConfig:
    seed: int
    dataset: str = "fmnist"

    def key(self) -> str:
        return f"shared-run-{self.seed}"


def _fake_chapter(name: str, ours: bool, schema) -> tuple[Paper, Claim]:
    def runs(params):
        return [queue.QueueItem(name, "Table 1", "row", "column", 0, FakeConfig(0), queue.run_round)]

    claim = Claim(f"{name} beats FedAvg", "Table 1", "table-1", (Comparison("row", Side(("Table 1", "row", "column"),
                                                                                       f"{name}_reading")),))
    paper = Paper(name, name.title(), schema, runs, reference=None,
                  claims=() if ours else (claim,), metrics={f"{name}_reading": lambda result: 1.0}, ours=ours)
    return paper, claim


def test_a_new_chapter_is_one_record_and_every_list_follows(monkeypatch):
    """A new chapter (and one of ours) declared by a module alone: the registry, the papers of the
    status and coverage pages, the claims, the metrics, the queue (its items, its choice of label for a
    shared run), the defenses line and the profile check all list them."""
    class FakeProfile(profiles.EngineProfile):
        rounds: int

    before, papers = chapters.CHAPTER_MODULES, claims.papers()
    added = {}
    for name, ours in (("seventh", False), ("ourpage", True)):
        module = types.ModuleType(f"fedlib.app.chapters.{name}")
        module.PAPER, added[name] = _fake_chapter(name, ours, FakeProfile)
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(chapters, "CHAPTER_MODULES", before + ("ourpage", "seventh"))
    load = sources.load_profile
    monkeypatch.setattr(sources, "load_profile", lambda page, profile: {"rounds": 2} if page in added
                        else load(page, profile))

    assert tuple(chapters.registry()) == before + ("ourpage", "seventh")
    assert chapters.papers() == list(papers) + ["seventh"]  # not in _toc.yml: after the book's pages
    assert claims.papers() == {**papers, "seventh": "Seventh"}
    assert claims.claims_of("seventh") == [added["seventh"]] and claims.claims_of("ourpage") == []
    assert claims.metric("seventh_reading")({}) == 1.0
    monkeypatch.setattr(claims, "numbers", lambda paper, profile: pd.DataFrame({"reproduces": ["—"]}))
    assert coverage.reproduction(None, "smoke").index.tolist() == chapters.papers()  # the coverage page's default
    items = queue.all_items("smoke", only=["ourpage", "seventh"])
    assert [(i.chapter, i.key) for i in items] == [("ourpage", "shared-run-0"), ("seventh", "shared-run-0")]
    assert [i.chapter for i in queue.unique(items)] == ["seventh"]  # a run shared with a paper is the paper's
    assert chapters.defenses("seventh", {"rounds": 2}).startswith("**Defenses on:**")
    assert profiles.schema_of("seventh") is FakeProfile
    with pytest.raises(profiles.ProfileError, match=r"^params/seventh/quick.yaml: parameter rounds: "):
        monkeypatch.setattr(sources, "load_profile", lambda page, profile: {"rounds": "2"})
        queue.chapter_items("seventh", "quick")


def test_an_unknown_chapter_is_one_line_naming_the_chapters():
    named = ", ".join(chapters.CHAPTER_MODULES)
    with pytest.raises(ValueError, match=re.escape(f"unknown chapter 'nosuch'; chapters with stored runs: {named}")):
        chapters.record("nosuch")
    with pytest.raises(ValueError, match="--only: unknown chapter 'nosuch'"):
        queue.all_items("smoke", only=["nosuch"])


def test_the_chapter_modules_are_found_from_their_declarations(tmp_path):
    """CHAPTER_MODULES is read from the sources: a module with ``PAPER = Paper(..., rank=r)`` is a chapter, in
    rank order (no rank: after, by name); a module without a PAPER, or with one inside a function, is not."""
    assert chapters.CHAPTER_MODULES == chapters.declared_chapters()
    assert set(chapters.CHAPTER_MODULES) == _source_chapters()
    (tmp_path / "zeta.py").write_text("PAPER = Paper('zeta', 'Zeta', None, None, None, reference=None, rank=2)\n")
    (tmp_path / "alpha.py").write_text("X = 1\nPAPER = Paper('alpha', 'Alpha', None, None, None, None)\n")
    (tmp_path / "beta.py").write_text("PAPER = Paper('beta', 'Beta', None, None, None, None, rank=-1)\n")
    (tmp_path / "helpers.py").write_text("def f():\n    PAPER = Paper('no', 'No', None, None, None, None)\n")
    (tmp_path / "gamma.py").write_text("PAPER = Paper('gamma', 'Gamma', None, None, None, None)\n")
    (tmp_path / "delta").mkdir()  # a chapter split into a package: its __init__ declares the record
    (tmp_path / "delta" / "__init__.py").write_text("PAPER = Paper('delta', 'Delta', None, None, None, None, rank=3)\n")
    (tmp_path / "delta" / "page.py").write_text("PAPER = Paper('page', 'Page', None, None, None, None)\n")
    assert chapters.declared_chapters(tmp_path) == ("beta", "zeta", "delta", "alpha", "gamma")


def test_a_chapter_the_toc_does_not_name_is_listed_with_the_papers(tmp_path, monkeypatch):
    """A new chapter needs no line in book/_toc.yml: the book's table of contents (and the stage the
    build writes) lists it at the end of "The papers"; the contents as written are kept otherwise, and a
    chapter's line, where present, places it."""
    import shutil

    import yaml

    shutil.copytree(ROOT / "book", tmp_path / "book", ignore=shutil.ignore_patterns("_executed", "_build"))
    for module in (book, sources):  # the contents read it from sources, the stage from the build
        monkeypatch.setattr(module, "book_dir", lambda: tmp_path / "book")

    def papers_part(contents):
        return next(p for p in contents["parts"] if p["caption"] == chapters.PAPERS_PART)

    written = yaml.safe_load((tmp_path / "book" / "_toc.yml").read_text())
    named = set(chapters._toc_files(written))
    expected = copy.deepcopy(written)  # as written, and a chapter it does not name at the end of "The papers"
    papers_part(expected)["chapters"] += [{"file": name} for name in chapters.registry() if name not in named]
    assert book.toc() == expected
    before = book.toc_chapters()
    after_papers = max(before.index(f) for f in chapters._toc_files(papers_part(book.toc())) if f in before) + 1
    template = ROOT / "book" / f"{chapters.CHAPTER_MODULES[0]}.ipynb"
    (tmp_path / "book" / "seventh.ipynb").write_text(template.read_text())
    registry = chapters.registry
    monkeypatch.setattr(chapters, "registry", lambda: {**registry(), "seventh": None})
    assert papers_part(book.toc())["chapters"][-1] == {"file": "seventh"}
    assert book.toc_chapters() == before[:after_papers] + ["seventh"] + before[after_papers:]
    stage = tmp_path / "stage"
    book._stage_sources(stage)
    assert yaml.safe_load((stage / "_toc.yml").read_text()) == book.toc()
