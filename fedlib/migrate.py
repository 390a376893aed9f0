"""Re-key stored runs (``results/runs/*.json``) to the current cache key.

First, runs still kept per chapter (``results/<chapter>/<key>.json``, the layout before one
store) move to ``results/runs/<key>.json`` byte for byte (:func:`consolidate`); a run that two
chapters kept twice is kept once when both copies hold the same result.

A stored run is re-keyed (its file renamed to the current key, its history and numbers
unchanged, its provenance completed and noted) only where it provably answers the current key:

- a run recorded before keys held rule versions (``meta`` without ``rule_versions``) must be
  named by the old key formula (:func:`legacy_key`, so its config was not edited), have been
  computed with the method defaults and rules of commit f5ecf2b (``legacy_rules.json``: every
  rule version then was "1"; today's method, engine and config fields must still resolve it the
  same way), and record a ``dataset_source`` equal to the source of the data found now;
- a run that records rule versions must match today's resolved config, versions and data.

Everything else is left as it is and reported as stale; chapters list stale runs with what
changed (``fedlib.book.stored_results``) and never show them as current. Run it after merging
anything that changes a method's defaults, a rule version or the engine:
``python -m fedlib migrate-results [--dry-run]``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from .cache import ResultCache

LEGACY_FORMAT = 1  # CACHE_FORMAT of the old keys


@lru_cache(maxsize=1)
def legacy_rules() -> dict[str, Any]:
    """Method defaults, split defaults and config fields of commit f5ecf2b (all rule versions "1")."""
    return json.loads((Path(__file__).with_name("legacy_rules.json")).read_text())


def legacy_key(raw: dict[str, Any]) -> str | None:
    """The key the old formula gave a stored config (as written), or None if it cannot be read."""
    from .book import _parse_config

    config = _parse_config(raw)
    if config is None:
        return None
    data = config.model_dump(mode="json", exclude={"data_root", "client_chunk"})
    data["_format"] = LEGACY_FORMAT
    if not config.reference_values:
        data.pop("reference_values")
    if config.test_samples is not None:
        data["_test_subset"] = "random"
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def legacy_resolved(config) -> dict[str, Any] | None:
    """``config.resolved()`` as the code of f5ecf2b would have resolved it (None: not expressible)."""
    rules = legacy_rules()
    if sorted(type(config).model_fields) != rules["run_fields"] or config.method.name not in rules["methods"]:
        return None
    method = rules["methods"][config.method.name]
    data = json.loads(json.dumps(config.model_dump(mode="json", exclude={"data_root"})))
    data["method"] = {"name": config.method.name, **method["defaults"], **config.method.params}
    data["split"] = {"name": config.split.name, **rules["splits"].get(config.split.name, {}), **config.split.params}
    if config.server_val is None:
        needs = method["needs_validation"] or config.reference_values
        data["server_val"] = rules["server_val_default"] if needs else 0
    return json.loads(json.dumps(data))


# ----------------------------------------------------------------------------- the logit protocol's own loop

LOGIT_LOOP_COMMIT = "5928e36"  # the last commit whose fedlib/logit_run.py ran the logit protocol's own loop


def logit_run_config(raw: dict[str, Any]):
    """The engine RunConfig of a config written by the logit protocol's own loop (``aggregator``,
    ``k``, ``public_size`` ...): the same data, split, model, training and protocol choices."""
    from .chapters.logitfl import protocol_config

    return protocol_config(raw["aggregator"], **{k: v for k, v in raw.items() if k != "aggregator"})


def _logit_record(h: dict[str, Any], lr: float, uwa: bool) -> dict[str, Any]:
    present = [i for i, on in enumerate(h["present"]) if on]
    diagnostics = {k: h[k] for k in ("public_accuracy", "present", "mean_max_weight", "mean_entropy", "floats_up",
                                     "floats_down", "fedavg_floats") if k in h}
    diagnostics["client_accuracy"] = [a if on else None for a, on in zip(h["client_accuracy"], h["present"])]
    return {"round": h["round"], "lr": lr, "selected": present, "dropped": [], "clipped": [], "aggregated": present,
            "weights": [1.0 / len(present)] * len(present), "time_train": h["time_train"],
            "time_server": h["time_server"], "diagnostics": diagnostics, "accuracy": h["accuracy"],
            "balanced_accuracy": h["balanced_accuracy"], "per_class_accuracy": h["per_class_accuracy"]}


def convert_logit_runs(root: Path, *, dry_run: bool = False, today: str | None = None) -> list[tuple[str, str]]:
    """Store each run of the logit protocol's own loop (config with ``aggregator``) under the key of
    its engine config (``logit_run_config``), its numbers unchanged: that loop and the engine's
    logit methods compute the same rounds (``tests/test_logit.py``, the loop is the oracle
    ``fedlib.testing.logit_protocol_loop``). Records move to the engine's layout (the protocol's
    quantities under ``diagnostics``); the loop recorded no similarity, F1, loss or eval time.
    The old file is removed once the new one is written. Returns ``[(old key, new key)]``."""
    from .cache import ResultCache
    from .results import RUNS_FOLDER, _key_provenance, check_result

    runs = ResultCache(root / RUNS_FOLDER, protect=True)
    today = today or _dt.date.today().isoformat()
    done = []
    for path in sorted(runs.root.glob("*.json")) if runs.root.is_dir() else []:
        payload, problem = runs.read(path.stem)
        if problem or "aggregator" not in (payload.get("config") or {}):
            continue
        raw, result = payload["config"], payload["result"]
        config = logit_run_config(raw)
        fingerprint = config.data_fingerprint()
        new = config.key(fingerprint)
        done.append((path.stem, new))
        if dry_run:
            continue
        uwa = raw["aggregator"] == "uwa"
        final = {k: v for k, v in result["final"].items() if k != "uwa_weights" or uwa}
        final.setdefault("f1", None)
        note = (f"re-keyed from {path.stem} on {today}: computed by the logit protocol's own loop (fedlib/logit_run.py "
                f"at {LOGIT_LOOP_COMMIT}), which computes the same rounds as the engine's logit methods (their "
                "equivalence test); its records moved to the engine's layout; similarity, F1, loss and eval time "
                "were not recorded")
        meta = {**result["meta"], **_key_provenance(config, fingerprint, new), "rekeyed": note}
        converted = {"config": config.to_dict(), "final": final, "meta": meta,
                     "history": [_logit_record(h, config.lr, uwa) for h in result["history"]]}
        if check_result(converted) is not None:
            raise ValueError(f"{path.name}: the converted run is not valid ({check_result(converted)})")
        runs.put(new, {**payload, "config": config.to_dict(), "result": converted})
        if new != path.stem:
            path.unlink()
    return done


def _legacy_problem(stem: str, payload: dict, config, fingerprint: dict) -> str | None:
    raw, meta = payload.get("config"), payload["result"]["meta"]
    if legacy_key(raw) != stem:
        return "its file name is not the old key of its config (edited or renamed)"
    if any(v != "1" for v in config.rule_versions().values()):
        return f"rule versions are now {config.rule_versions()} (it was computed with version 1)"
    before = legacy_resolved(config)
    if before is None or before != config.resolved():
        from .book import _flat

        old, new = _flat(before or {}), _flat(config.resolved())
        diff = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        return f"its resolved config changed since it was computed ({', '.join(diff[:5]) or 'config fields'})"
    if fingerprint.get("sha256") is None:
        return "its data files are not here to fingerprint"
    if meta.get("dataset_source") != fingerprint.get("source"):
        return f"it records data {meta.get('dataset_source')!r}, the files here are {fingerprint.get('source')!r}"
    return None


def consolidate(root: Path, *, dry_run: bool = False) -> list[tuple[str, str]]:
    """Move ``root/<chapter>/<key>.json`` to ``root/runs/<key>.json`` with the file's bytes unchanged
    (written atomically before the old file is removed). A second copy of a key already there is
    removed only when its result is identical; otherwise both stay and it is reported. Returns
    ``[(old path relative to root, outcome)]``."""
    from .cache import atomic_write_text
    from .results import RUNS_FOLDER

    runs = root / RUNS_FOLDER
    moved = []
    for path in sorted(p for d in root.iterdir() if d.is_dir() and d.name != RUNS_FOLDER
                       for p in d.glob("*.json")) if root.is_dir() else []:
        target, name = runs / path.name, f"{path.parent.name}/{path.name}"
        if target.exists():
            same = json.loads(target.read_text())["payload"]["result"] == json.loads(path.read_text())["payload"]["result"]
            moved.append((name, "duplicate of runs/, removed" if same else "differs from runs/, left in place"))
            if same and not dry_run:
                os.unlink(path)
            continue
        moved.append((name, "moved to runs/"))
        if not dry_run:
            runs.mkdir(parents=True, exist_ok=True)
            atomic_write_text(target, path.read_text())
            os.unlink(path)
    for folder in (d for d in root.iterdir() if d.is_dir() and d.name != RUNS_FOLDER) if not dry_run else ():
        if not any(folder.iterdir()):
            folder.rmdir()
    return moved


def convert_calibration(path: Path, *, dry_run: bool = False) -> int:
    """The logit calibration record's points written by the protocol's own loop get their engine
    config and key (``logit_run_config``), so a resumed search recognises them; numbers unchanged."""
    from .cache import atomic_write_text

    if not path.is_file():
        return 0
    record = json.loads(path.read_text())
    changed = 0
    for point in record.get("points", []):
        if "aggregator" in (point.get("config") or {}):
            config = logit_run_config(point["config"])
            point["config"], point["key"] = config.to_dict(), config.key()
            changed += 1
    if changed and not dry_run:
        atomic_write_text(path, json.dumps(record, indent=1))
    return changed


def migrate_results(root: str | Path | None = None, *, dry_run: bool = False,
                    today: str | None = None) -> dict[str, list]:
    """Move per-chapter runs into ``root/runs/`` (:func:`consolidate`), then re-key the stored runs
    under ``root`` (default ``results/``).

    Returns ``{"moved": [(old file, outcome)], "rekeyed": [(folder, old, new)], "current": [(folder,
    key)], "stale": [(folder, file, why)]}``. A re-keyed file is written under the new key (atomically) before the old name is
    removed; nothing else is touched."""
    from .book import _parse_config, repo_root, what_changed
    from .run import _key_provenance, check_result, result_check

    root = Path(root) if root is not None else repo_root() / "results"
    today = today or _dt.date.today().isoformat()
    report: dict[str, list] = {"rekeyed": [], "current": [], "stale": [], "moved": consolidate(root, dry_run=dry_run),
                               "logit": convert_logit_runs(root, dry_run=dry_run, today=today),
                               "calibration": convert_calibration(root / "logitfl-calibration.json", dry_run=dry_run)}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        store = ResultCache(folder, protect=True)
        for path in sorted(folder.glob("*.json")):
            chapter, stem = folder.name, path.stem
            payload, problem = store.read(stem)
            result = (payload or {}).get("result")
            problem = problem or check_result(result)
            config = _parse_config(payload.get("config")) if not problem else None
            if problem or config is None:
                report["stale"].append((chapter, path.name, problem or "its config is not valid any more"))
                continue
            fingerprint = config.data_fingerprint()
            meta = result["meta"]
            if "rule_versions" in meta:  # already keyed by resolved config, versions and data
                if fingerprint.get("sha256") and result_check(config, fingerprint)(result) is None:
                    new = config.key(fingerprint)
                    if new == stem:
                        report["current"].append((chapter, stem))
                        continue
                    why = "records the current variant"
                else:
                    report["stale"].append((chapter, path.name, "; ".join(what_changed(meta, config, fingerprint))))
                    continue
            else:
                problem = _legacy_problem(stem, payload, config, fingerprint)
                if problem:
                    report["stale"].append((chapter, path.name, problem))
                    continue
                new = config.key(fingerprint)
                why = "resolved config and data fingerprint identical"
            report["rekeyed"].append((chapter, stem, new))
            if dry_run:
                continue
            meta = {**meta, **_key_provenance(config, fingerprint, new)}
            meta["rekeyed"] = f"re-keyed from {stem} on {today}: {why}"
            target = store.path(new)
            if target.exists():
                report["stale"].append((chapter, path.name, f"{target.name} exists already; left both as they are"))
                report["rekeyed"].pop()
                continue
            store.put(new, {**payload, "result": {**result, "meta": meta}})
            os.unlink(path)
    return report


def format_report(report: dict[str, list]) -> str:
    lines = [f"moved into runs/ {sum(o == 'moved to runs/' for _, o in report.get('moved', []))}, "
             f"re-keyed {len(report['rekeyed'])}, already current {len(report['current'])}, "
             f"left stale {len(report['stale'])}"]
    lines += [f"  {name}: {outcome}" for name, outcome in report.get("moved", []) if outcome != "moved to runs/"]
    lines += [f"  logit protocol run {old}.json -> {new}.json (engine config)" for old, new in report.get("logit", [])]
    lines += [f"  re-keyed {c}/{old}.json -> {new}.json" for c, old, new in report["rekeyed"]]
    lines += [f"  stale {c}/{name}: {why}" for c, name, why in report["stale"]]
    return "\n".join(lines)


def adopt_unclipped(chapter: str, configs, root: str | Path | None = None, *, dry_run: bool = False,
                    today: str | None = None) -> list[tuple[str, str, str]]:
    """Store, for each of ``configs`` that runs with update clipping off, a run already stored
    (under any chapter) with the same config but clipping on, where its history shows that no
    update was ever clipped: the two runs are then the same computation. The copy carries the
    requested config and a provenance note; its history is byte-identical; the clipped run stays
    where it is. ``chapter`` only names whose configs these are. Returns
    ``[(source file, new key, note)]``."""
    from .book import _parse_config, repo_root
    from .run import _key_provenance, check_result, result_check

    root = Path(root) if root is not None else repo_root() / "results"
    today = today or _dt.date.today().isoformat()
    wanted = {}
    for config in configs:
        if getattr(config, "update_clip", 0) is None:
            wanted[json.dumps({**config.resolved(), "update_clip": None}, sort_keys=True)] = config
    from .results import RUNS_FOLDER

    target_store = ResultCache(root / RUNS_FOLDER, protect=True)
    adopted = []
    for path in sorted(root.glob("*/*.json")):
        payload, problem = ResultCache(path.parent, protect=True).read(path.stem)
        result = (payload or {}).get("result")
        if problem or check_result(result):
            continue
        stored = _parse_config(payload.get("config"))
        if stored is None or getattr(stored, "update_clip", None) is None:
            continue
        config = wanted.get(json.dumps({**stored.resolved(), "update_clip": None}, sort_keys=True))
        if config is None or any(h.get("clipped") for h in result["history"]):
            continue
        fingerprint = config.data_fingerprint()
        if result_check(stored, fingerprint)(result) is not None:
            continue  # not current under its own config (other rule, other data)
        new = config.key(fingerprint)
        if target_store.path(new).exists():  # adopted earlier
            continue
        note = (f"re-keyed from {path.parent.name}/{path.stem} on {today}: computed with update_clip "
                f"{stored.update_clip:g}, and its history shows no update was ever clipped, so it is the run "
                f"with clipping off")
        adopted.append((f"{path.parent.name}/{path.name}", new, note))
        if dry_run:
            continue
        meta = {**result["meta"], **_key_provenance(config, fingerprint, new), "rekeyed": note}
        target_store.put(new, {**payload, "config": config.to_dict(),
                               "result": {**result, "config": config.to_dict(), "meta": meta}})
        # the clipped run stays: it is the answer to its own config (one store for every chapter)
    return adopted
