"""Command line: ``python -m fedlib run <config.yaml> [key=value ...]``."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import warnings
from pathlib import Path

from .app import cluster, queue
from .app.book import BookError, build
from .app.chapters import registry
from .app.explore import serve
from .app.kit.sources import EVIDENCE, PROFILES, load_profile
from .app.migrate import (
    adopt_unclipped,
    compress_results,
    format_report,
    migrate_results,
)
from .cache import CacheWriteWarning, atomic_write_text, write_failure
from .config import ConfigError, load_config, parse_yaml, shown
from .data import DATASETS
from .data_files import DataCorruptError, DataNotFoundError
from .data_sources import IMAGEFOLDER_PREFIX
from .errors import clipped
from .limits import check_port, check_workers
from .run import run

INPUT_ERRORS = (ConfigError, DataNotFoundError, DataCorruptError)  # shown as one line, not a traceback


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (``fedlib explore: argument --port: must be ...``), not a usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {clipped(message, 240)} (see {self.prog} --help)\n")


def _flag(check, flag: str):
    """An argparse ``type`` from a shared validator (``fedlib.limits``): its one line as the flag's error."""

    def parse(text: str):
        try:
            return check(text, flag)
        except ConfigError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix(f"{flag}: ")) from None

    parse.__name__ = flag
    return parse


