"""Readings of a protocol a paper leaves open, screened on the paper's FedAvg only (issue 30): the CIFAR-10
recipe of CELM's and FedMS's CNN runs. A chapter lists (split, reading, config) rows; the rule picks the
reading whose FedAvg lands nearest the paper's, and the page shows every candidate."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...config import RunConfig, make_config
from ..kit.tables import Table

# What neither paper states for CIFAR-10 (both name the CNN, rounds, local epochs, batch size and lr):
# augmentation, weight decay, SGD's momentum, the CNN's layer widths. Every reading keeps the per-channel
# normalisation by the training set's statistics (fedlib.data). The first is each chapter's protocol so far.
CIFAR10_READINGS: dict[str, dict[str, Any]] = {
    "no augmentation, no weight decay": {},
    "crop + flip": {"augment": "crop_flip"},  # random crop (zero padding 4) and horizontal flip
    "weight decay 5e-4": {"weight_decay": 5e-4},
    "crop + flip, weight decay 5e-4": {"augment": "crop_flip", "weight_decay": 5e-4},
    "SGD momentum 0.9": {"momentum": 0.9},  # the local optimiser most CIFAR-10 FL code uses
    # the "5-layer CNN" at McMahan et al. (2017)'s widths: 32 and 64 channels, FC 512 (then 128); ours so
    # far is 16 and 32 channels, FC 120 and 84 (fedlib.models.CNN, CNNWide)
    "wider CNN (32, 64 channels; FC 512, 128)": {"model": "cnn_wide"},
}


ORIGINAL = next(iter(CIFAR10_READINGS))  # the recipe the chapters ran before the screen


def in_force(params: dict[str, Any]) -> str:
    """The profile's ``cifar10_reading``, the recipe its CIFAR-10 runs use (absent: ``ORIGINAL``)."""
    name = params.get("cifar10_reading", ORIGINAL)
    if name not in CIFAR10_READINGS:
        raise ValueError(f"cifar10_reading: must be one of {', '.join(map(repr, CIFAR10_READINGS))} (got {name!r})")
    return name


def recipe(params: dict[str, Any]) -> dict[str, Any]:
    """The config fields of the profile's CIFAR-10 recipe (``in_force``): {} for the original one."""
    return dict(CIFAR10_READINGS[in_force(params)])


