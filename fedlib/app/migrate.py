"""Re-key stored runs (``results/runs/<key>.json.zd``, or an earlier form) to the current cache key; compact the rest.

A stored run is re-keyed (its file renamed to the current key, its history and numbers
unchanged, its provenance completed and noted) only where it provably answers the current key:
its recorded resolved config, rule versions and data fingerprint match today's. Everything else is
left as it is and reported as stale; chapters list stale runs with what changed
(``fedlib.app.kit.stored.stored_results``) and never show them as current. Run it after merging anything
that changes the key's formula, a method's defaults, a rule version or the engine:
``python -m fedlib migrate-results [--dry-run]``.

The one-off conversions of earlier layouts (keys before rule versions, per-chapter folders, the
logit protocol's own loop) ran on 2026-11-26 and left notes in each converted run's ``meta.rekeyed``;
they were removed once no stored file used those layouts (commit 74f3e69 has them).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

from ..cache import FORMS, ResultCache, atomic_write_text
from ..record import _canonical, compact, expand
from ..config import RunConfig
from ..results import _key_provenance, result_check
from ..store import Store, list_store
from .kit.stored import what_changed


def migrate_results(root: str | Path | None = None, *, dry_run: bool = False,
                    today: str | None = None) -> dict[str, list]:
    """Re-key the stored runs of ``root/runs/`` (default ``results/``).

    Returns ``{"rekeyed": [(old, new)], "current": [key], "stale": [(file, why)]}``. A re-keyed
    file is written under the new key (atomically) before the old name is removed; nothing else
    is touched."""
    today = today or _dt.date.today().isoformat()
    report: dict[str, list] = {"rekeyed": [], "current": [], "stale": []}
    store = ResultCache(_existing_runs(root), protect=True)
    listing = list_store(store.root)  # links, FIFOs, odd names, unreadable or invalid entries: left as they are
    report["stale"] += [_left_out(line) for line in listing.left_out]
    for run in listing.runs:
        path, stem, payload, result, config = run.path, run.key, run.entry, run.result, run.config
        if not isinstance(config, RunConfig):  # a FedSCM pipeline: keyed by its own config, nothing to re-key
            continue
        fingerprint, meta = config.data_fingerprint(), result["meta"]
        if "rule_versions" not in meta:
            report["stale"].append((path.name, "stored before keys held rule versions (fedlib 74f3e69 converts it)"))
            continue
        if not fingerprint.get("sha256") or result_check(config, fingerprint)(result) is not None:
            report["stale"].append((path.name, "; ".join(what_changed(meta, config, fingerprint))))
            continue
        new = config.key(fingerprint)
        if new == stem:
            report["current"].append(new)
            continue
        if os.path.lexists(store.path(new)):  # whatever is there (a damaged file, a link) stays as it is
            report["stale"].append((path.name, f"{store.path(new).name} exists already; left both as they are"))
            continue
        report["rekeyed"].append((stem, new))
        if not dry_run:
            meta = {**meta, **_key_provenance(config, fingerprint, new),
                    "rekeyed": f"re-keyed from {stem} on {today}: records the current variant"}
            store.put(new, {**payload, "result": {**result, "meta": meta}})
            os.unlink(path)
    return report


def compress_results(root: str | Path | None = None, dry_run: bool = False) -> list[str]:
    """Rewrite every readable entry of ``root/runs/`` that is not yet in the current compact form (a plain
    ``<key>.json``, or an earlier ``<key>.json.gz``: its history a list of rounds or columns-1) as
    ``<key>.json.zd`` (``fedlib.cache``, ``fedlib.record``): the same key and payload, the history as columns
    at ``STORED_PRECISION`` (a columns-1 history is at it already: nothing changes but the encoding). Each
    rewritten entry is read back and must equal the original at that precision, else the original is put
    back and a RuntimeError names it. A file that fails its checksum is left as it is. Returns the keys
    rewritten."""
    store = ResultCache(_existing_runs(root), protect=True)
    done = []
    for key, path in store.scan().entries:  # regular files with a key's name only
        payload, problem = store.read(key)
        if payload is None or problem:
            continue
        if path.name.endswith(FORMS[0]):  # the current compact form (fedlib.cache): history columns-2
            continue
        done.append(key)
        if dry_run:
            continue
        original = path.read_bytes()
        store.put(key, payload)
        back, problem = store.read(key)
        if problem or _canonical(back) != _canonical(expand(compact(payload))):
            atomic_write_text(path, original)
            raise RuntimeError(f"{path.name}: the compact record does not read back as the original; left as it was")
    return done


def _left_out(line: str) -> tuple[str, str]:
    """A listing's left-out line ``<name> (<why>)`` as the report's (file, why)."""
    name, _, why = line.partition(" (")
    return name, why[:-1] if why.endswith(")") else why


def _existing_runs(root: str | Path | None) -> Path:
    """``root/runs``; a root without one is a one-line FileNotFoundError (nothing to migrate there)."""
    folder = Store(root).runs
    if not folder.is_dir():
        raise FileNotFoundError(f"--root {root if root is not None else folder.parent}: no stored runs "
                                f"(no folder {folder})")
    return folder


def format_report(report: dict[str, list]) -> str:
    lines = [f"re-keyed {len(report['rekeyed'])}, already current {len(report['current'])}, "
             f"left stale {len(report['stale'])}"]
    lines += [f"  re-keyed {old} -> {new}" for old, new in report["rekeyed"]]
    lines += [f"  stale {name}: {why}" for name, why in report["stale"]]
    return "\n".join(lines)


def adopt_unclipped(chapter: str, configs, root: str | Path | None = None, *, dry_run: bool = False,
                    today: str | None = None) -> list[tuple[str, str, str]]:
    """Store, for each of ``configs`` that runs with update clipping off, a run already stored
    (under any chapter) with the same config but clipping on, where its history shows that no
    update was ever clipped: the two runs are then the same computation. The copy carries the
    requested config and a provenance note; its history is byte-identical; the clipped run stays
    where it is. ``chapter`` only names whose configs these are. Returns
    ``[(source file, new key, note)]``."""
    today = today or _dt.date.today().isoformat()
    wanted = {_unclipped(config): config for config in configs if getattr(config, "update_clip", 0) is None}
    target_store = Store(root).cache()
    adopted = []
    folders = sorted(d for d in target_store.root.parent.iterdir() if d.is_dir() and not d.is_symlink())
    for run in sorted((run for d in folders for run in list_store(d).engine_runs()), key=lambda r: r.path):
        path, payload, result, stored = run.path, run.entry, run.result, run.config
        if getattr(stored, "update_clip", None) is None:
            continue
        config = wanted.get(_unclipped(stored))
        if config is None or any(h.get("clipped") for h in result["history"]):
            continue
        fingerprint = config.data_fingerprint()
        if result_check(stored, fingerprint)(result) is not None:
            continue  # not current under its own config (other rule, other data)
        new = config.key(fingerprint)
        if os.path.lexists(target_store.path(new)):  # adopted earlier (or a file in the way: left as it is)
            continue
        note = (f"re-keyed from {path.parent.name}/{run.key} on {today}: computed with update_clip "
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


def _unclipped(config) -> str:
    """A config's resolved form with update clipping off, as text (a lookup key)."""
    return json.dumps({**config.resolved(), "update_clip": None}, sort_keys=True)
