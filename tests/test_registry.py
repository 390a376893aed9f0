"""Issue 31 point 2: one declaration per chapter. Each chapter module declares one ``Paper`` record;
the queue's, the claims', the coverage page's and the command line's chapter lists are derived
from them (a new record shows up in all of them)."""

import ast
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

ROOT = Path(__file__).resolve().parent.parent
# the lists the records replace, as they were written before (chapters.CHAPTER_MODULES,
# chapters.ENGINE_CHAPTERS, queue.NOT_PAPERS, claims.PAPERS in the status page's order)
CHAPTERS = ("fedavg", "celm", "flce", "fedscm", "logitfl", "fedms", "leaderboard")
ENGINE_CHAPTERS = ("fedavg", "celm", "flce", "fedms", "leaderboard")
OURS = ("fedavg", "leaderboard")
STATUS_PAGE_PAPERS = {"celm": "CELM", "fedms": "FedMS", "flce": "FLCE", "logitfl": "Logit-based FL",
                      "fedscm": "FedSCM"}


def test_the_registry_lists_the_chapters_as_the_lists_did():
    registry = chapters.registry()
    assert tuple(registry) == CHAPTERS
    assert tuple(name for name, paper in registry.items() if paper.engine) == ENGINE_CHAPTERS
    assert tuple(name for name, paper in registry.items() if paper.ours) == OURS
    assert claims.papers() == STATUS_PAGE_PAPERS  # in the book's page order, as the status page showed them
    assert list(claims.papers()) == [page for page in book.toc_chapters() if page in STATUS_PAGE_PAPERS]
    assert {name: paper.reference for name, paper in registry.items()} == {
        "fedavg": "celm", "celm": "celm", "flce": "flce", "fedscm": "fedscm", "logitfl": "logitfl", "fedms": "fedms",
        "leaderboard": None}


def _declarations(path: Path) -> int:
    """How many top-level ``PAPER = Paper(...)`` statements a module has."""
    return sum(isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
               and getattr(node.value.func, "id", None) == "Paper"
               and [getattr(t, "id", None) for t in node.targets] == ["PAPER"]
               for node in ast.parse(path.read_text()).body)


def test_every_chapter_module_declares_exactly_one_paper():
    folder = ROOT / "fedlib" / "app" / "chapters"  # a module <name>.py, or a package <name>/ (its __init__)
    declared = {p.stem: _declarations(p) for p in sorted(folder.glob("*.py"))}
    declared |= {p.parent.name: _declarations(p) for p in sorted(folder.glob("*/__init__.py"))}
    declared |= {f"{p.parent.name}.{p.stem}": _declarations(p) for p in sorted(folder.glob("*/*.py"))
                 if p.stem != "__init__"}  # a package's other modules declare none
    assert {name: n for name, n in declared.items() if n} == dict.fromkeys(chapters.CHAPTER_MODULES, 1)
    for name, paper in chapters.registry().items():
        assert paper.name == name and chapters.chapter_module(name).PAPER is paper
        assert (ROOT / "book" / f"{name}.ipynb").is_file() and (ROOT / "params" / name / "paper.yaml").is_file()
        assert name in book.toc_chapters(), f"{name}: not in book/_toc.yml"
        assert paper.reference is None or (ROOT / "book" / "reference" / f"{paper.reference}.yaml").is_file()


def test_claims_and_their_metrics_live_with_their_paper():
    registry = chapters.registry()
    assert {name: len(paper.claims) for name, paper in registry.items()} == {
        "fedavg": 0, "celm": 5, "flce": 1, "fedscm": 2, "logitfl": 3, "fedms": 8, "leaderboard": 0}
    names = [name for paper in registry.values() for name in paper.metrics]
    assert len(names) == len(set(names)) and not set(names) & set(claims.METRICS)  # one reading per name
    for name, paper in registry.items():
        for claim in paper.claims:
            for side in (s for c in claim.comparisons for s in (c.better, c.worse) if s is not None):
                assert side.metric in claims.METRICS or side.metric in paper.metrics, (name, side.metric)
    assert claims.claims_of("celm")[0].text == "CELM beats uniform FedAvg on every Table 1 split"
    assert claims.metric("rare_class_accuracy") is registry["celm"].metrics["rare_class_accuracy"]
    with pytest.raises(KeyError, match="unknown metric 'nowhere'"):
        claims.metric("nowhere")


