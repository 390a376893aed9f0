"""The stored runs as the pages read them (``results/runs/``, one store for every chapter; reading
never moves or deletes a file): :func:`stored_results` (the current and stale stored runs of the configs a
page would run now, :class:`Stored`), :class:`StoredIndex` (the stored runs by what made them, found
whether or not their data is on this machine) and :func:`evidence_of` (queue items' stored runs by cell
and seed); what the evidence build says of them (:func:`evidence_summary`, :class:`NothingStored`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...config import make_config
from ...results import RunResult, placement_free, result_check
from ...store import Store, StoreListing, StoredRun, list_store
from .claim_types import Cell
from .pages import _differing, _short

class NothingStored(RuntimeError):
    """Raised by a chapter of the evidence build that has no stored paper-protocol run: the page
    ends there with this message (the build keeps the cells before it, see
    :func:`fedlib.app.book.execute_chapter`)."""


def make_results_command(chapter: str) -> str:
    return f"make results CHAPTER={chapter} PROFILE=paper"


def evidence_summary(chapter: str, wanted: int, missing: int) -> str:
    """What the evidence build of ``chapter`` shows: how many of its paper-protocol runs are stored,
    and the command that makes the others."""
    if missing == wanted:
        return (f"Evidence build: none of the {wanted} paper-protocol run(s) of this page is stored under "
                f"results/runs/ yet, so the rest of the page is not shown. `{make_results_command(chapter)}` "
                f"makes them; `make book PROFILE=quick` shows the chapter at reduced scale.")
    text = (f"Evidence build: {wanted - missing} of the {wanted} paper-protocol run(s) of this page are stored "
            "under results/runs/ and shown; nothing was trained.")
    if missing:
        text += (f" The other {missing} are not stored: the cells that need them show \"—\" (or say \"not run\"); "
                 f"`{make_results_command(chapter)}` makes them.")
    return text


# ----------------------------------------------------------------------------- the configs' stored runs


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
            text += (f"\nLeft out {len(self.skipped)} file(s) of the store (not read, left as they are: unreadable, "
                     "not a regular file, or not a run this version reads): " + ", ".join(self.skipped))
        return text


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
        return ["recorded before rule versions and data fingerprints (fedlib 74f3e69 converts it)"]
    old, new = _flat(placement_free(meta.get("resolved")) or {}), _flat(placement_free(config.resolved()))
    changes = [f"{k}: {_short(old.get(k, '—'))} -> {_short(new.get(k, '—'))}" for k in _differing(old, new)]
    old, new = meta.get("rule_versions") or {}, config.rule_versions()
    changes += [f"{k} rule version {old.get(k, '—')} -> {new.get(k, '—')}" for k in _differing(old, new)]
    old_data = meta.get("data") or {}
    if fingerprint.get("sha256") and old_data.get("sha256") != fingerprint.get("sha256"):
        changes.append(f"data: {old_data.get('source')} ({str(old_data.get('sha256'))[:10]}) -> "
                       f"{fingerprint.get('source')} ({fingerprint['sha256'][:10]})")
    return changes or ["stored under another key"]


def _parse_config(raw: Any):
    """A stored config as this version reads it, or None."""
    try:
        return make_config(raw)
    except Exception:  # noqa: BLE001 - a config this version cannot read any more
        return None


def stored_results(chapter: str, configs) -> Stored:
    """Read the stored runs (``results/runs/<key>.json.zd``, never moving or deleting one) that answer
    ``configs``: current runs (key = resolved config + rule versions + data fingerprint, and the
    file's own record agreeing) and stale runs of the same configs made by another variant; runs of
    other configs are not this chapter's and are left out, unreadable files are listed as skipped."""
    wanted = {}  # key -> (config, fingerprint)
    for c in configs:
        fingerprint = c.data_fingerprint()
        wanted[c.key(fingerprint)] = (c, fingerprint)
    as_written = {json.dumps(c.to_dict(), sort_keys=True): k for k, (c, _) in wanted.items()}
    def made_by(resolved, rules) -> str:  # what made a run, wherever it ran (a GPU run keeps the CPU config's key)
        return json.dumps([placement_free(resolved), rules], sort_keys=True, default=str)

    unverified = {made_by(c.resolved(), c.rule_versions()): k for k, (c, fp) in wanted.items()
                  if fp.get("sha256") is None}
    listing = Store().listing()  # every file judged once: links, FIFOs, odd names, invalid ones left out
    out = Stored({}, {}, list(listing.left_out))
    for run in listing.engine_runs():  # a run's history is decoded only when it is this chapter's
        path, stem, meta = run.path, run.key, run.meta
        made = made_by(meta.get("resolved"), meta.get("rule_versions"))
        key = stem if stem in wanted else unverified.get(made)
        # a run of the queue on a GPU keeps its own config_key (device "cuda") under the chapter's key:
        # result_check compares the config without its placement, the rule versions and the data; without
        # the data here, the file's key must be the config's key on the data the run recorded; and the
        # entry's own config must have the file's key (a re-signed entry naming another config is not current)
        if key is not None and (stem in wanted or wanted[key][0].key(meta.get("data") or {}) == stem) \
                and run.agrees():
            config, fingerprint = wanted[key]
            check = result_check(config, fingerprint if fingerprint.get("sha256") else meta.get("data", {}))
            if check(run.result) is None:
                out.results[key] = RunResult.from_dict(run.result)
                out.provenance[key] = {**{k: run.stored.get(k) for k in ("commit", "device", "date", "wall_time")},
                                       **{k: meta.get(k) for k in ("resolved", "rule_versions", "data", "rekeyed")},
                                       "data_unverified": fingerprint.get("sha256") is None}
                continue
        same = as_written.get(json.dumps(run.config.to_dict(), sort_keys=True))
        if same is None:  # another chapter's run (one store for all)
            continue
        config, fingerprint = wanted[same]
        out.stale[path.name] = {"config": run.stored.get("config"),
                                "changed": what_changed(meta, config, fingerprint),
                                "result": RunResult.from_dict(run.result)}
    return out


# ----------------------------------------------------------------------------- the stored runs, by what made them


def _signature(resolved: dict | None, rule_versions: dict | None) -> str:
    return json.dumps([placement_free(resolved), rule_versions], sort_keys=True, default=str)


_INDEXES: dict[Path, tuple[StoreListing, "StoredIndex"]] = {}  # root -> (its listing, its index)


@dataclass
class StoredIndex:
    """The stored runs of a folder, by what made them (resolved config without placement, rule
    versions): reading them never moves one; the files left out of the listing
    (``fedlib.results.list_store``: links, FIFOs, folders, odd names, unreadable or invalid entries)
    are listed in ``skipped``, one line each."""

    root: Path
    by_signature: dict[str, list[StoredRun]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, root: Path | None = None) -> "StoredIndex":
        """The index of ``root`` (default: the repository's ``results/runs/``); read again only when a
        file there changed (:func:`fedlib.results.list_store`)."""
        listing = Store().listing() if root is None else list_store(root)
        cached = _INDEXES.get(listing.root)
        if cached is not None and cached[0] is listing:
            return cached[1]
        index = cls(listing.root, skipped=list(listing.left_out))
        for run in listing.engine_runs():
            meta = run.meta
            sig = _signature(meta.get("resolved"), meta.get("rule_versions"))
            index.by_signature.setdefault(sig, []).append(run)
        _INDEXES[listing.root] = (listing, index)
        return index

    def run_of(self, config, local: dict | None = None) -> tuple[dict, bool] | None:
        """The stored run ``config`` made, judged by the data fingerprint the run recorded, and
        whether that data is on this machine; None when there is none. The file's key must be the
        config's key on that data, and the entry's own config must agree (:meth:`StoredRun.agrees`).
        ``local``: this machine's fingerprint of the config's data (default: computed); where present
        it must match."""
        candidates = self.by_signature.get(_signature(config.resolved(), config.rule_versions()), [])
        if not candidates:
            return None
        local = config.data_fingerprint() if local is None else local
        for run in candidates:
            result = run.result
            recorded = result["meta"].get("data") or {}
            if not recorded.get("sha256") or config.key(recorded) != run.key or not run.agrees():
                continue
            if result_check(config, recorded)(result) is not None:
                continue
            if local.get("sha256") is None:
                return result, False
            if local["sha256"] == recorded["sha256"]:
                return result, True
        return None


# ----------------------------------------------------------------------------- queue items' stored runs, by cell


Evidence = dict[Cell, dict[int, dict]]  # queue cell -> seed -> result dict


def evidence_of(items, index: StoredIndex | None = None, absent: set | None = None) -> Evidence:
    """The stored runs of queue ``items`` (:class:`fedlib.app.kit.items.QueueItem`; ``results/runs/``) by
    their cell (table, row, column) and seed, whether or not their data is on this machine; ``absent``
    (when given) collects the cells whose runs used data this machine lacks."""
    index = StoredIndex.read() if index is None else index
    fingerprints: dict[str, dict] = {}
    out: Evidence = {}
    for item in items:
        config = item.config
        local = fingerprints.setdefault(config.dataset, config.data_fingerprint())
        hit = index.run_of(config, local)
        if hit is not None:
            cell = (item.table, item.row, item.column)
            out.setdefault(cell, {})[item.seed] = hit[0]
            if not hit[1] and absent is not None:
                absent.add(cell)
    return out
