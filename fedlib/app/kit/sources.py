"""The book's sources on disk, read by the chapters, the queue and the claims as much as by the build:
the profiles (``params/<page>/<profile>.yaml``), the papers' published numbers (``book/reference/``,
:func:`load_reference`, :func:`reference_value`) and the chapter names a command is given. Part of the
chapter kit: it imports nothing of the application."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ...provenance import repo_root

PROFILES = ("smoke", "quick", "paper", "evidence")
EVIDENCE = "evidence"  # the paper profile's parameters, every number from the stored runs: nothing trains
STATUS_PAGE = "status"


def book_dir() -> Path:
    return repo_root() / "book"


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"profile: must be one of {', '.join(PROFILES)} (got {profile!r})")


def load_profile(chapter: str, profile: str) -> dict[str, Any]:
    """The papermill parameters of one chapter and profile (YAML, safe loading)."""
    _check_profile(profile)
    path = repo_root() / "params" / chapter / f"{profile}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{chapter}: no parameter file {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of parameters")
    if "inherit" in data:  # e.g. the evidence profile: the paper profile's parameters
        base = data.pop("inherit")
        if base not in PROFILES or base == profile:
            raise ValueError(f"{path}: inherit must name another profile (got {base!r})")
        data = {**load_profile(chapter, base), **data}
    return data


def load_reference(paper: str):
    """The paper's published numbers as a DataFrame (table, row, column, value, std)."""
    import pandas as pd  # lazy: pandas (book extra); the queue imports the chapters without it

    path = book_dir() / "reference" / f"{paper}.yaml"
    data = yaml.safe_load(path.read_text())
    frame = pd.DataFrame(data["entries"])
    if "std" not in frame:
        frame["std"] = float("nan")
    return frame


def reference_value(ref, table: str, row: str, column: str) -> tuple[float, float]:
    hit = ref[(ref.table == table) & (ref.row == row) & (ref.column == column)]
    if hit.empty:
        raise KeyError(f"reference: no entry for {table} / {row} / {column}")
    return float(hit.value.iloc[0]), float(hit["std"].iloc[0])


def check_only(only: list[str] | None, chapters) -> None:
    """``--only`` names chapters: a ValueError names the first that is not one of ``chapters``."""
    unknown = sorted(set(only or []) - set(chapters))
    if unknown:
        raise ValueError(f"--only: unknown chapter {unknown[0]!r}; chapters: {', '.join(chapters)}")
