"""Re-computation check of the committed store (issue 43 point 2).

A stored run is evidence only if today's engine, given its stored config, computes the same
numbers. Two checks, both against the determinism contract (:mod:`fedlib.determinism`):

* **sample** (:func:`check_sample`): a seeded sample of stored runs, each re-computed for its first
  ``rounds`` rounds (the full protocol, stopped early: no schedule or warm-up changes) and compared
  round by round with the stored history within the contract's cross-machine tolerance;
* **in full** (:func:`recompute_in_full`): runs whose equivalence to today's engine was asserted when
  they were re-keyed (``meta.rekeyed`` names another loop or a config that was assumed equal) are
  re-computed whole. One that differs beyond the tolerance is replaced in the store by today's run,
  whose ``meta.recomputed`` keeps what the earlier record said (its final accuracy and where the
  histories first parted), so nothing is silently lost.

``python -m fedlib.app.recompute --sample 6 --rounds 2`` and ``--rekeyed [--store]`` run them.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import fedlib

from ..cache import ResultCache
from ..config import make_config
from ..determinism import CROSS_MACHINE
from ..store import Store, list_store, run_of

# re-keyed runs whose equivalence with today's engine was asserted rather than re-computed
ASSERTED_REKEYS = ("logit protocol's own loop", "update_clip 10")


@dataclass
class Comparison:
    """Where a re-computed history departs from the stored one beyond the tolerance."""

    key: str
    rounds: int
    worst: dict[str, float] = field(default_factory=dict)  # metric -> largest |stored - fresh|
    departures: list[str] = field(default_factory=list)  # one line each, first round first
    final_stored: float | None = None
    final_fresh: float | None = None

    @property
    def agrees(self) -> bool:
        return not self.departures

    def line(self) -> str:
        worst = ", ".join(f"{k} {v:.2g}" for k, v in sorted(self.worst.items()))
        verdict = "agrees" if self.agrees else f"DIFFERS ({self.departures[0]})"
        return f"{self.key}: {self.rounds} round(s) {verdict}; largest differences: {worst or 'none'}"


class _Enough(Exception):
    """Raised from ``on_round`` to stop a re-computation after its first rounds."""


def fresh_history(config: dict[str, Any], rounds: int | None) -> list[dict]:
    """The first ``rounds`` rounds (all when None) of ``config`` computed by today's engine, uncached."""
    records: list[dict] = []

    def keep(record: dict) -> None:
        records.append(record)
        if rounds is not None and len(records) >= rounds:
            raise _Enough

    try:
        result = fedlib.run(make_config(config), cache=False, progress=False, on_round=keep)
    except _Enough:
        return records
    return result.history


def compare(key: str, stored: list[dict], fresh: list[dict], tolerance=CROSS_MACHINE) -> Comparison:
    """Round-by-round comparison on what a page reads: accuracy, loss, the aggregation weights, the
    selected clients. Selections must be equal; numbers within ``tolerance`` (absolute)."""
    n = min(len(stored), len(fresh))
    out = Comparison(key=key, rounds=n)
    if len(fresh) < len(stored) and len(fresh) < n:
        out.departures.append(f"re-computed {len(fresh)} rounds, stored {len(stored)}")
    for a, b in zip(stored[:n], fresh[:n]):
        t = a.get("round")
        if a.get("selected") != b.get("selected"):
            out.departures.append(f"round {t}: selected {a.get('selected')} vs {b.get('selected')}")
        for metric, limit in (("accuracy", tolerance.accuracy), ("loss", tolerance.loss),
                              ("weights", tolerance.weights)):
            x, y = a.get(metric), b.get(metric)
            if x is None or y is None:
                continue
            xs, ys = (x, y) if isinstance(x, list) else ([x], [y])
            if len(xs) != len(ys):
                out.departures.append(f"round {t}: {metric} has {len(xs)} vs {len(ys)} entries")
                continue
            gap = max((abs(float(p) - float(q)) for p, q in zip(xs, ys)), default=0.0)
            out.worst[metric] = max(out.worst.get(metric, 0.0), gap)
            if gap > limit:
                out.departures.append(f"round {t}: {metric} differs by {gap:.3g} (tolerance {limit:g})")
    return out


def _entries(store: ResultCache) -> Iterable[tuple[str, dict, dict]]:
    """The store's valid engine runs (the one listing, ``fedlib.results.list_store``): key, entry, run."""
    for stored in list_store(store.root).engine_runs():
        yield stored.key, stored.entry, stored.result


