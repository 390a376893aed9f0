"""Chapter logic shared by a book notebook, its tests and ``make results``.

Each chapter module exposes ``configs(params) -> list[RunConfig]`` for a profile's
parameters (``params/<chapter>/<profile>.yaml``), plus the tables and figures its page shows.
"""

import importlib

CHAPTER_MODULES = ("fedavg", "celm", "flce", "fedscm", "logitfl", "fedms", "leaderboard")


# chapters whose runs go through ``fedlib.run`` and take the profile's ``update_clip``
ENGINE_CHAPTERS = ("fedavg", "celm", "flce", "fedms", "leaderboard")
ENGINE_DEFAULT_CLIP = 10.0  # RunConfig.update_clip's default


def run_options(params: dict) -> dict:
    """Engine options a profile may set for every run of a chapter (``update_clip``; absent:
    the engine default, so the run keys of profiles without it do not change)."""
    return {"update_clip": params["update_clip"]} if "update_clip" in params else {}


def defenses(chapter: str, params: dict) -> str | None:
    """One line naming the server-side defenses the chapter's runs have on (None: not an engine chapter)."""
    if chapter not in ENGINE_CHAPTERS:
        return None
    clip = params.get("update_clip", ENGINE_DEFAULT_CLIP)
    if clip is None:
        return "**Defenses on:** non-finite (NaN/Inf) updates are dropped; update clipping is off."
    return (f"**Defenses on:** non-finite (NaN/Inf) updates are dropped; updates farther from the global model "
            f"than {clip:g}× the round's median distance are clipped (not part of the papers' protocols).")


def chapter_module(name: str):
    if name not in CHAPTER_MODULES:
        raise ValueError(f"chapter: unknown chapter {name!r}; chapters with stored runs: {', '.join(CHAPTER_MODULES)}")
    return importlib.import_module(f"{__name__}.{name}")


def unique_configs(experiment_configs, params: dict) -> list:
    """Every run of the profile's experiments, each config once (experiments share runs)."""
    seen, out = set(), []
    for experiment in params["experiments"]:
        for config in experiment_configs(params, experiment):
            if config.key() not in seen:
                seen.add(config.key())
                out.append(config)
    return out
