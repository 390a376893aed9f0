"""Where a computation comes from: the repository and its commit, the device in words, and the one
provenance builder (:func:`environment`) that runs, the FedSCM one-shot stage, calibration records
and benchmarks all call (core; the book build reads them here too)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy
import torch

from ._version import __version__


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


def environment(device: "torch.device | str", wall: float | None = None, commit: bool = True) -> dict[str, Any]:
    """What ran a computation: fedlib's and the libraries' versions, Python, the device in words
    (:func:`device_name`), the date (UTC), the wall time when given and the commit when ``commit``
    (a stored run records its commit when it is stored, ``fedlib.results.stored_payload``)."""
    # lazy: torchvision (~2 s) stays out of `import fedlib`; only its version is read here
    import torchvision

    out: dict[str, Any] = {"fedlib_version": __version__, "torch": torch.__version__,
                           "torchvision": torchvision.__version__, "numpy": numpy.__version__,
                           "python": platform.python_version(), "device": device_name(device)}
    if wall is not None:
        out["wall_time"] = wall
    out["date"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if commit:
        out["commit"] = git_commit()
    return out