def asserted_rekeys(store: ResultCache) -> list[str]:
    """Keys of stored runs re-keyed on an asserted equivalence (:data:`ASSERTED_REKEYS`), logit runs first."""
    found = [(0 if "logit" in note else 1, key) for key, _, result in _entries(store)
             for note in [str(result.get("meta", {}).get("rekeyed", ""))] if any(a in note for a in ASSERTED_REKEYS)]
    return [key for _, key in sorted(found)]


def sample_keys(store: ResultCache, n: int, seed: int = 0, max_rounds_cost: int | None = None) -> list[str]:
    """A seeded sample of ``n`` stored runs, one per (dataset, model, method) group first, so that the
    sample spans the store rather than its most common kind."""
    groups: dict[tuple, list[str]] = {}
    for key, entry, _ in _entries(store):
        c = entry["config"]
        method = c["method"]["name"] if isinstance(c.get("method"), dict) else str(c.get("method"))
        groups.setdefault((c["dataset"], c.get("model"), method), []).append(key)
    rng = random.Random(seed)
    picks = [rng.choice(sorted(keys)) for _, keys in sorted(groups.items())]
    rng.shuffle(picks)
    return picks[:n]


def check_sample(keys: list[str], rounds: int, store: ResultCache | None = None, log=print) -> list[Comparison]:
    """Re-compute the first ``rounds`` rounds of each stored run in ``keys`` and compare."""
    store = store or Store().cache()
    out = []
    for key in keys:
        entry, problem = store.read(key)
        if entry is None:
            log(f"{key}: not readable ({problem or 'absent'})")
            continue
        t0 = time.perf_counter()
        comparison = compare(key, run_of(entry)["history"], fresh_history(entry["config"], rounds))
        log(f"{comparison.line()} [{time.perf_counter() - t0:.0f} s]")
        out.append(comparison)
    return out


def recompute_in_full(key: str, store: ResultCache | None = None, replace: bool = False, log=print,
                      scratch: ResultCache | None = None) -> Comparison:
    """Re-compute a stored run whole; with ``replace``, store today's run in its place when they differ
    beyond the tolerance (``meta.recomputed`` records the earlier final accuracy and the first departure).
    ``scratch``: a cache (never the store) of today's runs, so a re-computation done earlier is reused."""
    store = store or Store().cache()
    entry, problem = store.read(key)
    if entry is None:
        raise FileNotFoundError(f"{key}: not readable ({problem or 'absent'})")
    old = run_of(entry)
    fresh = fedlib.run(make_config(entry["config"]), cache=scratch if scratch is not None else False, progress=False)
    comparison = compare(key, old["history"], fresh.history)
    comparison.final_stored = old.get("final", {}).get("accuracy")
    comparison.final_fresh = fresh.final.get("accuracy")
    log(f"{comparison.line()}; final accuracy stored {comparison.final_stored} now {comparison.final_fresh}")
    if replace and not comparison.agrees:
        fresh_key = fresh.meta.get("config_key")
        if fresh_key != key:
            raise RuntimeError(f"{key}: today's engine keys this config as {fresh_key}; not replaced")
        fresh.meta["recomputed"] = {
            "date": fresh.meta.get("date"), "replaces_final_accuracy": comparison.final_stored,
            "first_departure": comparison.departures[0], "earlier_note": old.get("meta", {}).get("rekeyed"),
        }
        Store(Path(store.root).parent).put(key, fresh.config, fresh.to_dict())
        log(f"{key}: replaced by today's run")
    return comparison


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedlib.app.recompute", description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=0, help="re-compute the first rounds of N sampled stored runs")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per sampled run (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rekeyed", action="store_true", help="re-compute in full the runs re-keyed on an assertion")
    ap.add_argument("--store", action="store_true", help="with --rekeyed: replace each run that differs")
    ap.add_argument("--keys", nargs="*", default=None, help="these stored keys instead of a sample")
    ap.add_argument("--scratch", default=None, help="with --rekeyed: a cache folder of today's runs to reuse")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.sample < 0:
        ap.error("--rounds must be >= 1 and --sample >= 0")
    store = Store().cache()
    failed = 0
    if args.sample or args.keys:
        keys = args.keys if args.keys else sample_keys(store, args.sample, args.seed)
        failed += sum(not c.agrees for c in check_sample(keys, args.rounds, store))
    if args.rekeyed:
        scratch = ResultCache(Path(args.scratch)) if args.scratch else None
        for key in asserted_rekeys(store):
            failed += not recompute_in_full(key, store, replace=args.store, scratch=scratch).agrees
    if not (args.sample or args.keys or args.rekeyed):
        ap.error("nothing to do: give --sample N, --keys K ... or --rekeyed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