def screen_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` under the original recipe in float32: the base every reading of the screen changes, whichever
    recipe and precision the profile adopted (so the screen's runs keep their keys once one is adopted)."""
    return {**params, "cifar10_reading": ORIGINAL, "cifar10_precision": "float32"}


def earlier_recipe(params: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(the params of the original recipe, or None while the profile still uses it; the glue values the
    chapters' "earlier recipe (stale)" tables quote)."""
    values = {"t1c_recipe": in_force(params), "t1c_earlier_recipe": ORIGINAL, "t1c_earlier_n": 0}
    return (None if in_force(params) == ORIGINAL else screen_params(params)), values


def earlier_table(frame, values: dict[str, Any]) -> Table:
    """A chapter's CIFAR-10 rows from the stored runs of the original recipe (stale, ``earlier_recipe``'s
    ``values``): a line naming the recipe and its stored runs above the frame; nothing to show while it is None."""
    # lazy: IPython (book extra); the queue imports the chapters without it
    from IPython.display import Markdown

    heading = None if frame is None else Markdown(
        f"Under the earlier recipe ({values['t1c_earlier_recipe']}), stale: {values['t1c_earlier_n']} stored run(s), "
        "kept for comparison, not part of the table above.")
    return Table(frame, values, note=heading, order=("note", "frame"))


def reading_configs(base_of: Callable[[str], RunConfig], splits, readings=CIFAR10_READINGS):
    """(split, reading, config) for every split and reading: ``base_of(split)`` (the chapter's FedAvg run)
    changed by the reading's fields (the first reading leaves it as it is)."""
    out = []
    for split in splits:
        base = base_of(split)
        out += [(split, reading, make_config(base.to_dict(), **fields) if fields else base)
                for reading, fields in readings.items()]
    return out


def calibrate(rows, results: dict[str, Any], paper_of: Callable[[str], float]):
    """Every reading of ``rows`` (``reading_configs``) against the paper's FedAvg (``paper_of(split)``).

    Rule: FedAvg only; the reading with the smallest mean |ours − paper| (final accuracy) over the splits
    it has runs for, among the readings with the most splits measured; a tie goes to the earlier reading.
    Returns (frame: ours, paper per split, the mean gap; the chosen reading or None)."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    lines: dict[str, dict[str, Any]] = {}
    gaps: dict[str, list[float]] = {}
    for split, reading, config in rows:
        line = lines.setdefault(reading, {"reading": reading})
        paper, run = paper_of(split), results.get(config.key())
        ours = 100.0 * run.final["accuracy"] if run is not None else float("nan")
        line[f"{split} ours"], line[f"{split} paper"] = ours, paper
        if np.isfinite(ours) and np.isfinite(paper):
            gaps.setdefault(reading, []).append(ours - paper)
    for reading, line in lines.items():
        line["splits with a run"] = len(gaps.get(reading, []))
        line["mean |ours − paper|"] = float(np.mean(np.abs(gaps[reading]))) if gaps.get(reading) else float("nan")
    frame = pd.DataFrame(list(lines.values())).set_index("reading")
    measured = frame[frame["splits with a run"] == frame["splits with a run"].max()]["mean |ours − paper|"].dropna()
    chosen = None if measured.empty else measured.index[int(np.argmin(measured.to_numpy()))]
    return frame, chosen


def complete(frame) -> bool:
    """Whether every reading has a run on every split (the rule's choice can no longer change)."""
    return bool((frame["splits with a run"] == sum(c.endswith(" paper") for c in frame.columns)).all())


def adoption(frame, chosen, params: dict[str, Any], profile_file: str) -> str:
    """One sentence: whether the profile's recipe (``in_force``) is the rule's choice, and why not."""
    used = in_force(params)
    if chosen is None:
        return f"no reading has a stored run yet, so the paper profile keeps the recipe {used!r}"
    if used == chosen:
        return (f"the paper profile uses it ({profile_file}: cifar10_reading); CIFAR-10 runs stored under "
                "the earlier recipe are stale and shown apart, under their recipe")
    if not complete(frame):
        return (f"not every candidate has a run on every split yet, so the choice may still change and the paper "
                f"profile keeps the recipe {used!r}")
    return f"the paper profile still uses {used!r} ({profile_file}: cifar10_reading)"


def page(frame, chosen, stored: int, candidates: int, prefix: str = "cr", params: dict[str, Any] | None = None,
         profile_file: str = ""):
    """(the frame as the page shows it, the glue values): a cell without a stored run says so, each split's
    column names the paper's value; None while no reading has a run."""
    values = {f"{prefix}_runs": stored, f"{prefix}_candidates": candidates,
              f"{prefix}_chosen": "none (no reading has a stored run)", f"{prefix}_chosen_gap": float("nan"),
              f"{prefix}_baseline_gap": float(frame["mean |ours − paper|"].iloc[0])}
    if params is not None:  # the CIFAR-10 recipe's screen: whether the profile uses the rule's choice
        values[f"{prefix}_protocol"] = adoption(frame, chosen, params, profile_file)
    if chosen is None:
        return None, values
    values.update({f"{prefix}_chosen": chosen, f"{prefix}_chosen_gap": float(frame.loc[chosen, "mean |ours − paper|"])})
    return shown(frame, chosen, [c for c in frame.columns if c.endswith(" ours")] + ["mean |ours − paper|"]), values


def shown(frame, chosen, measured: list[str]):
    """A candidates frame as a page shows it: the ``measured`` columns as text (a cell without a stored run
    says so), each ``<split> paper`` column folded into its ``<split> ours`` header, a ``chosen`` flag."""
    out = frame.copy()
    for column in measured:
        out[column] = [f"{v:.2f}" if np.isfinite(v) else "no stored run yet" for v in out[column]]
    papers = [c for c in out.columns if c.endswith(" paper")]
    names = {c[:-len(" paper")] + " ours": f"{c[:-len(' paper')]} ours (paper {out[c].iloc[0]:.2f})" for c in papers}
    out = out.drop(columns=papers).rename(columns=names)
    out["chosen"] = [i == chosen for i in out.index]
    return out
