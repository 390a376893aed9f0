"""A run's contribution vector: the one definition the chapters, the leaderboard, the
explorer's plots and the claims read.

The rule (after ``upto`` rounds, the first ``upto`` records of the history; all by default):

- FLCE: its completed contributions, Eq. 11-14 on the class contribution tensor X rebuilt
  from the history (:func:`flce_contributions`); equal to the ``scores`` FLCE records.
- a method that records ``scores`` (``Method.scores``: CELM, CGSV, ShapFed, CFFL, FedFa,
  FedSV, FedMS, ...): its last recorded scores, clipped at 0 and normalised to sum to 1.
- any other method: FLCE §4.1.3's similarity rule. Each round, the aggregated clients'
  per-round values (cos(w_k, w_g) the engine records; for ``shapley_rewards``, the GTG
  rewards it records) are clipped at 0 and normalised over those clients; these shares are
  summed over the rounds (a client not aggregated adds 0) and normalised.

A vector is uniform (1/N) when nothing positive is left. Ranks among clients valued <= 0 tie.
:func:`contribution_history` gives the per-round values before any clipping ([rounds, N],
NaN for a client not valued that round), for per-round rules such as CELM's z-score test.
"""

from __future__ import annotations

import numpy as np
import torch

from .methods.flce import complete_contributions, final_contributions

# methods whose per-round contribution is a diagnostic of the aggregated clients
ROUND_VALUES = {"shapley_rewards": "rewards_gtg"}


def _method(result) -> str:
    return (result.config.get("method") or {}).get("name", "")


def _n_clients(result) -> int:
    return len(result.meta["client_sizes"])


def _as_share(values: np.ndarray) -> np.ndarray:
    """Clipped at 0 and normalised; uniform when nothing positive is left."""
    v = np.clip(np.asarray(values, dtype=float), 0, None)
    return v / v.sum() if v.sum() > 0 else np.full(len(v), 1.0 / len(v))


def _round_values(result, record) -> tuple[np.ndarray, np.ndarray] | None:
    """(clients, values) of one round for the similarity rule, or None when not recorded."""
    key = ROUND_VALUES.get(_method(result))
    values = record.get("diagnostics", {}).get(key) if key else record.get("similarity")
    if values is None:
        return None
    return np.asarray(record["aggregated"], dtype=int), np.asarray(values, dtype=float)


def records_scores(result) -> bool:
    return any("scores" in h for h in result.history)


def contribution_history(result, upto: int | None = None) -> np.ndarray:
    """[rounds, N] per-round contribution values: the recorded ``scores`` of a method that
    has them (rounds without scores left out), else the per-round values of the similarity
    rule (NaN for a client not aggregated that round)."""
    n, records = _n_clients(result), result.history[:upto]
    if records_scores(result):
        rows = [h["scores"] for h in records if "scores" in h]
    else:
        rows = []
        for h in records:
            if (got := _round_values(result, h)) is not None:
                row = np.full(n, np.nan)
                row[got[0]] = got[1]
                rows.append(row)
    return np.asarray(rows, dtype=float).reshape(len(rows), n)


def similarity_contributions(result, upto: int | None = None) -> np.ndarray:
    """FLCE §4.1.3's rule: per-round values clipped at 0 and normalised over the aggregated
    clients, summed over rounds, normalised."""
    total = np.zeros(_n_clients(result))
    for h in result.history[:upto]:
        got = _round_values(result, h)
        if got is not None and np.clip(got[1], 0, None).sum() > 0:
            np.add.at(total, got[0], _as_share(got[1]))
    return _as_share(total)


def flce_tensor(result, upto: int | None = None) -> np.ndarray:
    """FLCE's contribution tensor X [rounds, N, C] from the history (NaN where not observed)."""
    counts = np.asarray(result.meta["client_class_counts"])
    records = result.history[:upto]
    x = np.full((len(records), *counts.shape), np.nan)
    for t, h in enumerate(records):  # one row per stored round (ragged client lists)
        x[t, h["aggregated"]] = h["diagnostics"]["x_class"]
    return x


def flce_contributions(result, upto: int | None = None, complete: bool = True, over: str | None = None) -> np.ndarray:
    """Eq. 11-14 on the first ``upto`` rounds of a FLCE run (``complete=False``: FLCE−CMC;
    ``over``: "client_class" or "summed", the run's own ``completion_over`` by default)."""
    params = result.config["method"]
    x = torch.from_numpy(flce_tensor(result, upto))
    if complete and params.get("completion", True):
        summed = complete_contributions(x, over or params.get("completion_over", "client_class"),
                                        int(params.get("rank", 1)), int(params.get("completion_steps", 2000)),
                                        float(params.get("completion_lr", 0.05)))
    else:
        summed = torch.nan_to_num(x, nan=0.0).sum(-1)
    return final_contributions(summed).numpy()


def contribution_vector(result, upto: int | None = None) -> np.ndarray:
    """The run's contribution vector [N] after ``upto`` rounds, summing to 1 (module docstring)."""
    if _method(result) == "flce":
        return flce_contributions(result, upto)
    if records_scores(result):
        scores = [h["scores"] for h in result.history[:upto] if "scores" in h]
        return _as_share(scores[-1]) if scores else np.full(_n_clients(result), 1.0 / _n_clients(result))
    return similarity_contributions(result, upto)

