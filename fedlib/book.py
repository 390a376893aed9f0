"""The book: profiles, papermill execution of every chapter, the Jupyter Book build, and
the helpers chapters share (headers, paper-vs-ours tables, stored full-protocol results).

Layout (relative to the repository root):
    book/<chapter>.ipynb           chapter sources, stored without outputs
    book/reference/<paper>.yaml    the papers' published numbers
    params/<chapter>/<profile>.yaml  papermill parameters: smoke, quick, paper
    results/<chapter>/<key>.json   stored runs (usually the paper profile) with provenance
    book/_executed/<profile>/      git-ignored: staged sources + executed notebooks + HTML
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

PROFILES = ("smoke", "quick", "paper")
STATUS_PAGE = "status"


def repo_root() -> Path:
    """The repository holding book/ and params/ ($FEDLIB_REPO, else next to this package)."""
    env = os.environ.get("FEDLIB_REPO")
    return Path(env) if env else Path(__file__).resolve().parent.parent


def book_dir() -> Path:
    return repo_root() / "book"


class BookError(RuntimeError):
    """A chapter failed or the book could not be built; the message says where."""


# ----------------------------------------------------------------------------- profiles


def load_profile(chapter: str, profile: str) -> dict[str, Any]:
    """The papermill parameters of one chapter and profile (YAML, safe loading)."""
    if profile not in PROFILES:
        raise ValueError(f"profile: must be one of {', '.join(PROFILES)} (got {profile!r})")
    path = repo_root() / "params" / chapter / f"{profile}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{chapter}: no parameter file {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of parameters")
    return data


def protocol_differences(chapter: str, params: dict[str, Any]) -> list[str]:
    """How these parameters differ from the chapter's `paper` profile, one line each."""
    try:
        paper = load_profile(chapter, "paper")
    except FileNotFoundError:
        return ["no paper profile recorded for this chapter"]
    out = []
    for key in sorted(set(paper) | set(params)):
        if key in ("profile", "notes"):
            continue
        ours, theirs = params.get(key, "—"), paper.get(key, "—")
        if ours != theirs:
            out.append(f"`{key}`: {_short(ours)} (paper protocol: {_short(theirs)})")
    return out


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def device_description() -> str:
    import torch

    if torch.cuda.is_available():
        return f"CUDA ({torch.cuda.get_device_name(0)})"
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__})"


def chapter_header(chapter: str, profile: str, params: dict[str, Any]):
    """The first output of every chapter: profile, device, and the protocol differences."""
    from IPython.display import Markdown

    diffs = protocol_differences(chapter, params)
    if profile == "paper" and not diffs:
        protocol = "This run follows the paper's protocol."
    else:
        protocol = ("**Reduced protocol.** This profile differs from the paper's protocol in:\n"
                    + "\n".join(f"- {d}" for d in diffs)) if diffs else "Same settings as the paper profile."
    from .chapters import defenses

    defended = defenses(chapter, params)
    return Markdown(
        f"**Profile:** `{profile}` &nbsp;·&nbsp; **Device:** {device_description()} &nbsp;·&nbsp; "
        f"**fedlib** {_fedlib_version()}\n\n{protocol}" + (f"\n\n{defended}" if defended else "")
    )


def _fedlib_version() -> str:
    from . import __version__

    commit = git_commit()
    return f"{__version__}" + (f" ({commit[:10]})" if commit else "")


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root(), capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


# ----------------------------------------------------------------------------- paper numbers


def load_reference(paper: str):
    """The paper's published numbers as a DataFrame (table, row, column, value, std)."""
    import pandas as pd

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


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    import numpy as np

    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=0)) if len(arr) > 1 else float("nan")


def pm(mean: float, std: float, digits: int = 2) -> str:
    if mean != mean:  # NaN
        return "—"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std == std else "")


def bold_best(frame, columns: list[str], higher_is_better: bool = True):
    """A pandas Styler of ``frame`` with the best of ``columns`` in each row in bold.

    Cells are strings like "81.6 ± 2.7"; the leading number is compared."""

    def leading(cell) -> float:
        try:
            return float(str(cell).split()[0])
        except (ValueError, IndexError):
            return float("nan")

    def style_row(row):
        values = {c: leading(row[c]) for c in columns if c in row.index}
        finite = {c: v for c, v in values.items() if v == v}
        best = (max if higher_is_better else min)(finite.values()) if finite else None
        return ["font-weight: bold" if c in finite and finite[c] == best else "" for c in row.index]

    return frame.style.apply(style_row, axis=1)


# ----------------------------------------------------------------------------- stored results


