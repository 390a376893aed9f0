"""The book's chapters: one module per chapter, each declaring one :class:`Paper` record.

A chapter module (``fedlib/app/chapters/<name>.py``, or a package ``<name>/`` whose ``__init__``
declares the record) holds its runs once, ``runs(params)``: labelled cells the book and the queue read,
its profile schema (``fedlib.app.chapters.profiles``), the paper's claims and the tables and figures
its page shows, and ends with ``PAPER = Paper(...)``. Every list of chapters the queue, the
claims, the coverage and status pages and the command line use is derived from these records
(:func:`registry`). ``CHAPTER_MODULES`` is found, not written: the modules of this package that
declare ``PAPER = Paper(...)`` at top level, in the order of their ``rank``; the book lists a
chapter its ``_toc.yml`` does not name at the end of "The papers" (:func:`toc`).
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import yaml

from ..kit import sources

if TYPE_CHECKING:
    from ..kit.claim_types import Claim
    from .profiles import Profile

ENGINE_DEFAULT_CLIP = 10.0  # RunConfig.update_clip's default
DEFAULT_RANK = 100  # a chapter that states no rank comes after those that do, by name


def chapter_sources(folder: Path = Path(__file__).parent) -> dict[str, Path]:
    """Module name -> the source that may declare its ``PAPER``: ``<name>.py``, or ``<name>/__init__.py`` for a
    chapter split into a package (``celm/``: its ``__init__`` declares the record)."""
    found = {path.stem: path for path in folder.glob("*.py") if path.stem != "__init__"}
    found |= {path.parent.name: path for path in folder.glob("*/__init__.py")}
    return dict(sorted(found.items()))


def declared_chapters(folder: Path = Path(__file__).parent) -> tuple[str, ...]:
    """The modules (or packages) in ``folder`` with a top-level ``PAPER = Paper(...)``, by their ``rank=`` (then
    name).

    Read from the sources (no import), so the list exists before any chapter module is loaded."""
    found = []
    for name, path in chapter_sources(folder).items():
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["PAPER"]
                    and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "Paper"):
                rank = next((ast.literal_eval(k.value) for k in node.value.keywords if k.arg == "rank"), DEFAULT_RANK)
                found.append((rank, name))
    return tuple(name for _, name in sorted(found))


# every chapter module, in queue order: a run several chapters share is labelled by the first of equal rank
CHAPTER_MODULES = declared_chapters()


@dataclass(frozen=True)
class Paper:
    """One chapter's declaration: what the queue, the claims, the coverage and status pages and the
    profile checks know of it (a paper's chapter, or one of ours: the FedAvg baselines, the leaderboard)."""

    name: str  # the chapter key: fedlib/app/chapters/<name>.py (or <name>/), book/<name>.ipynb, params/<name>/
    title: str  # as the book names it (the status page's headings)
    profile_schema: type[Profile]  # params/<name>/{smoke,quick,paper,evidence}.yaml and the notebook's parameters cell
    runs: Callable[[dict[str, Any]], list]  # every run of a profile as labelled cells (QueueItems): book and queue
    reference: str | None  # book/reference/<reference>.yaml: the published numbers the page compares with
    claims: tuple[Claim, ...] = ()  # the paper's main claims, in the order its scorecard shows them
    metrics: Mapping[str, Callable[..., float]] = field(default_factory=dict)  # its claims' readings of a run
    ours: bool = False  # a chapter of ours, not a paper's: a run it shares with a paper is labelled by the paper
    rank: int = DEFAULT_RANK  # its place in the queue's order (CHAPTER_MODULES); a literal, read from the source

    def configs(self, params: dict[str, Any]) -> list:
        """Every run of ``params`` once (:func:`configs_of` its ``runs``)."""
        return configs_of(self.runs, params)

    @property
    def engine(self) -> bool:
        """Whether its runs go through ``fedlib.run`` and take the profile's ``update_clip`` (its
        schema is an ``EngineProfile``)."""
        return bool(getattr(self.profile_schema, "runs_through_engine", False))


def chapter_module(name: str):
    if name not in CHAPTER_MODULES:
        raise ValueError(f"chapter: unknown chapter {name!r}; chapters with stored runs: {', '.join(CHAPTER_MODULES)}")
    return importlib.import_module(f"{__name__}.{name}")


def registry() -> dict[str, Paper]:
    """Chapter name -> its module's ``PAPER``, in ``CHAPTER_MODULES`` order (imports the modules)."""
    out = {}
    for name in CHAPTER_MODULES:
        record = getattr(chapter_module(name), "PAPER", None)
        if not isinstance(record, Paper) or record.name != name:
            raise TypeError(f"fedlib.app.chapters.{name}: declares no PAPER = Paper({name!r}, ...)")
        out[name] = record
    return out


def record(name: str) -> Paper:
    """The ``Paper`` record of chapter ``name`` (a ValueError names the chapters)."""
    return chapter_module(name).PAPER


def resolved_methods(chapter: str, profile: str = "paper") -> dict[str, dict[str, Any]]:
    """Each method of the chapter's ``profile`` runs with its resolved hyper-parameters (and the run's
    resolved ``server_val``), from the first of its runs: what the runs use, defaults filled in."""
    out: dict[str, dict[str, Any]] = {}
    for config in record(chapter).configs(sources.load_profile(chapter, profile)):
        name = getattr(getattr(config, "method", None), "name", None)
        if name and name not in out:
            resolved = config.resolved()
            out[name] = {**resolved["method"], "server_val": resolved.get("server_val")}
    return out


def papers() -> list[str]:
    """The chapters that reproduce a paper (not ours), in the book's page order."""
    return book_order([name for name, paper in registry().items() if not paper.ours])


def book_order(names: list[str]) -> list[str]:
    """``names`` in the order of the book's pages (``_toc.yml``); those it does not list after them."""
    pages = [page for page in toc_chapters() if page in names]
    return pages + [name for name in names if name not in pages]


def run_options(params: dict) -> dict:
    """Engine options a profile may set for every run of a chapter (``update_clip``; absent:
    the engine default, so the run keys of profiles without it do not change)."""
    return {"update_clip": params["update_clip"]} if "update_clip" in params else {}


def defenses(chapter: str, params: dict) -> str | None:
    """One line naming the server-side defenses the chapter's runs have on (None: not an engine chapter)."""
    if chapter not in CHAPTER_MODULES or not record(chapter).engine:
        return None
    clip = params.get("update_clip", ENGINE_DEFAULT_CLIP)
    if clip is None:
        return "**Defenses on:** non-finite (NaN/Inf) updates are dropped; update clipping is off."
    return (f"**Defenses on:** non-finite (NaN/Inf) updates are dropped; updates farther from the global model "
            f"than {clip:g}× the round's median distance are clipped (not part of the papers' protocols).")


def configs_of(runs: Callable[[dict[str, Any]], list], params: dict) -> list:
    """The configs of a chapter's ``runs(params)``, each once, in the order of the first cell that names it
    (cells share runs: Table 8's 5 % is Table 1's CELM run)."""
    seen, out = set(), []
    for item in runs(params):
        if item.key not in seen:
            seen.add(item.key)
            out.append(item.config)
    return out


# ----------------------------------------------------------------------------- the book's contents


PAPERS_PART = "The papers"  # the _toc.yml part a chapter it does not name is listed in


def _toc_files(node):
    if isinstance(node, dict):
        yield from [node["file"]] if "file" in node else []
        node = list(node.values())
    for item in node if isinstance(node, list) else []:
        yield from _toc_files(item)


def toc() -> dict:
    """The book's table of contents: ``book/_toc.yml``, with every registered chapter it does not name
    that has a notebook added at the end of the part captioned "The papers" (or of the last part), so a
    new chapter needs no line there. The build writes this into its stage."""
    book_dir = sources.book_dir
    contents = yaml.safe_load((book_dir() / "_toc.yml").read_text())
    listed = {f.removesuffix(".ipynb") for f in _toc_files(contents)}
    missing = [name for name in registry() if name not in listed and (book_dir() / f"{name}.ipynb").is_file()]
    if missing:
        parts = contents.setdefault("parts", [{"caption": PAPERS_PART, "chapters": []}])
        part = next((p for p in parts if p.get("caption") == PAPERS_PART), parts[-1])
        part.setdefault("chapters", []).extend({"file": name} for name in missing)
    return contents


def toc_chapters() -> list[str]:
    """Notebook chapters in the table of contents' order (:func:`toc`), the status page last."""
    names = [f.removesuffix(".ipynb") for f in _toc_files(toc())]
    names = [n for n in names if (sources.book_dir() / f"{n}.ipynb").is_file()]
    return [n for n in names if n != sources.STATUS_PAGE] + ([sources.STATUS_PAGE] if sources.STATUS_PAGE in names else [])
