"""The LogitFL chapter's calibration: the protocol choices the paper's summary leaves open, searched on simple
averaging only (``calibrate``, also ``python -m fedlib.app.chapters.logitfl [stage ...] [--shard i/n]``), its
record (``calibration.json`` of the chapter's results) and how the page reads it."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ....cache import atomic_write_text
from ....config import RunConfig
from ....federation import resolve_device
from ....provenance import environment
from ....run import run
from ....store import Store
from ...kit.sources import load_profile
from .protocol import logit_config

# ----------------------------------------------------------------------------- calibration

# The protocol choices the paper's summary leaves open, calibrated on SIMPLE AVERAGING ONLY
# (the baseline the summary asks a replicator to verify first: ~0.82 on MNIST, k = 2).
# The search space is fixed here, before any run:
SEARCH_SPACE: dict[str, list] = {
    "public_logits": ["after_local", "after_refine"],  # upload after private training / after refinement
    "local_epochs": [1, 2],  # epochs of private training per round
    "lr": [0.01, 0.05, 0.1],  # SGD step size (private training and refinement)
    "distill_epochs": [1, 3],  # epochs of refinement on the public set per round
    "temperature": [1.0, 2.0, 4.0],  # distillation temperature T
}
# Screening protocol (stages 1-2): the paper profile with the 4-layer MLP instead of LeNet-5 (which
# does not train in 5 rounds at this size: see the pilot points), 30 % of the MNIST training set, a
# 1,500-sample public set (private : public steps per epoch stay about 1 : 1, as at full size),
# 2,000 test images and 5 rounds; seed 0.
SCREEN = {"model": "mlp", "fraction": 0.3, "public_size": 1500, "test_samples": 2000, "rounds": 5}
SCREEN_SEED = 0
# the first protocol (stored runs before calibration: simple averaging 59.6 % at the paper protocol)
FIRST = {"public_logits": "after_local", "local_epochs": 2, "lr": 0.05, "distill_epochs": 1, "temperature": 2.0}
PAPER_SIMPLE = 81.88  # the paper's simple averaging, MNIST k = 2 (%)
STAGES = ("structure", "tuning", "confirm")
# Beyond the declared space, run after it (not part of STAGES, never used for the choice): the best
# screened point lies on the space's edge (most epochs, largest lr), so the screen is extended one
# step past that edge to see whether simple averaging keeps rising towards the paper's value.
EDGE = {"local_epochs": 5, "lr": 0.2}


def _point(choice: dict[str, Any]) -> dict[str, Any]:
    return {f: choice[f] for f in SEARCH_SPACE}


def calibration_config(params: dict[str, Any], choice: dict[str, Any], screen: bool = True,
                       seed: int = SCREEN_SEED) -> RunConfig:
    """Simple averaging, MNIST, k = ks[0], at ``choice`` (the SEARCH_SPACE fields); ``screen``:
    the reduced screening protocol, else the profile's own (paper) protocol."""
    p = {**params, **_point(choice), **({"test_samples": SCREEN["test_samples"]} if screen else {})}
    reduced = {k: v for k, v in SCREEN.items() if k != "test_samples"} if screen else {}
    return logit_config(p, "simple", params["ks"][0], seed, **reduced)


