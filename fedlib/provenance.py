"""Where a computation comes from: the repository and its commit (core; the book build and the
stored runs' provenance both read them here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def repo_root() -> Path:
    """The repository holding book/ and params/ ($FEDLIB_REPO, else next to this package)."""
    env = os.environ.get("FEDLIB_REPO")
    return Path(env) if env else Path(__file__).resolve().parent.parent


def git_commit() -> str | None:
    """The repository's checked-out commit, or None (no git, not a repository)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root(), capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
