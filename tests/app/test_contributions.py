"""One contribution vector per run: every reader calls ``fedlib.contributions``.

The chapters (CELM, FLCE), the leaderboard and the explorer's bar chart read the same vector of
a stored-format run (a tiny synthetic run through JSON); the values follow the documented rule."""

import json

import numpy as np
import pytest

import fedlib
from fedlib import contributions, plots
from fedlib.app.chapters import flce
from fedlib.app.chapters.celm import protocol as celm_protocol
from fedlib.app.chapters import leaderboard as lb
from fedlib.run import RunResult

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY = dict(dataset="synthetic", model="mlp", n_clients=4, clients_per_round=2, rounds=2, batch_size=32,
            server_val=60, test_samples=100, seed=5, reference_values=True)


def _stored(method: str) -> RunResult:
    result = fedlib.run({**TINY, "method": method}, cache=False, progress=False)
    return RunResult.from_dict(json.loads(json.dumps(result.to_dict())))  # as read back from results/


def test_every_reader_is_the_one_function():
    assert flce.contributions is contributions.contribution_vector
    assert plots.final_contributions is contributions.contribution_vector
    assert celm_protocol.score_history is contributions.contribution_history
    assert flce.similarity_contributions is contributions.similarity_contributions
    assert flce.flce_contributions is contributions.flce_contributions


@pytest.mark.parametrize("method", ["fedavg", "cgsv"])
def test_chapters_leaderboard_and_explorer_agree_on_a_run(method):
    r = _stored(method)
    vector = contributions.contribution_vector(r)
    assert vector.shape == (4,) and vector.sum() == pytest.approx(1.0) and (vector >= 0).all()
    np.testing.assert_array_equal(flce.contributions(r), vector)
    # the explorer's bars are the vector (the run's exact Shapley values are drawn after them)
    bars = plots.contribution_bars({method: r}).axes[0].patches
    np.testing.assert_allclose([b.get_height() for b in bars][:len(vector)], vector)
    truth = plots.true_contributions(r)
    np.testing.assert_allclose([b.get_height() for b in bars][len(vector):], truth)
    # the leaderboard's fidelity is computed on the vector (restricted to the referenced clients)
    ref = r.final["reference"]
    rho, kl = lb.fidelity(vector[ref["clients"]], np.asarray(ref["shapley"]))
    metrics = lb.run_metrics(r, method)
    assert metrics["rho_shapley"] == pytest.approx(rho, nan_ok=True)
    assert metrics["kl_shapley"] == pytest.approx(kl, nan_ok=True)
    history = contributions.contribution_history(r)
    np.testing.assert_array_equal(lb.contribution_history(r, method), history)
    if method == "cgsv":  # scores: the last recorded row, clipped at 0, normalised
        last = np.clip(r.history[-1]["scores"], 0, None)
        np.testing.assert_allclose(vector, last / last.sum())
        np.testing.assert_array_equal(celm_protocol.score_history(r), history)
    else:  # FLCE §4.1.3 by hand: per-round similarity shares of the aggregated clients, summed
        total = np.zeros(4)
        for h in r.history:
            sim = np.clip(h["similarity"], 0, None)
            total[h["aggregated"]] += sim / sim.sum()
        np.testing.assert_allclose(vector, total / total.sum())
        assert np.isnan(history).sum() == 2 * 2  # 2 of 4 clients not valued in each of 2 rounds


def test_upto_reads_the_first_rounds_and_uniform_when_nothing_is_positive():
    meta = {"client_sizes": [1, 1, 1]}
    history = [{"round": 0, "aggregated": [0, 1], "similarity": [-0.5, -0.1]},
               {"round": 1, "aggregated": [1, 2], "similarity": [0.3, 0.1]}]
    r = RunResult(config={"method": {"name": "fedavg"}}, history=history, final={}, meta=meta)
    np.testing.assert_allclose(contributions.contribution_vector(r, upto=1), [1 / 3] * 3)
    np.testing.assert_allclose(contributions.contribution_vector(r), [0, 0.75, 0.25])
    scored = RunResult(config={"method": {"name": "cgsv"}}, meta=meta, final={},
                       history=[{**history[0], "scores": [-1.0, -2.0, 0.0]}, {**history[1], "scores": [1, 3, 0]}])
    np.testing.assert_allclose(contributions.contribution_vector(scored, upto=1), [1 / 3] * 3)
    np.testing.assert_allclose(contributions.contribution_vector(scored), [0.25, 0.75, 0])