@dataclass
class Stored:
    """Stored full-protocol runs of the configs a chapter would run now: ``results`` are current
    (same resolved config, rule versions and data), ``stale`` ones were computed by another
    variant (each says what changed) and are never shown as current."""

    results: dict[str, Any]  # config key -> RunResult
    provenance: dict[str, dict]  # config key -> {commit, device, date, wall_time, resolved, rule_versions, data}
    skipped: list[str]  # files of other configs, or unreadable ones (with why)
    stale: dict[str, dict] = field(default_factory=dict)  # file name -> {"config", "changed", "result"}

    def describe(self) -> str:
        if not self.results and not self.skipped and not self.stale:
            return "No stored paper-profile results for this chapter yet."
        devices = sorted({p["device"] for p in self.provenance.values() if p.get("device")})
        commits = sorted({(p.get("commit") or "?")[:10] for p in self.provenance.values()})
        text = (f"{len(self.results)} stored paper-profile run(s) shown (device: {', '.join(devices) or '—'}; "
                f"fedlib commit: {', '.join(commits) or '—'}).")
        variants = sorted({json.dumps(p.get("rule_versions"), sort_keys=True) for p in self.provenance.values()
                           if p.get("rule_versions")})
        if variants:
            text += f" Rule versions: {'; '.join(variants)}."
        unverified = [k for k, p in self.provenance.items() if p.get("data_unverified")]
        if unverified:
            text += (f" {len(unverified)} of them could not be checked against local data (files not here); "
                     "they are shown with the data source they record.")
        if self.stale:
            text += f"\nStale (not shown): {len(self.stale)} stored run(s) of these configs made by another variant:"
            for name, info in self.stale.items():
                text += f"\n- {name}: {'; '.join(info['changed'])}"
        if self.skipped:
            text += (f"\nSkipped {len(self.skipped)} stored file(s) whose config no longer matches (or unreadable): "
                     + ", ".join(self.skipped))
        return text


def results_dir(chapter: str) -> Path:
    return repo_root() / "results" / chapter


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


def what_changed(meta: dict, config, fingerprint: dict) -> list[str]:
    """How a stored run's recorded variant differs from what ``config`` means now, one item each."""
    if "rule_versions" not in meta:
        return ["recorded before rule versions and data fingerprints, and not re-keyed "
                "(python -m fedlib migrate-results)"]
    changes = []
    old, new = _flat(meta.get("resolved") or {}), _flat(config.resolved())
    for k in sorted(set(old) | set(new)):
        if old.get(k, "—") != new.get(k, "—"):
            changes.append(f"{k}: {_short(old.get(k, '—'))} -> {_short(new.get(k, '—'))}")
    old_rules, new_rules = meta.get("rule_versions") or {}, config.rule_versions()
    for k in sorted(set(old_rules) | set(new_rules)):
        if old_rules.get(k) != new_rules.get(k):
            changes.append(f"{k} rule version {old_rules.get(k, '—')} -> {new_rules.get(k, '—')}")
    old_data = meta.get("data") or {}
    if fingerprint.get("sha256") and old_data.get("sha256") != fingerprint.get("sha256"):
        changes.append(f"data: {old_data.get('source')} ({str(old_data.get('sha256'))[:10]}) -> "
                       f"{fingerprint.get('source')} ({fingerprint['sha256'][:10]})")
    return changes or ["stored under another key"]


def _parse_config(raw: Any):
    """A stored config (RunConfig or logit protocol) as this version reads it, or None."""
    from .config import make_config
    from .logit_run import make_logit_config

    try:
        return make_logit_config(raw) if "aggregator" in raw else make_config(raw)
    except Exception:  # noqa: BLE001 - a config this version cannot read any more
        return None


