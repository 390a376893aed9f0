"""Where a computation comes from: the repository and its commit (core; the book build and the
stored runs' provenance both read them here)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch


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


def device_name(device: "torch.device | str") -> str:
    """A device in words, the one format of runs, benchmarks and pages: ``cuda:0 (NVIDIA H100 80GB HBM3)``
    or ``cpu (x86_64, 2 cores, 2 threads)`` (machine, cores, torch's intra-op threads)."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"
