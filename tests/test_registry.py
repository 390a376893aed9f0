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
from fedlib.app.claims import Claim, Comparison, Side

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
    declared = {p.stem: _declarations(p) for p in sorted((ROOT / "fedlib" / "app" / "chapters").glob("*.py"))}
    assert {name: n for name, n in declared.items() if n} == dict.fromkeys(chapters.CHAPTER_MODULES, 1)
    for name, paper in chapters.registry().items():
        assert paper.name == name and chapters.chapter_module(name).PAPER is paper
        assert (ROOT / "book" / f"{name}.ipynb").is_file() and (ROOT / "params" / name / "paper.yaml").is_file()
        assert name in book.toc_chapters(), f"{name}: not in book/_toc.yml"
        assert paper.reference is None or (ROOT / "book" / "reference" / f"{paper.reference}.yaml").is_file()


def test_claims_and_their_metrics_live_with_their_paper():
    registry = chapters.registry()
    assert {name: len(paper.claims) for name, paper in registry.items()} == {
        "fedavg": 0, "celm": 3, "flce": 1, "fedscm": 2, "logitfl": 3, "fedms": 3, "leaderboard": 0}
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
    load = book.load_profile
    monkeypatch.setattr(book, "load_profile", lambda page, profile: {"rounds": 2} if page in added
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
        monkeypatch.setattr(book, "load_profile", lambda page, profile: {"rounds": "2"})
        queue.chapter_items("seventh", "quick")


def test_an_unknown_chapter_is_one_line_naming_the_chapters():
    with pytest.raises(ValueError, match="unknown chapter 'nosuch'; chapters with stored runs: fedavg, celm, flce"):
        chapters.record("nosuch")
    with pytest.raises(ValueError, match="--only: unknown chapter 'nosuch'"):
        queue.all_items("smoke", only=["nosuch"])
