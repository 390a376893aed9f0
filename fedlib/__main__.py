"""Command line: ``python -m fedlib run <config.yaml> [key=value ...]``."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys

import yaml


def _overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"fedlib: override {pair!r} must look like key=value")
        key, value = pair.split("=", 1)
        out[key] = yaml.safe_load(value)
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
    p_book.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="chapters executing at a time (default: 2, or 1 on a 1-core machine)")
    p_res = sub.add_parser("results", help="run a chapter's profile and store each run under results/<chapter>/")
    p_res.add_argument("--chapter", required=True)
    p_res.add_argument("--profile", default="paper", choices=("smoke", "quick", "paper"))
    p_exp = sub.add_parser("explore", help="serve the live explorer (book/explore.ipynb) with Voila on localhost")
    p_exp.add_argument("--port", type=int, default=8866, help="port on localhost (0: any free port)")
    p_exp.add_argument("--open", action="store_true", help="also open it in the default browser")
    args = parser.parse_args(argv)
    if args.command == "explore":
        from .explore import serve

        return serve(port=args.port, open_browser=args.open)
    if args.command == "book":
        return _book(args)
    if args.command == "results":
        return _results(args)

    from .config import ConfigError, load_config
    from .data import DataCorruptError, DataNotFoundError
    from .run import run

    try:
        config = load_config(args.config, **_overrides(args.overrides))
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
    from .book import BookError, build

    print(f"Building the book with profile {args.profile!r} (runs shown on stderr; results cached)", flush=True)
    try:
        index = build(args.profile, only=args.only, html=not args.no_html, force=args.force,
                      log=lambda line: print(line, flush=True), jobs=args.jobs)
    except BookError as err:
        print(f"fedlib book: {err}", file=sys.stderr, flush=True)
        if getattr(err, "index", None):
            print(err.index)
        return 1
    except (ValueError, FileNotFoundError) as err:
        print(f"fedlib book: {err}", file=sys.stderr)
        return 1
    print(index)
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
