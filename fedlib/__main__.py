"""Command line: ``python -m fedlib run <config.yaml> [key=value ...]``."""

from __future__ import annotations

import argparse
import inspect
import json
import sys


def _overrides(pairs: list[str]) -> dict:
    """``key=value`` (or ``split.alpha=0.5``) tokens as a nested dict; values are YAML scalars or
    flow collections (safe, no aliases). A malformed token raises a one-line ConfigError."""
    from .config import ConfigError, parse_yaml, shown

    out: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        path = key.strip().split(".")
        if not sep or not all(part.strip() for part in path):
            raise ConfigError(f"override {shown(pair)}: must look like key=value (e.g. rounds=5, split.alpha=0.5)")
        parsed = parse_yaml(value, f"override {key.strip()}")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part.strip(), {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {shown(pair)}: {part!r} is set twice")
        node[path[-1].strip()] = parsed
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedlib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one config file and print a summary table")
    p_run.add_argument("config", help="YAML config file")
    p_run.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rounds=5")
    p_run.add_argument("--no-cache", action="store_true", help="recompute even if a cached result exists")
    p_run.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    p_book = sub.add_parser("book", help="execute the chapters with papermill and build the HTML")
    p_book.add_argument("--profile", default="quick", choices=("smoke", "quick", "paper"))
    p_book.add_argument("--only", nargs="+", metavar="CHAPTER", help="re-execute only these chapters")
    p_book.add_argument("--force", action="store_true", help="re-execute even if nothing changed")
    p_book.add_argument("--no-html", action="store_true", help="execute only; skip the Jupyter Book build")
    p_res = sub.add_parser("results", help="run a chapter's profile and store each run under results/<chapter>/")
    p_res.add_argument("--chapter", required=True)
    p_res.add_argument("--profile", default="paper", choices=("smoke", "quick", "paper"))
    p_mig = sub.add_parser("migrate-results", help="re-key stored runs under results/ to the current keys "
                           "(where provably the same run); report the stale ones")
    p_mig.add_argument("--dry-run", action="store_true", help="report only; change nothing")
    p_mig.add_argument("--root", help="the results folder (default: results/ of the repository)")
    args, extra = parser.parse_known_args(argv)
    if args.command == "migrate-results":
        from .migrate import format_report, migrate_results

        print(format_report(migrate_results(args.root, dry_run=args.dry_run)))
        return 0
    if extra and (args.command != "run" or any(token.startswith("-") for token in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "run":  # key=value overrides may come before or after the flags
        args.overrides = [*args.overrides, *extra]
    if args.command == "book":
        return _book(args)
    if args.command == "results":
        return _results(args)

    from .config import ConfigError, load_config
    from .data import DataCorruptError, DataNotFoundError
    from .run import run

    try:
        config = load_config(args.config, **_overrides(args.overrides))  # nested keys merge into the file's
        result = run(config, cache=not args.no_cache)
    except (ConfigError, DataNotFoundError, DataCorruptError) as err:
        print(f"fedlib: {err}", file=sys.stderr)
        return 2
    print(result.summary())
    if args.json:
        from .cache import atomic_write_text
        from pathlib import Path

        atomic_write_text(Path(args.json), json.dumps(result.to_dict(), indent=1))
    return 0


def _book(args) -> int:
    import time

    from .book import BookError, build

    t0 = time.perf_counter()
    print(f"Building the book with profile {args.profile!r}")
    try:
        index = build(args.profile, only=args.only, html=not args.no_html, force=args.force)
    except (BookError, ValueError, FileNotFoundError) as err:
        print(f"fedlib book: {err}", file=sys.stderr)
        return 1
    print(f"Done in {time.perf_counter() - t0:.0f} s: {index}")
    return 0


def _results(args) -> int:
    from .book import load_profile, store_results
    from .chapters import chapter_module

    try:
        module = chapter_module(args.chapter)
        configs = module.configs(load_profile(args.chapter, args.profile))
    except (ValueError, FileNotFoundError) as err:
        print(f"fedlib results: {err}", file=sys.stderr)
        return 2
    own = getattr(module, "store_results", None)  # chapters with their own protocol (logit FL, FedSCM)
    if own is None:
        written = store_results(args.chapter, configs)
    elif "profile" in inspect.signature(own).parameters:
        written = own(args.profile)
    else:
        written = own(configs)
    print(f"{len(written)} new result file(s) under results/{args.chapter}/ ({len(configs)} runs in the profile)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
