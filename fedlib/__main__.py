"""Command line: ``python -m fedlib run <config.yaml> [key=value ...]``."""

from __future__ import annotations

import argparse
import json
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
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    sys.exit(main())