def stored_results(chapter: str, configs) -> Stored:
    """Load ``results/<chapter>/*.json`` (never moving or deleting one) and sort them: current runs
    of ``configs`` (key = resolved config + rule versions + data fingerprint, and the file's own
    record agreeing), stale runs of the same configs made by another variant, and the rest."""
    from .cache import ResultCache
    from .run import RunResult, check_result, result_check

    wanted = {}  # key -> (config, fingerprint)
    for c in configs:
        fingerprint = c.data_fingerprint()
        wanted[c.key(fingerprint)] = (c, fingerprint)
    as_written = {json.dumps(c.to_dict(), sort_keys=True): k for k, (c, _) in wanted.items()}
    unverified = {c.config_key(): k for k, (c, fp) in wanted.items() if fp.get("sha256") is None}
    store = ResultCache(results_dir(chapter), protect=True)
    out = Stored({}, {}, [])
    if not store.root.is_dir():
        return out
    for path in sorted(store.root.glob("*.json")):
        payload, problem = store.read(path.stem)
        result = payload.get("result") if payload else None
        problem = problem or check_result(result)
        if problem:
            out.skipped.append(f"{path.name} ({problem})")
            continue
        meta = result["meta"]
        key = path.stem if path.stem in wanted else unverified.get(meta.get("config_key_without_data"))
        if key is not None and meta.get("config_key") == path.stem:
            config, fingerprint = wanted[key]
            check = result_check(config, fingerprint if fingerprint.get("sha256") else meta.get("data", {}))
            if check(result) is None:
                out.results[key] = RunResult.from_dict(result)
                out.provenance[key] = {**{k: payload.get(k) for k in ("commit", "device", "date", "wall_time")},
                                       **{k: meta.get(k) for k in ("resolved", "rule_versions", "data", "rekeyed")},
                                       "data_unverified": fingerprint.get("sha256") is None}
                continue
        parsed = _parse_config(payload.get("config"))
        same = as_written.get(json.dumps(parsed.to_dict(), sort_keys=True)) if parsed is not None else None
        if same is None:
            out.skipped.append(path.name)
            continue
        config, fingerprint = wanted[same]
        out.stale[path.name] = {"config": payload.get("config"), "changed": what_changed(meta, config, fingerprint),
                                "result": RunResult.from_dict(result)}
    return out


def current_and_stale(chapter: str, configs) -> tuple[dict[str, Any], dict[str, dict]]:
    """({key: RunResult} of current stored runs, {file name: {"config", "changed", "result"}} of stale
    ones): pages show the first as results and may list the second, with what changed."""
    stored = stored_results(chapter, configs)
    return stored.results, stored.stale


def store_results(chapter: str, configs, progress: bool = True) -> list[Path]:
    """Run ``configs`` and keep each result under ``results/<chapter>/`` (resumes: files that
    exist are not recomputed)."""
    from .cache import ResultCache
    from .run import run

    from .run import result_check

    store = ResultCache(results_dir(chapter), protect=True)
    written = []
    for i, config in enumerate(configs):
        fingerprint = config.data_fingerprint()
        key = config.key(fingerprint)
        stored = store.get(key)
        if stored is not None and result_check(config, fingerprint)(stored.get("result") or {}) is None:
            continue
        if progress:
            print(f"[{i + 1}/{len(configs)}] {chapter}: {config.method.name} {config.split.name} seed {config.seed}",
                  flush=True)
        result = run(config, progress=progress)
        payload = {"config": config.to_dict(), "result": result.to_dict(), "commit": git_commit(),
                   "device": result.meta["device"], "date": result.meta["date"],
                   "wall_time": result.meta["wall_time"]}  # of the run itself, even from the cache
        written.append(store.put(key, payload))
    return written


# ----------------------------------------------------------------------------- headlines


def headline_dir() -> Path:
    """Where chapters drop their headline comparisons for the status page."""
    env = os.environ.get("FEDLIB_BOOK_STAGE")
    return (Path(env) if env else Path.cwd()) / "_headlines"


def record_headlines(chapter: str, profile: str, rows: list[dict[str, Any]]) -> Path:
    """Save a chapter's headline comparisons: each row has claim, paper, ours (and notes)."""
    from .cache import atomic_write_text

    path = headline_dir() / f"{chapter}.json"
    atomic_write_text(path, json.dumps({"chapter": chapter, "profile": profile, "rows": rows}, indent=1))
    return path


def load_headlines() -> list[dict[str, Any]]:
    folder = headline_dir()
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


# ----------------------------------------------------------------------------- the build


def toc_chapters() -> list[str]:
    """Notebook chapters in _toc.yml order, the status page last."""
    toc = yaml.safe_load((book_dir() / "_toc.yml").read_text())
    files = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    names = [f.removesuffix(".ipynb") for f in files if (book_dir() / f"{f.removesuffix('.ipynb')}.ipynb").is_file()]
    return [n for n in names if n != STATUS_PAGE] + ([STATUS_PAGE] if STATUS_PAGE in names else [])


def stage_dir(profile: str) -> Path:
    """Where executed notebooks and the HTML go: $FEDLIB_BOOK_OUT/<profile> or book/_executed/<profile>."""
    env = os.environ.get("FEDLIB_BOOK_OUT")
    return (Path(env) if env else book_dir() / "_executed") / profile


