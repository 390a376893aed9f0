"""Chapter logic shared by a book notebook, its tests and ``make results``.

Each chapter module exposes ``configs(params) -> list[RunConfig]`` for a profile's
parameters (``params/<chapter>/<profile>.yaml``), plus the tables and figures its page shows.
"""

import importlib

CHAPTER_MODULES = ("fedavg", "celm", "flce", "fedscm", "logitfl", "fedms", "leaderboard")


def chapter_module(name: str):
    if name not in CHAPTER_MODULES:
        raise ValueError(f"chapter: unknown chapter {name!r}; chapters with stored runs: {', '.join(CHAPTER_MODULES)}")
    return importlib.import_module(f"{__name__}.{name}")


def unique_configs(experiment_configs, params: dict, experiments=None) -> list:
    """Every run of ``experiments`` (default: the profile's), each config once (experiments share runs)."""
    seen, out = set(), []
    for experiment in experiments or params["experiments"]:
        for config in experiment_configs(params, experiment):
            if config.key() not in seen:
                seen.add(config.key())
                out.append(config)
    return out
