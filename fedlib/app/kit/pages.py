"""What a chapter page shows besides its own tables: this build's parameters against the paper profile's
(:func:`parameters_table`, :func:`protocol_differences`), the device it computes on, its headline
comparisons for the status page (:func:`record_headlines`), timings of the benchmarks it quotes
(:func:`measured_benchmark`) and how its text states a method's hyper-parameters (:data:`PROSE_SYMBOLS`).
The header every chapter opens with is ``fedlib.app.chapters.base.chapter_header``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from ...cache import atomic_write_text, default_cache_root
from ...provenance import device_name, git_commit, repo_root
from .sources import load_profile


def _differing(old: dict, new: dict) -> list[str]:
    """The keys whose values differ between ``old`` and ``new`` (a missing key reads "—"), sorted."""
    return [k for k in sorted(set(old) | set(new)) if old.get(k, "—") != new.get(k, "—")]


def _short(value: Any) -> str:
    plain = lambda o: o.model_dump() if hasattr(o, "model_dump") else str(o)  # noqa: E731
    text = json.dumps(value, default=plain) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def device_description() -> str:
    """The device this build computes on (``fedlib.provenance.device_name``) and torch's version."""
    return f"{device_name('cuda' if torch.cuda.is_available() else 'cpu')}, torch {torch.__version__}"


def parameters_table(chapter: str, params: dict[str, Any]):
    """This build's parameters next to the paper profile's, for the parameters that differ
    (a DataFrame: parameter, this build, paper; empty when the build follows the paper)."""
    import pandas as pd  # lazy: pandas (book extra); the queue imports the chapters without it

    try:
        paper = load_profile(chapter, "paper")
    except FileNotFoundError:
        paper = {}
    rows = [(key, _short(params.get(key, "—")), _short(paper.get(key, "—")))
            for key in _differing(paper, params) if key not in ("profile", "notes")]
    return pd.DataFrame(rows, columns=["parameter", "this build", "paper"])


def protocol_differences(chapter: str, params: dict[str, Any]) -> list[str]:
    """How these parameters differ from the chapter's `paper` profile, one line each."""
    if not (repo_root() / "params" / chapter / "paper.yaml").is_file():
        return ["no paper profile recorded for this chapter"]
    return [f"`{key}`: {ours} (paper protocol: {paper})" for key, ours, paper in
            parameters_table(chapter, params).itertuples(index=False)]


# ----------------------------------------------------------------------------- headlines


def headline_dir() -> Path:
    """Where chapters drop their headline comparisons for the status page."""
    env = os.environ.get("FEDLIB_BOOK_STAGE")
    return (Path(env) if env else Path.cwd()) / "_headlines"


def record_headlines(chapter: str, profile: str, rows: list[dict[str, Any]]) -> Path:
    """Save a chapter's headline comparisons: each row has claim, paper, ours (and notes)."""
    path = headline_dir() / f"{chapter}.json"
    atomic_write_text(path, json.dumps({"chapter": chapter, "profile": profile, "rows": rows}, indent=1))
    return path


# ----------------------------------------------------------------------------- benchmarks


def measured_benchmark(script: str, args: list[str]) -> tuple[dict, str]:
    """Run ``benchmarks/<script> <args> --json FILE`` and return (its JSON, its stdout), keeping the
    measurement (and the 1-minute load average before and after it, ``result["load"]``) under
    ``$FEDLIB_CACHE/benchmarks``, keyed by the script, its arguments, the fedlib
    commit (and working-tree state), the device and the torch version; a warm rebuild shows the
    stored measurement (with its own date) instead of timing again. A timing is data like a run."""
    dirty = subprocess.run(["git", "status", "--porcelain", "fedlib", "benchmarks"], cwd=repo_root(),
                           capture_output=True, text=True).stdout
    ident = json.dumps({"script": script, "args": args, "commit": git_commit(), "dirty": dirty,
                        "device": device_description(), "torch": torch.__version__}, sort_keys=True)
    path = default_cache_root() / "benchmarks" / f"{hashlib.sha256(ident.encode()).hexdigest()[:20]}.json"
    if path.is_file():
        try:
            kept = json.loads(path.read_text())
            return kept["result"], kept["stdout"] + f"\n(stored measurement of {kept['result'].get('date')}: same code, " \
                "arguments and device; delete it under $FEDLIB_CACHE/benchmarks to time again)"
        except (ValueError, KeyError):
            pass  # a damaged record: measure again (it is overwritten below)
    out_json = Path(tempfile.mkdtemp(prefix="fedlib-bench-")) / "out.json"
    before = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, str(repo_root() / "benchmarks" / script), *args, "--json", str(out_json)],
                          capture_output=True, text=True, cwd=repo_root())
    if proc.returncode != 0:
        raise RuntimeError(f"benchmarks/{script} failed:\n{proc.stderr[-3000:]}")
    # the 1-minute load average around the measurement (other work competing shows there), kept with it
    result = {**json.loads(out_json.read_text()),
              "load": {"before": before, "after": os.getloadavg()[0], "cores": os.cpu_count()}}
    atomic_write_text(path, json.dumps({"ident": json.loads(ident), "result": result, "stdout": proc.stdout}))
    return result, proc.stdout


# ----------------------------------------------------------------------------- prose from the code


def _g(key: str):
    return lambda h: f"{h[key]:g}"


# How a page states a method's hyper-parameter: method -> {symbol in the text: its value as the runs resolve it}.
PROSE_SYMBOLS: dict[str, dict[str, Any]] = {
    "fedprox": {"μ": _g("mu")}, "ditto": {"λ": _g("lam")}, "fedfv": {"α": _g("alpha"), "τ": _g("tau")},
    "moon": {"μ": _g("mu"), "τ": _g("tau")}, "qfedavg": {"q": _g("q")}, "fedfa": {"β": _g("beta"), "γ": _g("gamma")},
    "flce": {"λ": _g("lam"), "τ": _g("tau")}, "fedemd": {"β": _g("beta")}, "s_fedavg": {"α": _g("alpha")},
    "greedyfed": {"α": _g("alpha")}, "fedms": {"T": _g("temperature"), "α": _g("alpha")},
    "cffl": {"α": lambda h: f"{h['alpha']:g}(1 + t/T)" if h["alpha_growth"] else f"{h['alpha']:g}",
             "fade": lambda h: f"{h['fade']:g}"},
    "cgsv": {"α": lambda h: f"{h['alpha']:g}"},
    "shapfed": {"μ": lambda h: f"{h['mu']:g}"},
    "celm": {"β": lambda h: f"{h['ema']:g}", "λ": lambda h: f"{h['l2']:g}", "L": lambda h: f"{h['lm_steps']:d}",
             "η": lambda h: f"{h['lm_lr']:g}"},
}