def _stage_sources(stage: Path) -> None:
    """Copy everything but notebooks and build outputs into the stage."""
    src = book_dir()
    stage.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name.startswith(("_executed", "_build", ".")) or item.suffix == ".ipynb":
            continue
        target = stage / item.name
        if item.is_dir():
            shutil.copytree(item, target, dirs_exist_ok=True)
        else:
            shutil.copy2(item, target)


def _fingerprint(chapter: str, profile: str, stage: Path) -> str:
    """Hash of what a chapter's output depends on: source, parameters, fedlib, references."""
    h = hashlib.sha256()
    root = repo_root()
    parts = [book_dir() / f"{chapter}.ipynb", root / "params" / chapter / f"{profile}.yaml"]
    parts += sorted((root / "fedlib").rglob("*.py")) + sorted((book_dir() / "reference").glob("*.yaml"))
    parts += sorted(results_dir(chapter).glob("*.json")) if results_dir(chapter).is_dir() else []
    if chapter == STATUS_PAGE:
        parts += sorted((stage / "_headlines").glob("*.json"))
    for path in parts:
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def execute_chapter(chapter: str, profile: str, stage: Path, force: bool = False) -> tuple[Path, bool]:
    """Execute one chapter with papermill into the stage; skipped when nothing changed.

    Returns (executed notebook, whether it ran)."""
    import papermill

    out = stage / f"{chapter}.ipynb"
    stamp = stage / ".stamps" / f"{chapter}.sha256"
    fingerprint = _fingerprint(chapter, profile, stage)
    if not force and out.is_file() and stamp.is_file() and stamp.read_text() == fingerprint:
        return out, False
    params = {**load_profile(chapter, profile), "profile": profile} if chapter != STATUS_PAGE else {
        "profile": profile}
    env_before = {k: os.environ.get(k) for k in ("FEDLIB_BOOK_STAGE", "MPLBACKEND")}
    os.environ["FEDLIB_BOOK_STAGE"] = str(stage)
    # figures must be displayed inline even when the caller runs with MPLBACKEND=Agg
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        papermill.execute_notebook(
            str(book_dir() / f"{chapter}.ipynb"), str(out), parameters=params, cwd=str(stage),
            kernel_name="python3", progress_bar=False, log_output=False,
        )
    except papermill.PapermillExecutionError as err:
        stamp.unlink(missing_ok=True)
        raise BookError(f"chapter {chapter!r} failed in cell {err.exec_count}: {err.ename}: {err.evalue}\n"
                        f"{_strip_ansi(''.join(err.traceback[-3:]))}\n(executed notebook: {out})") from None
    finally:
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    from .cache import atomic_write_text

    atomic_write_text(stamp, fingerprint)  # written only after the chapter succeeded
    return out, True


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def build(profile: str = "quick", only: list[str] | None = None, html: bool = True, force: bool = False,
          log=print) -> Path:
    """Execute the chapters (all, or ``only``) and build the HTML; returns index.html (or the stage)."""
    if profile not in PROFILES:
        raise ValueError(f"profile: must be one of {', '.join(PROFILES)} (got {profile!r})")
    chapters = toc_chapters()
    unknown = sorted(set(only or []) - set(chapters))
    if unknown:
        raise ValueError(f"--only: unknown chapter {unknown[0]!r}; chapters: {', '.join(chapters)}")
    stage = stage_dir(profile)
    _stage_sources(stage)
    failures = []
    for chapter in chapters:
        if only and chapter not in only and chapter != STATUS_PAGE and (stage / f"{chapter}.ipynb").is_file():
            continue  # --only: other chapters keep their executed notebooks (executed once if missing)
        t0 = time.perf_counter()
        try:
            _, ran = execute_chapter(chapter, profile, stage, force=force and (not only or chapter in only))
        except BookError as err:
            failures.append(str(err))
            log(f"  {chapter}: FAILED\n{err}")
            continue
        log(f"  {chapter}: {'executed' if ran else 'unchanged'} in {time.perf_counter() - t0:.1f} s")
    if failures:
        raise BookError(f"{len(failures)} chapter(s) failed with profile {profile!r}:\n\n" + "\n\n".join(failures))
    if not html:
        return stage
    t0 = time.perf_counter()
    jb = Path(sys.executable).parent / "jupyter-book"
    proc = subprocess.run([str(jb) if jb.exists() else "jupyter-book", "build", str(stage), "--quiet", "-W",
                           "--keep-going"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BookError(f"jupyter-book build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    index = stage / "_build" / "html" / "index.html"
    log(f"  HTML built in {time.perf_counter() - t0:.1f} s")
    return index
