"""The precision screen (issue 45), shared by the chapters with CIFAR-10 CNN runs (CELM, FedMS): the paper's
FedAvg on one of its CIFAR-10 splits, every seed of the paper profile, in float32 and in bfloat16 local
training, paired by seed. bfloat16 backs a profile's CIFAR-10 cells only if the paired difference's 95 %
t-interval lies within ±``PRECISION_MARGIN`` points; the page shows the pairs, the interval and the choice."""

from __future__ import annotations

from typing import Any, Callable

from ...config import RunConfig
from ...stats import MIN_SEEDS, interval, mean_std
from ..kit.tables import Table

PRECISIONS = ("float32", "bfloat16")  # RunConfig.precision: local training's forward and backward
PRECISION_MARGIN = 1.0  # points: bfloat16 is adopted only if the paired 95 % interval lies within ±this


def in_force(params: dict[str, Any]) -> str:
    """The profile's ``cifar10_precision``, the precision its CIFAR-10 runs train in (absent: float32)."""
    name = params.get("cifar10_precision", "float32")
    if name not in PRECISIONS:
        raise ValueError(f"cifar10_precision: must be one of {', '.join(map(repr, PRECISIONS))} (got {name!r})")
    return name


def screen_configs(make: Callable[[int, str], RunConfig], seeds: list[int]) -> list[tuple[str, RunConfig]]:
    """(precision, config) for every seed and each of ``PRECISIONS``; ``make(seed, precision)`` is the
    chapter's FedAvg CIFAR-10 Table 1 run on the screen's split, so the adopted arm is Table 1's own runs."""
    return [(p, make(seed, p)) for seed in seeds for p in PRECISIONS]


def device_label(meta: dict) -> str:
    """A stored run's device, short: the GPU's name, or "CPU"."""
    device = str(meta.get("device", ""))
    return device.split("(", 1)[-1].rstrip(")") if device.startswith("cuda") else ("CPU" if device else "—")


def screen(rows: list[tuple[str, Any]], results: dict[str, Any], adopted: str, profile_file: str,
           margin: float = PRECISION_MARGIN):
    """Per seed, FedAvg's final accuracy in float32 and in bfloat16 local training and their paired difference
    (bfloat16 − float32, points).

    Rule: bfloat16 is adopted only if at least ``MIN_SEEDS`` seeds are paired and the difference's 95 %
    t-interval lies within ±``margin``. ``adopted``: the precision the profile declares (in ``profile_file``).
    Returns (frame or None while no pair is stored, glue values ``ps_*``)."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    by_seed: dict[int, dict[str, Any]] = {}
    for precision, config in rows:
        run = results.get(config.key())
        if run is not None:
            by_seed.setdefault(config.seed, {})[precision] = run
    lines = []
    for seed, runs in sorted(by_seed.items()):
        if set(PRECISIONS) <= set(runs):
            f32, b16 = (100 * runs[p].final["accuracy"] for p in PRECISIONS)
            lines.append({"seed": seed, "float32": f32, "float32 device": device_label(runs["float32"].meta),
                          "bfloat16": b16, "bfloat16 device": device_label(runs["bfloat16"].meta),
                          "bfloat16 − float32": b16 - f32})
    diffs = [line["bfloat16 − float32"] for line in lines]
    spread = mean_std(diffs)
    lo, hi = interval(diffs)
    if len(diffs) < MIN_SEEDS:
        rule = "float32"
        verdict = (f"indicative ({len(diffs)} paired seed{'s' if len(diffs) != 1 else ''}): float32 stays until "
                   f"{MIN_SEEDS} seeds are paired")
    else:
        rule = "bfloat16" if -margin <= lo and hi <= margin else "float32"
        verdict = (f"the 95 % interval [{lo:+.2f}, {hi:+.2f}] lies within ±{margin:g} point: bfloat16 is adopted"
                   if rule == "bfloat16" else
                   f"the 95 % interval [{lo:+.2f}, {hi:+.2f}] is not within ±{margin:g} point: float32 stays")
    values = {"ps_pairs": len(diffs), "ps_mean": spread.mean, "ps_std": spread.std, "ps_lo": lo, "ps_hi": hi,
              "ps_margin": margin, "ps_rule": rule, "ps_verdict": verdict, "ps_adopted": adopted,
              "ps_protocol": (f"the paper profile's CIFAR-10 runs use {adopted} (`cifar10_precision` in "
                              f"{profile_file}), as the rule says" if adopted == rule else
                              f"the paper profile declares {adopted} (`cifar10_precision` in {profile_file}) but "
                              f"the rule says {rule}: its CIFAR-10 cells are not backed by the screen's choice")}
    if not lines:
        return None, values
    return pd.DataFrame(lines).set_index("seed"), values


def page(chapter: str, rows: list[tuple[str, Any]], results: dict[str, Any], params: dict[str, Any]) -> Table:
    """A chapter's screen section: ``screen`` on its stored runs (``results``) against the paper profile
    ``params`` (params/<chapter>/paper.yaml); a note while no seed is paired."""
    frame, values = screen(rows, results, in_force(params), f"params/{chapter}/paper.yaml")
    return Table.formatted(frame, values, "No seed has both precisions stored yet (python -m fedlib results "
                                          f"--chapter {chapter} --table 'Precision screen').", precision=2)