@dataclass(frozen=True)
class FakeConfig:
    seed: int
    dataset: str = "fmnist"

    def key(self) -> str:
        return f"shared-run-{self.seed}"


def _fake_chapter(name: str, ours: bool, schema) -> tuple[Paper, Claim]:
    def queue_items(params):
        return [queue.QueueItem(name, "Table 1", "row", "column", 0, FakeConfig(0), queue.run_round)]

    claim = Claim(f"{name} beats FedAvg", "Table 1", "table-1", (Comparison("row", Side(("Table 1", "row", "column"),
                                                                                       f"{name}_reading")),))
    paper = Paper(name, name.title(), schema, lambda params: [FakeConfig(0)], queue_items, reference=None,
                  claims=() if ours else (claim,), metrics={f"{name}_reading": lambda result: 1.0}, ours=ours)
    return paper, claim


def test_a_new_chapter_is_one_record_and_every_list_follows(monkeypatch):
    """A seventh chapter (and one of ours) declared by a module alone: the registry, the papers of the
    status and coverage pages, the claims, the metrics, the queue (its items, its choice of label for a
    shared run), the defenses line and the profile check all list them."""
    class FakeProfile(profiles.EngineProfile):
        rounds: int

    added = {}
    for name, ours in (("seventh", False), ("ourpage", True)):
        module = types.ModuleType(f"fedlib.app.chapters.{name}")
        module.PAPER, added[name] = _fake_chapter(name, ours, FakeProfile)
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(chapters, "CHAPTER_MODULES", CHAPTERS + ("ourpage", "seventh"))
    load = sources.load_profile
    monkeypatch.setattr(sources, "load_profile", lambda page, profile: {"rounds": 2} if page in added
                        else load(page, profile))

    assert tuple(chapters.registry()) == CHAPTERS + ("ourpage", "seventh")
    assert chapters.papers() == list(STATUS_PAGE_PAPERS) + ["seventh"]  # not in _toc.yml: after the book's pages
    assert claims.papers() == {**STATUS_PAGE_PAPERS, "seventh": "Seventh"}
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
    with pytest.raises(ValueError, match="unknown chapter 'nosuch'; chapters with stored runs: fedavg, celm, flce"):
        chapters.record("nosuch")
    with pytest.raises(ValueError, match="--only: unknown chapter 'nosuch'"):
        queue.all_items("smoke", only=["nosuch"])


def test_the_chapter_modules_are_found_from_their_declarations(tmp_path):
    """CHAPTER_MODULES is read from the sources: a module with ``PAPER = Paper(..., rank=r)`` is a chapter, in
    rank order (no rank: after, by name); a module without a PAPER, or with one inside a function, is not."""
    assert chapters.CHAPTER_MODULES == CHAPTERS == chapters.declared_chapters()
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
    """A seventh chapter needs no line in book/_toc.yml: the book's table of contents (and the stage the
    build writes) lists it at the end of "The papers"; the contents as written are kept otherwise."""
    import shutil

    import yaml

    shutil.copytree(ROOT / "book", tmp_path / "book", ignore=shutil.ignore_patterns("_executed", "_build"))
    for module in (book, sources):  # the contents read it from sources, the stage from the build
        monkeypatch.setattr(module, "book_dir", lambda: tmp_path / "book")
    assert book.toc() == yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())  # every chapter is named
    before = book.toc_chapters()
    (tmp_path / "book" / "seventh.ipynb").write_text((ROOT / "book" / "fedavg.ipynb").read_text())
    registry = chapters.registry
    monkeypatch.setattr(chapters, "registry", lambda: {**registry(), "seventh": None})
    papers_part = next(p for p in book.toc()["parts"] if p["caption"] == chapters.PAPERS_PART)
    assert papers_part["chapters"][-1] == {"file": "seventh"}
    after_papers = before.index("fedscm") + 1  # the last page of "The papers"
    assert book.toc_chapters() == before[:after_papers] + ["seventh"] + before[after_papers:]
    stage = tmp_path / "stage"
    book._stage_sources(stage)
    assert yaml.safe_load((stage / "_toc.yml").read_text()) == book.toc()
