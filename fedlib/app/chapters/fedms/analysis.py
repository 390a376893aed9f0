"""The FedMS chapter's analyses: pure functions on run results (no page, no store).

The softmax verdict, why a baseline falls short of FedAvg (``diagnose_shortfall``) and the calibration of
the §5.1 and CIFAR-10 readings on FedAvg. pandas is imported inside the functions that build frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...kit import frames
from .. import readings
from ..base import curve
from .protocol import (
    MAVERICK_RUN_READINGS,
    MAVERICK_SCORE_READINGS,
    METHOD_LABELS,
    SOFTMAX_VARIANTS,
    aggregated_rounds,
    cifar10_reading_configs,
    departure,
    maverick_reading_configs,
    reading_score,
)


def best_method(values: dict[str, tuple]) -> str | None:
    """The best method of ``values`` on the seeds they share (the first of a tie); None: none comparable."""
    best = frames.best_on_shared_seeds(values)
    return next((m for m in values if m in best), None)


def softmax_verdict(rows: list[tuple[str, dict, dict]], source: str) -> list[dict[str, Any]]:
    """Which softmax lands nearer the paper's Table 1: per method with a variant, the mean
    |ours − paper| (points) over the rows where both were run, for Eq. 12 as printed and for
    the ×100 variant, and the nearer one."""
    out = []
    for variant, (method, _) in SOFTMAX_VARIANTS.items():
        gaps = {"printed": [], "x100": []}
        for _, paper, ours in rows:
            values = ours.get(source, {})
            p, a, b = (x.get(m, (np.nan,))[0] for x, m in ((paper, method), (values, method), (values, variant)))
            if p == p and a == a and b == b:
                gaps["printed"].append(abs(a - p))
                gaps["x100"].append(abs(b - p))
        if gaps["printed"]:
            printed, scaled = float(np.mean(gaps["printed"])), float(np.mean(gaps["x100"]))
            out.append({"method": METHOD_LABELS[method], "rows": len(gaps["printed"]),
                        "gap, softmax(Ŝ) (Eq. 12)": printed, "gap, softmax(100 Ŝ)": scaled,
                        "nearer": "Eq. 12 as printed" if printed <= scaled else "×100"})
    return out


# ----------------------------------------------------------------------------- why a baseline falls short


def late_gain(result, share: float = 0.2) -> float:
    """Accuracy points gained over the last ``share`` of the rounds (a run still learning gains)."""
    _, acc = curve(result)
    back = max(1, int(len(acc) * share))
    return float(acc[-1] - acc[-1 - back]) if len(acc) > back else float("nan")


def diagnose_shortfall(result, fedavg) -> dict[str, Any]:
    """Why a run ends far below FedAvg on the same federation, from both runs' histories: how often
    the Mavericks (the only holders of their classes) were aggregated, their classes' final
    accuracy, and whether the run was still learning at the end."""
    counts = np.asarray(result.meta["client_class_counts"])
    mavericks = np.asarray(result.meta["client_roles"]) == "maverick"
    classes = np.flatnonzero((counts[mavericks].sum(0) > 0) & (counts[~mavericks].sum(0) == 0))
    taken, taken_avg = aggregated_rounds(result)[mavericks], aggregated_rounds(fedavg)[mavericks]
    acc = 100 * np.asarray(result.final["per_class_accuracy"])[classes]
    acc_avg = 100 * np.asarray(fedavg.final["per_class_accuracy"])[classes]
    gain, gain_avg = late_gain(result), late_gain(fedavg)
    rounds = len(result.history)
    why = []
    if taken.mean() < 0.5 * taken_avg.mean():
        why.append(f"the Mavericks (sole holders of classes {', '.join(map(str, classes))}) were aggregated in "
                   f"{', '.join(map(str, taken))} of {rounds} rounds (FedAvg: {', '.join(map(str, taken_avg))}), so "
                   f"their classes end at {', '.join(f'{a:.0f}' for a in acc)} % (FedAvg: "
                   f"{', '.join(f'{a:.0f}' for a in acc_avg)} %)")
    elif (acc < acc_avg - 30).any():
        mu = result.config["method"].get("mu")
        why.append(f"the Mavericks took part as often as under FedAvg, yet their classes end at "
                   f"{', '.join(f'{a:.0f}' for a in acc)} % (FedAvg: {', '.join(f'{a:.0f}' for a in acc_avg)} %): "
                   f"their rounds moved the global model less"
                   + (f" (the proximal term, μ = {mu:g}, holds each local model near the global one)" if mu else ""))
    if gain > max(2.0, 1.5 * gain_avg):
        why.append(f"it was still learning: +{gain:.1f} points over the last fifth of the rounds (FedAvg "
                   f"{gain_avg:+.1f}), so it converges more slowly within the {rounds} rounds")
    return {"Mavericks aggregated (rounds)": ", ".join(map(str, taken)),
            "Maverick classes' accuracy (%)": ", ".join(f"{a:.0f}" for a in acc),
            "gain, last fifth (points)": round(gain, 2),
            "why (from the run's history)": "; ".join(why) or "neither Maverick starvation nor slow convergence"}


def calibrate_maverick_readings(params: dict[str, Any], results: dict[str, Any], reference: dict,
                                seed: int | None = None):
    """Every candidate (run reading × score reading) of FedAvg against the paper's FedAvg row of Table 1.

    Rule: calibrate on FedAvg only, and only among the readings the text permits (no ``departs``: a
    reading contradicting Eq. 3 or §5.1 is shown, labelled, and never chosen); choose the candidate with
    the smallest mean |ours − paper| over the splits it has runs for, a tie going to the earlier
    candidate (the paper's reading and the last round come first). ``results``: runs by key (a build's or the stored ones). Returns (frame of
    every candidate: ours and the gap per split, the mean gap, whether Dir(10) is within 3 points;
    the chosen candidate's (run reading, score reading) or None when no candidate has a run)."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    lines = []
    for reading in MAVERICK_RUN_READINGS:
        runs = {split: results.get(config.key()) for split, r, config in maverick_reading_configs(params, seed)
                if r == reading}
        for score, last in MAVERICK_SCORE_READINGS.items():
            line: dict[str, Any] = {"run reading": reading, "score reading": score,
                                    "departs from": departure(reading) or "—"}
            gaps = []
            for split, run in runs.items():
                paper = frames.paper_values(reference, "Table 1", f"MNIST {split}", ["fedavg"],
                                            METHOD_LABELS.get)["fedavg"][0]
                ours = reading_score(run, last) if run is not None else float("nan")
                line[f"{split} ours"], line[f"{split} paper"] = ours, paper
                if np.isfinite(ours):
                    gaps.append(abs(ours - paper))
            line["splits with a run"] = len(gaps)
            line["mean |ours − paper|"] = float(np.mean(gaps)) if gaps else float("nan")
            line["Dir(10) within 3 points"] = bool(abs(line.get("Dir(10) ours", np.nan)
                                                       - line.get("Dir(10) paper", np.nan)) <= 3.0)
            lines.append(line)
    frame = pd.DataFrame(lines).set_index(["run reading", "score reading"])
    measured = frame.loc[frame["departs from"] == "—", "mean |ours − paper|"].dropna()
    chosen = None if measured.empty else measured.index[int(np.argmin(measured.to_numpy()))]
    return frame, chosen


def calibrate_cifar10_readings(params: dict[str, Any], results: dict[str, Any], reference: dict,
                               seed: int | None = None):
    """``readings.calibrate`` on FedMS's CIFAR-10 rows against the paper's FedAvg row of Table 1."""
    def paper_of(split):
        return frames.paper_values(reference, "Table 1", f"CIFAR-10 {split}", ["fedavg"], METHOD_LABELS.get)["fedavg"][0]

    return readings.calibrate(cifar10_reading_configs(params, seed), results, paper_of)