def _overrides(pairs: list[str]) -> dict:
    """``key=value`` (or ``split.alpha=0.5``) tokens as a nested dict; values are YAML scalars or
    flow collections (safe, no aliases). A malformed token raises a one-line ConfigError."""
    out: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        path = key.strip().split(".")
        if not sep or not all(part.strip() for part in path):
            raise ConfigError(f"override {shown(pair)}: must look like key=value (e.g. rounds=5, split.alpha=0.5)")
        parsed = parse_yaml(value, f"override {clipped(key.strip())}")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part.strip(), {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {shown(pair)}: {shown(part)} is set twice")
        node[path[-1].strip()] = parsed
    return out


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="fedlib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one config file and print a summary table")
    p_run.add_argument("config", help="YAML config file")
    p_run.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rounds=5")
    p_run.add_argument("--no-cache", action="store_true", help="recompute even if a cached result exists")
    p_run.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    about_book = ("execute the chapters with papermill and build the HTML (profile evidence by default, as "
                  "`make book`: every page from the stored paper-protocol runs, nothing trains)")
    p_book = sub.add_parser("book", help=about_book, description=about_book)
    p_book.add_argument("--profile", default=EVIDENCE, choices=PROFILES,
                        help="evidence: the stored paper-protocol runs only; quick: re-execute every chapter at a "
                             "reduced protocol; paper: the papers' protocols; smoke: seconds, for the tests "
                             "(default: %(default)s, the Makefile's PROFILE)")
    p_book.add_argument("--only", nargs="+", metavar="CHAPTER", help="re-execute only these chapters")
    p_book.add_argument("--force", action="store_true", help="re-execute even if nothing changed")
    p_book.add_argument("--no-html", action="store_true", help="execute only; skip the Jupyter Book build")
    p_book.add_argument("--jobs", type=_flag(check_workers, "--jobs"), default=min(2, os.cpu_count() or 1),
                        help="chapters executing at a time (default: 2, or 1 on a 1-core machine; at most the "
                             "cores are used)")
    p_res = sub.add_parser("results", help="the results queue: run and store every paper-profile run, most valuable "
                           "first (see fedlib/app/queue/)")
    p_res.add_argument("--list", action="store_true", help="print the queue (stored, pending, estimated cost) and exit")
    p_res.add_argument("--summary", action="store_true", help="with --list: only the per-table summary")
    p_res.add_argument("--budget", type=float, metavar="SECONDS",
                       help="start no run that would not finish in time (with --list: show what it would start)")
    p_res.add_argument("--workers", type=int, default=1, metavar="K", help="concurrent runs (one process each)")
    p_res.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (the runs' device)")
    p_res.add_argument("--only", nargs="+", metavar="CHAPTER", help="only these chapters")
    p_res.add_argument("--chapter", help="one chapter (same as --only CHAPTER)")
    p_res.add_argument("--profile", default="paper", choices=PROFILES)
    part = p_res.add_mutually_exclusive_group()
    part.add_argument("--cpu-only", action="store_true", help="only Fashion-MNIST/MNIST runs")
    part.add_argument("--gpu-only", action="store_true", help="only the other datasets' runs (CIFAR-10, ...)")
    p_res.add_argument("--dataset", nargs="+", metavar="NAME", help="only runs on these datasets")
    p_res.add_argument("--table", nargs="+", metavar="TABLE", help="only these tables (e.g. 'Table 1')")
    p_res.add_argument("--seed", nargs="+", type=int, metavar="S", help="only these seeds")
    p_res.add_argument("--first", nargs="+", metavar="CHAPTER[:TABLE]",
                       help="run these first, in this order (seed 0 of every run still comes before seeds 1-2)")
    p_res.add_argument("--limit", type=int, metavar="N", help="start at most N runs")
    p_res.add_argument("--run-one", metavar="KEY", help=argparse.SUPPRESS)  # one queue worker: run and store KEY
    p_res.add_argument("--run-pack", nargs="+", metavar="CHAPTER:KEY", help=argparse.SUPPRESS)  # one pack worker
    p_res.add_argument("--pack", choices=("auto", "on", "off"), default="auto",
                       help="train runs that share data, model and rounds as one population (fedlib/packing.py); "
                            "auto: on for a CUDA device, off on a CPU")
    p_res.add_argument("--max-rows", type=int, metavar="N",
                       help="with packs: at most N client rows per round in one pack (default: 32 on CUDA, 64 on "
                            "a CPU; each pack process still bounds it by the device's free memory)")
    p_res.add_argument("--scheduler", metavar="ADDRESS", default=os.environ.get("DASK_SCHEDULER_ADDRESS"),
                       help="run the units on the Dask cluster of this scheduler (e.g. tcp://host:8786; default: "
                            "$DASK_SCHEDULER_ADDRESS) instead of local processes; --workers is then the cluster's "
                            "threads, --device only what estimates assume (see book/cluster.md)")
    p_res.add_argument("--retries", type=int, default=1, metavar="N",
                       help="with --scheduler: more tries of a unit whose task raised (a lost worker's unit is "
                            "rescheduled by Dask anyway)")
    p_res.add_argument("--scheduler-wait", type=float, default=60.0, metavar="SECONDS",
                       help="with --scheduler: how long to wait for the scheduler and a first worker")
    p_exp = sub.add_parser("explore", help="serve the live explorer (book/explore.ipynb) with Voila on localhost")
    p_exp.add_argument("--port", type=_flag(check_port, "--port"), default=8866,
                       help="port on localhost, 1-65535 (Voila moves to the next free one when it is taken)")
    p_exp.add_argument("--open", action="store_true", help="also open it in the default browser")
    p_mig = sub.add_parser("migrate-results", help="rewrite stored runs under results/ in the compact form (<key>.json.zd), re-key "
                           "them to the current keys (where provably the same run); report the stale ones")
    p_mig.add_argument("--dry-run", action="store_true", help="report only; change nothing")
    p_mig.add_argument("--root", help="the results folder (default: results/ of the repository)")
    args, extra = parser.parse_known_args(argv)
    if args.command == "explore":
        return serve(port=args.port, open_browser=args.open)
    if args.command == "migrate-results":
        return _migrate(args)
    if extra and (args.command != "run" or any(token.startswith("-") for token in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "run":  # key=value overrides may come before or after the flags
        args.overrides = [*args.overrides, *extra]
    if args.command == "book":
        return _book(args)
    if args.command == "results":
        return _results(args)
    try:
        config = load_config(args.config, **_overrides(args.overrides))  # nested keys merge into the file's
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CacheWriteWarning)
            result = run(config, cache=not args.no_cache)
    except INPUT_ERRORS as err:
        print(f"fedlib: {err}", file=sys.stderr)
        return 2
    status = 0
    if args.json:  # first: the numbers are kept before anything else can fail
        try:
            atomic_write_text(Path(args.json), json.dumps(result.to_dict(), indent=1))
        except OSError as err:
            print(f"fedlib: could not write --json ({write_failure(err, Path(args.json))})", file=sys.stderr)
            status = 1
    for w in caught:  # a cache that cannot be written: one line; other warnings as usual
        if issubclass(w.category, CacheWriteWarning):
            print(f"fedlib: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    print(result.summary())
    return status


def _migrate(args) -> int:
    try:
        compressed = compress_results(args.root, dry_run=args.dry_run)
        print(f"rewrote {len(compressed)} stored run(s) as compact records (<key>.json.zd, fedlib.record)"
              + (" (dry run)" if args.dry_run else ""))
        print(format_report(migrate_results(args.root, dry_run=args.dry_run)))
        for chapter, paper in registry().items():  # paper profiles run unclipped: adopt clipped runs that never clipped
            configs = paper.configs(load_profile(chapter, "paper"))
            for source, key, _ in adopt_unclipped(chapter, configs, args.root, dry_run=args.dry_run):
                print(f"  adopted {source} as runs/{key} for {chapter} (clipping on, never acted)")
    except (FileNotFoundError, NotADirectoryError) as err:
        print(f"fedlib migrate-results: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a read-only store, a full disk
        print(f"fedlib migrate-results: cannot change the store ({write_failure(err, Path(args.root or 'results'))})",
              file=sys.stderr)
        return 1
    return 0


def _check_queue_flags(args) -> None:
    """One-line ValueErrors for queue flags that make no sense (before anything is planned)."""
    if args.budget is not None and not (math.isfinite(args.budget) and args.budget > 0):
        raise ValueError(f"--budget: must be a positive number of seconds (got {args.budget})")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit: must be >= 1 (got {args.limit})")
    check_workers(args.workers, "--workers")  # 1 to MAX_WORKERS
    if args.max_rows is not None and args.max_rows < 1:
        raise ValueError(f"--max-rows: must be >= 1 (got {args.max_rows})")
    if not re.fullmatch(r"cpu|cuda(:\d{1,3})?", args.device):
        raise ValueError(f"--device: must be cpu, cuda or cuda:N (got {args.device[:60]!r})")
    if args.retries < 0:
        raise ValueError(f"--retries: must be >= 0 (got {args.retries})")
    if not (math.isfinite(args.scheduler_wait) and args.scheduler_wait > 0):
        raise ValueError(f"--scheduler-wait: must be a positive number of seconds (got {args.scheduler_wait})")
    if not args.list and not args.scheduler:  # runs start here: the device must be here (--list only estimates for
        queue.check_device(args.device)       # it, e.g. a GPU call's plan; a cluster's workers resolve their own)
    for seed in args.seed or []:
        if seed < 0:
            raise ValueError(f"--seed: seeds are >= 0 (got {seed})")
    for name in args.dataset or []:
        if name not in DATASETS and not name.startswith(IMAGEFOLDER_PREFIX):
            raise ValueError(f"--dataset: unknown dataset {name[:60]!r}; known: {', '.join(DATASETS)}")
    for spec in args.first or []:
        chapter = spec.split(":", 1)[0]
        if chapter not in registry():
            raise ValueError(f"--first: unknown chapter {chapter[:60]!r} in {spec[:80]!r}; known: "
                             f"{', '.join(registry())}")


def _book(args) -> int:
    print(f"Building the book with profile {args.profile!r} (runs shown on stderr; results cached)", flush=True)
    try:
        index = build(args.profile, only=args.only, html=not args.no_html, force=args.force,
                      log=lambda line: print(line, flush=True), jobs=args.jobs)
    except (BookError, ValueError, FileNotFoundError) as err:
        print(f"fedlib book: {err}", file=sys.stderr, flush=True)
        if getattr(err, "index", None):  # the pages that did build
            print(err.index)
        return 1
    print(index)
    return 0


def _results(args) -> int:
    only = args.only or ([args.chapter] if args.chapter else None)
    try:
        if args.run_one:
            if not args.chapter:
                raise ValueError("--run-one: needs --chapter")
            try:
                path = queue.run_one(args.chapter, args.run_one, args.profile, args.device)
            except OSError as err:  # the run finished (and is in the cache when that is writable)
                print(f"fedlib results: could not store the run ({write_failure(err, queue.results_root())})",
                      file=sys.stderr)
                return 1
            print(f"stored {path}")
            return 0
        if args.run_pack:
            queue.run_packed(args.run_pack, args.profile, args.device, log=lambda line: print(line, flush=True))
            return 0
        _check_queue_flags(args)
        part = "cpu" if args.cpu_only else "gpu" if args.gpu_only else "all"
        first = [tuple(spec.split(":", 1)) if ":" in spec else (spec, None) for spec in args.first or []]
        cost_model = queue.CostModel.from_results()
        entries = queue.plan(args.profile, only=only, device=args.device, part=part, datasets=args.dataset,
                             tables=args.table, seeds=args.seed, first=first, cost_model=cost_model)
    except (ValueError, FileNotFoundError, *INPUT_ERRORS) as err:
        print(f"fedlib results: {err}", file=sys.stderr)
        return 2
    for line in queue.left_out_lines():  # files of the store no reader uses: one line each, left as they are
        print(f"fedlib results: {line}", file=sys.stderr)
    if args.list:
        try:
            queue.check_device(args.device)
        except ValueError as err:  # a GPU call's plan, made on another machine
            print(f"fedlib results: note: {err}; the list only estimates for it", file=sys.stderr)
        print(queue.format_list(entries, args.workers, items=not args.summary))
        if args.budget is None:
            return 0
    pending = [e for e in entries if not e.stored and not e.missing][:args.limit]
    if args.limit is not None:
        entries = [e for e in entries if e.stored or e in pending]
    packed = args.pack == "on" or (args.pack == "auto" and "cuda" in args.device)
    if packed:
        # CUDA: on an H100, packs of 5 five-client runs trained the most samples per second (packed_nvidia-h100.json)
        max_rows = args.max_rows or (32 if "cuda" in args.device else 64)
        entries = queue.plan_packs(entries, args.device, max_rows=max_rows, first=first, cost_model=cost_model)
        packs = [u for u in entries if isinstance(u, queue.Pack)]
        print(f"packs: {len(packs)} pack(s) of {sum(len(p.entries) for p in packs)} runs "
              f"(at most {max_rows} client rows per round), {len(entries) - len(packs)} single run(s)", flush=True)
    if args.list:  # with --budget: what a call with this budget would start, by the estimates
        print(queue.format_preview(queue.preview(entries, args.budget, args.workers), args.budget, args.workers))
        return 0
    counts = (f"{len(pending)} pending, {sum(e.stored for e in entries)} stored, "
              f"{sum(bool(e.missing) for e in entries)} not runnable here"
              + (f"; budget {args.budget:.0f} s" if args.budget else ""))
    log = lambda line: print(line, flush=True)  # noqa: E731
    if args.scheduler:
        try:
            client = cluster.connect(args.scheduler, args.scheduler_wait)
        except ValueError as err:
            print(f"fedlib results: {err}", file=sys.stderr)
            return 2
        with client:
            print(f"results queue ({args.profile} profile, the cluster at {args.scheduler}: "
                  f"{cluster.describe_cluster(client)}): {counts}", flush=True)
            outcome = cluster.run_queue(entries, client, args.profile, retries=args.retries, budget=args.budget,
                                        device=args.device, log=log, cost_model=cost_model)
    else:
        print(f"results queue ({args.profile} profile, {args.device}, {args.workers} worker(s)): {counts}", flush=True)
        outcome = queue.run_queue(entries, args.profile, budget=args.budget, workers=args.workers, device=args.device,
                                  log=log, cost_model=cost_model)
    print(f"{len(outcome.stored)} run(s) stored in {outcome.elapsed:.0f} s; {len(outcome.failed)} failed; "
          f"{len(outcome.killed)} stopped at the budget" + (f"; {len(outcome.absent)} not runnable where sent"
                                                            if outcome.absent else ""))
    return 1 if outcome.failed else 0


if __name__ == "__main__":
    sys.exit(main())
