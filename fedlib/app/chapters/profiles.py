"""Typed profiles: one schema per page for its papermill parameters.

A page's parameters are set three ways: ``params/<page>/{smoke,quick,paper}.yaml`` (``evidence``
inherits ``paper``), the notebook's parameters cell, and papermill's ``-p``/``-y`` values. All of
them are checked against one pydantic model (:class:`Profile`): every key declared with its type,
unknown keys refused, no value coerced (an int fits a float, nothing else changes kind). A field
without a default must be set by every profile; a field with one may be left out, and the default
says what leaving it out means.

A chapter declares its schema in its module (``Paper.profile_schema``); the pages that are not
chapters (coverage, explore, performance) declare theirs here.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...config import shown
from .. import chapters
from ..kit import sources
from . import ENGINE_DEFAULT_CLIP

# lists a page needs at least one item of
Ints = Annotated[list[int], Field(min_length=1)]  # e.g. the federation sizes timed, the k swept
Names = Annotated[list[str], Field(min_length=1)]  # methods, splits, experiments, datasets
Seeds = Ints  # seeds[0] is the first seed


class ProfileError(ValueError):
    """A profile that does not fit its page's schema: one line naming the file (or page) and the key."""


class Profile(BaseModel):
    """The base of every page's schema: no unknown key, no coercion."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class EngineProfile(Profile):
    """A chapter whose runs go through ``fedlib.run``: its profiles may set the engine's update clipping."""

    runs_through_engine: ClassVar[bool] = True  # what ``Paper.engine`` reads (no import of this module there)
    update_clip: float | None = ENGINE_DEFAULT_CLIP  # left out: the engine default; null: clipping off


class FederationProfile(EngineProfile):
    """The federation every paper chapter's profile sets (and the leaderboard's)."""

    n_clients: int
    rounds: int
    batch_size: int
    lr: float
    local_epochs: int
    fraction: float
    test_samples: int | None  # null: the whole test set
    seeds: Seeds


class Part(Profile):
    """A nested mapping of a profile (e.g. a study's own protocol): its keys are declared too."""


def problem(schema: type[Profile], values: dict[str, Any]) -> str | None:
    """What is wrong with ``values`` for ``schema``, one line naming the parameter (None: they fit).
    An unknown parameter is named first (a misspelt key also leaves its right name missing)."""
    try:
        schema.model_validate(values)
    except ValidationError as err:
        errors = sorted(err.errors(), key=lambda e: {"extra_forbidden": 0, "missing": 1}.get(e["type"], 2))
        first = errors[0]
        name = ".".join(str(part) for part in first["loc"])
        if first["type"] == "extra_forbidden":
            return f"unknown parameter {shown(name)}; known: {', '.join(_fields_at(schema, first['loc'][:-1]))}"
        if first["type"] == "missing":
            return f"missing parameter {shown(name)}"
        return f"parameter {name}: {first['msg']} (got {shown(first['input'])})".replace("\n", " ")
    return None


def _fields_at(schema: type[Profile], path: tuple) -> list[str]:
    """The keys of the mapping at ``path`` in ``schema`` (a nested ``Part``'s for a nested path; list
    indices step into the list's items)."""
    model = schema
    for key in (k for k in path if isinstance(k, str)):
        annotation = model.model_fields[key].annotation
        model = next(t for t in (annotation, *get_args(annotation)) if isinstance(t, type) and issubclass(t, Profile))
    return list(model.model_fields)


def check(schema: type[Profile], values: dict[str, Any], source: str) -> None:
    """Raise a one-line :class:`ProfileError` ``<source>: <problem>`` when ``values`` do not fit."""
    found = problem(schema, values)
    if found:
        raise ProfileError(f"{source}: {found}")


def load(page: str, profile: str) -> dict[str, Any]:
    """``params/<page>/<profile>.yaml`` (``fedlib.app.kit.sources.load_profile``: with what it inherits),
    checked against the page's schema."""
    params = sources.load_profile(page, profile)
    check(schema_of(page), params, f"params/{page}/{profile}.yaml")
    return params


# ----------------------------------------------------------------------------- the pages that are not chapters


class CoverageProfile(Profile):
    papers: Names | None  # the papers whose tables the page shows, in its order; null: every paper, in the book's


class ExploreProfile(Profile):
    """The explorer's first view; the keys only the notebook sets default to the explorer's own values."""

    dataset: str
    n_clients: int
    rounds: int
    fraction: float
    test_samples: int | None
    split: str = "dirichlet"
    alpha: float = 0.5
    methods: Names = ["fedavg", "fedavg_uniform"]
    seed: int = 0
    batch_size: int = 64


class PerformanceProfile(Profile):
    clients: Ints  # federation sizes timed
    rounds: int
    fraction: float
    engines: Names
    flower_max_clients: int
    valuation_clients: int
    valuation_rounds: int
    valuation_fraction: float
    breakdown: bool


PAGE_SCHEMAS: dict[str, type[Profile]] = {"coverage": CoverageProfile, "explore": ExploreProfile,
                                          "performance": PerformanceProfile}


def schema_of(page: str) -> type[Profile]:
    """The schema of a page's parameters: a chapter's from its ``Paper`` record, else ``PAGE_SCHEMAS``'s."""
    if page in chapters.CHAPTER_MODULES:
        return chapters.record(page).profile_schema
    if page not in PAGE_SCHEMAS:
        known = ", ".join(chapters.CHAPTER_MODULES + tuple(PAGE_SCHEMAS))
        raise ValueError(f"{page}: no profile schema; pages with one: {known}")
    return PAGE_SCHEMAS[page]