def _stage_points(stage: str, done: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    """The points of one stage given the records of the stages before it."""
    space = SEARCH_SPACE
    if stage == "structure":  # where the public logits come from x private epochs, at the first protocol's rest
        return [{**FIRST, "public_logits": a, "local_epochs": e}
                for a in space["public_logits"] for e in space["local_epochs"]]
    screened = sorted((r for r in done if r["stage"] in ("structure", "tuning")), key=lambda r: -r["accuracy"])
    if stage == "tuning":  # one factor at a time around the `top` best structures
        best = [r["choice"] for r in screened if r["stage"] == "structure"][:top]
        return [{**b, field: v} for b in best for field in ("lr", "temperature", "distill_epochs")
                for v in space[field] if v != b[field]]
    if stage == "confirm":  # the best `top` screened points at the paper protocol
        return [r["choice"] for r in screened[:top]]
    if stage == "edge":  # one step past the edge around the best screened point: each move, then both
        best = screened[0]["choice"]
        return [{**best, **{f: v}} for f, v in EDGE.items()] + [{**best, **EDGE}]
    raise ValueError(f"stage: must be one of {', '.join((*STAGES, 'edge'))} (got {stage!r})")


def calibration_path():
    return Store().beside("logitfl-calibration.json")  # not a run: beside the store of runs


def load_calibration(path=None) -> dict[str, Any]:
    """The stored calibration record ({"points": [], ...} when there is none)."""
    path = path or calibration_path()
    return json.loads(path.read_text()) if path.is_file() else {"points": []}


def calibrate(profile: str = "paper", stages=STAGES, top: int = 1, confirm_top: int = 3, shard: int = 0,
              shards: int = 1, path=None, progress: bool = True) -> dict[str, Any]:
    """Run the calibration search on simple averaging (each stage's points: ``_stage_points``, around the ``top``
    best structures, confirming the ``confirm_top`` best screened points at the profile's own protocol) and record
    every point (config, accuracy per round, wall and CPU time) in ``results/logitfl-calibration.json``, atomically
    after each run; recorded points are not rerun. ``shard``/``shards`` split a stage's points between processes
    (the next stage after all shards finished). Returns the record."""
    import fcntl  # lazy: POSIX-only; the registry imports this module, only the calibration lock needs it

    params = load_profile("logitfl", profile)
    path = path or calibration_path()
    record = load_calibration(path)
    points = record["points"]
    for stage in stages:
        todo = _stage_points(stage, points, confirm_top if stage == "confirm" else top)
        for i, choice in enumerate(todo):
            config = calibration_config(params, choice, screen=stage != "confirm")
            if i % shards != shard or any(r["key"] == config.key() for r in points):
                continue
            if progress:
                print(f"[calibrate {stage} {i + 1}/{len(todo)}] {choice}", flush=True)
            wall, cpu = time.perf_counter(), time.process_time()
            result = run(config)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            lock = Path(tempfile.gettempdir()) / f"fedlib-calibration-{hashlib.sha256(str(path).encode()).hexdigest()[:12]}.lock"
            with open(lock, "w") as held:  # shards append one at a time
                fcntl.flock(held, fcntl.LOCK_EX)
                points = load_calibration(path)["points"]  # another shard may have written meanwhile
                points.append({
                    "stage": stage, "choice": _point(choice), "key": config.key(), "config": config.to_dict(),
                    "protocol": "screen" if stage != "confirm" else profile,
                    "accuracy": result.final["accuracy"], "round_accuracy": [h["accuracy"] for h in result.history],
                    "mean_client_accuracy": result.final["mean_client_accuracy"],
                    **environment(resolve_device(config.device)),  # versions, device, date, commit
                    "wall_time": result.meta["wall_time"] if cpu > 1.0 else None, "cpu_time": cpu if cpu > 1.0 else None,
                    "threads": torch.get_num_threads(),
                })
                record = {**load_calibration(path), "profile": profile, "search_space": SEARCH_SPACE,
                          "screen": SCREEN, "seed": SCREEN_SEED, "first_protocol": FIRST, "top": top, "confirm_top": confirm_top, "aggregator": "simple", "points": points}
                atomic_write_text(path, json.dumps(record, indent=1))
            if progress:
                print(f"    accuracy {100 * result.final['accuracy']:.2f} %, {wall:.0f} s wall, {cpu:.0f} s CPU",
                      flush=True)
    return load_calibration(path)


def calibration_table(record: dict[str, Any]):
    """Every recorded point as a DataFrame, in the order it was run."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    rows = [{"#": i + 1, "stage": r["stage"], "protocol": r["protocol"], "model": r["config"]["model"], **r["choice"],
             "accuracy (%)": round(100 * r["accuracy"], 2),
             "clients (%)": round(100 * r["mean_client_accuracy"], 2),
             "wall (s)": None if r["wall_time"] is None else round(r["wall_time"]),
             "CPU (s)": None if r["cpu_time"] is None else round(r["cpu_time"])}
            for i, r in enumerate(record["points"])]
    return pd.DataFrame(rows).set_index("#").fillna("—")  # no time recorded (a stored run reused)


def calibrated_choice(record: dict[str, Any]) -> dict[str, Any] | None:
    """The best point at the paper protocol, else the best screened point (None: no points)."""
    confirmed = [r for r in record["points"] if r["stage"] == "confirm"]
    pool = confirmed or record["points"]
    return max(pool, key=lambda r: r["accuracy"])["choice"] if pool else None
