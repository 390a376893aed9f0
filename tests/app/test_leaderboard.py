"""Leaderboard: the engine's exact references, FedSCM's weights as a selection, the
chapter's metrics on hand-made runs, and one tiny end-to-end table."""

import json

import numpy as np
import pytest
import torch

import fedlib
from fedlib.app.chapters import leaderboard as lb
from fedlib.config import make_config
from fedlib.methods import ClientUpdates, Federation, RoundState, build_method
from fedlib.methods import scm
from fedlib.methods.scm_selection import client_probabilities
from fedlib.models import build_model
from fedlib.population import ParamLayout, aggregate, evaluate
from fedlib.run import RunResult, prepare

SYNTH = dict(dataset="synthetic", model="mlp", n_clients=4, rounds=2, batch_size=32, server_val=60,
             test_samples=100, seed=3)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ----------------------------------------------------------------------------- engine hook


def test_reference_values_change_the_key_and_need_few_clients():
    expected = make_config(**SYNTH).key()
    assert make_config(**SYNTH, reference_values=True).key() != expected
    with pytest.raises(ValueError, match="reference_values: exact Shapley needs <= 16 clients"):
        make_config(**{**SYNTH, "n_clients": 17}, reference_values=True)


def test_engine_reference_values_are_exact_shapley_and_leave_one_out():
    cfg = make_config(**SYNTH, reference_values=True)
    result = fedlib.run(cfg, cache=False, progress=False)
    ref = result.final["reference"]
    shapley, loo = np.asarray(ref["shapley"]), np.asarray(ref["loo"])
    assert ref["clients"] == [0, 1, 2, 3] and ref["coalitions"] == 2**4
    # efficiency: Σ φ_i = U(all) − U(∅)
    assert shapley.sum() == pytest.approx(ref["utility_all"] - ref["utility_empty"], abs=1e-6)
    assert ref["sizes"] == result.meta["client_sizes"]
    # the same numbers from a loop over coalitions, re-running the two rounds by hand
    p = prepare(cfg)
    layout = ParamLayout(p.model)
    captured = {}
    original = p.method.weigh

    def spy(state, updates):
        captured["state"], captured["updates"] = state, updates
        return original(state, updates)

    p.method.weigh = spy
    from fedlib.run import _execute

    again = _execute(p, progress=False)
    assert again.final["reference"]["shapley"] == pytest.approx(ref["shapley"], abs=1e-9)
    state, updates = captured["state"], captured["updates"]
    sizes = torch.as_tensor(updates.sizes, dtype=torch.float32)

    def utility(members):
        if not members:
            flat = state.global_flat.unsqueeze(0)
        else:
            w = torch.zeros(len(sizes))
            w[list(members)] = sizes[list(members)]
            flat, _ = aggregate(updates.flat, (w / w.sum()).unsqueeze(0), {})
        ev = evaluate(p.model, flat, {}, p.x_val, p.y_val, p.dataset.num_classes)
        return float(ev.accuracy[0])

    everyone = set(range(4))
    for i in range(4):
        assert loo[i] == pytest.approx(utility(everyone) - utility(everyone - {i}), abs=1e-6)
    assert layout.size == updates.flat.shape[1]


# ----------------------------------------------------------------------------- FedSCM as a selection


def _updates(n=5, seed=0):
    torch.manual_seed(seed)
    model = build_model("mlp", (1, 8, 8), 4)
    layout = ParamLayout(model)
    flat = layout.flat_of(model).unsqueeze(0) + 0.3 * torch.randn(n, layout.size)
    x_val = torch.randn(40, 1, 8, 8)
    fed = Federation(model=model, n_clients=n, n_classes=4, rounds=3, clients_per_round=n,
                     client_sizes=np.arange(10, 10 + n), device=torch.device("cpu"), x_val=x_val,
                     y_val=torch.zeros(40, dtype=torch.long))
    state = RoundState(round=0, rng=np.random.default_rng(0), global_flat=flat[0], global_buffers={}, lr=0.1)
    return fed, state, ClientUpdates(clients=np.arange(n), flat=flat, buffers={}, sizes=np.arange(10, 10 + n))


def test_fedscm_select_weights_are_scm_select_on_the_clients_predictions():
    fed, state, updates = _updates()
    method = build_method("fedscm_select", {"gamma": 0.6})
    method.setup(fed)
    lam = method.weigh(state, updates)
    # oracle: one model at a time (a loop over clients, the test's reference only)
    layout = ParamLayout(fed.model)
    with torch.no_grad():
        probs = torch.stack([torch.softmax(layout.load_into(fed.model, f).eval()(fed.x_val).double(), -1)
                             for f in updates.flat])
    batched = client_probabilities(fed, updates)
    assert torch.allclose(probs, batched, atol=1e-5)
    chosen = scm.select(batched, 0.6, "pgd")
    expected = chosen.weights / chosen.weights.sum()  # the solver's weights, renormalised for the aggregation
    assert torch.allclose(lam.double(), expected, atol=1e-6)
    np.testing.assert_array_equal(np.flatnonzero(lam.numpy() > 0), chosen.selected)  # selected = non-zero weight
    method.weigh(state, updates)
    assert method.scores() == pytest.approx(expected.numpy(), abs=1e-6)  # mean λ over two equal rounds


def test_fedscm_select_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match="gamma: must be in"):
        build_method("fedscm_select", {"gamma": 1.0})
    with pytest.raises(ValueError, match="solver must be one of"):
        build_method("fedscm_select", {"solver": "adam"})
    with pytest.raises(ValueError, match="selects 4 clients per round, more than the 3 clients"):
        make_config(**{**SYNTH, "n_clients": 3}, method={"name": "fedscm_select", "gamma": 0.75})


# ----------------------------------------------------------------------------- chapter metrics


def _result(roles, history, final=None, method="celm"):
    n = len(roles)
    return RunResult(config={"method": {"name": method}}, history=history,
                     final={"accuracy": 0.5, "balanced_accuracy": 0.4, **(final or {})},
                     meta={"client_roles": roles, "client_sizes": [10] * n, "wall_time": 1.0,
                           "client_class_counts": [[1] * 3] * n})


def test_contribution_history_reads_each_source_and_fills_missing_clients():
    history = [{"round": 0, "aggregated": [0, 2], "similarity": [0.9, 0.1],
                "diagnostics": {"rewards_gtg": [0.3, -0.1]}, "time_server": 0.1}]
    roles = ["benign", "benign", "free_rider"]
    scored = _result(roles, [{**history[0], "scores": [1, 2, 3]}])
    assert np.allclose(lb.contribution_history(scored), [[1, 2, 3]])
    sim = lb.contribution_history(_result(roles, history, method="fedavg"))
    assert sim[0, 0] == pytest.approx(0.9) and np.isnan(sim[0, 1]) and sim[0, 2] == pytest.approx(0.1)
    gtg = lb.contribution_history(_result(roles, history, method="shapley_rewards"))
    assert gtg[0, 0] == pytest.approx(0.3) and np.isnan(gtg[0, 1]) and gtg[0, 2] == pytest.approx(-0.1)


def test_distribution_fidelity_rank_and_auroc_values():
    assert lb.as_distribution([2.0, -1.0, 2.0]) == pytest.approx([0.99 / 2 + 0.01 / 3, 0.01 / 3, 0.99 / 2 + 0.01 / 3])
    assert lb.as_distribution([-1.0, -2.0]) == pytest.approx([0.5, 0.5])
    rho, kl = lb.fidelity([1.0, 2.0, 3.0], [10.0, 20.0, 30.0])
    assert rho == pytest.approx(1.0) and kl == pytest.approx(0.0, abs=1e-12)
    rho, kl = lb.fidelity([3.0, 2.0, 1.0], [1.0, 2.0, 3.0])
    assert rho == pytest.approx(-1.0) and kl > 0
    assert np.isnan(lb.fidelity([1.0, np.nan], [1.0, 2.0])[0])
    roles = ["benign", "maverick", "benign"]
    assert lb.maverick_rank([0.1, 0.5, 0.3], roles) == 1.0
    assert lb.maverick_rank([0.5, 0.1, 0.3], roles) == 3.0
    assert lb.maverick_rank([0.2, 0.2, 0.2], roles) == 2.0
    assert np.isnan(lb.maverick_rank([0.1, 0.2, 0.3], ["benign"] * 3))
    history = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 2.0], [np.nan, 1.0, 1.0]])
    fr = ["benign", "benign", "weak_free_rider"]
    assert lb.free_rider_auroc(history, fr) == pytest.approx(0.5)  # round 1: 1, round 2: 0, round 3 dropped
    assert np.isnan(lb.free_rider_auroc(history, ["benign"] * 3))


def test_run_metrics_and_server_ratio_on_handmade_runs():
    history = [{"round": t, "aggregated": [0, 1, 2], "similarity": [0.2, 0.9, 0.5], "scores": [0.1, 0.7, 0.2],
                "time_server": 0.01 * (t + 1)} for t in range(2)]
    ref = {"clients": [0, 1, 2], "shapley": [0.0, 0.3, 0.1], "loo": [0.0, 0.2, 0.05], "sizes": [50, 10, 40],
           "time": 0.5}
    r = _result(["benign", "maverick", "benign"], history, {"reference": ref, "per_class_accuracy": [1, 0, 0.5]})
    m = lb.run_metrics(r, "celm")
    assert m["accuracy"] == 50.0 and m["maverick_rank"] == 1.0 and m["server_s"] == pytest.approx(0.015)
    assert m["rho_shapley"] == pytest.approx(1.0) and m["rho_size"] == pytest.approx(-1.0)
    assert lb.reference_ranks(r) == {"shapley": 1.0, "loo": 1.0, "size": 3.0}


def test_every_method_runs_on_the_same_federation():
    from fedlib.app.kit import sources

    params = sources.load_profile("leaderboard", "smoke")
    cfgs = lb.configs(params)
    assert len(cfgs) == len(params["datasets"]) * len(params["splits"]) * len(params["methods"]) * len(params["seeds"])
    by_split = {}
    for c in cfgs:
        assert c.reference_values and c.server_val == params["server_val"]
        by_split.setdefault(c.split.name, set()).add(json.dumps(
            c.model_dump(mode="json", exclude={"method"}), sort_keys=True))
    assert all(len(v) == 1 for v in by_split.values())  # only the method differs
    with pytest.raises(ValueError, match="unknown leaderboard method 'nope'"):
        lb.run_config(params, "fmnist", "IID", "nope", 0)
    with pytest.raises(ValueError, match="unknown split 'Zipf'"):
        lb.split_spec(params, "Zipf")


def test_tiny_table_end_to_end():
    from fedlib.app.kit import sources

    params = {**sources.load_profile("leaderboard", "smoke"), "methods": ["fedavg", "fedscm", "gtg_shapley"],
              "splits": ["Maverick"], "rounds": 1, "fraction": 0.01}
    cfgs = lb.configs(params)
    results = {c.key(): fedlib.run(c, cache=False, progress=False) for c in cfgs}
    frame = lb.table(results, params, ["fmnist"])
    assert list(frame["method"]) == ["FedAvg (sample count)", "FedSCM selection", "GTG-Shapley"]
    assert frame.loc[0, "server_ratio"] == pytest.approx(1.0)
    gtg = frame.iloc[2]
    assert gtg["accuracy"] == pytest.approx(frame.loc[0, "accuracy"])  # GTG-Shapley trains as FedAvg
    assert np.isfinite(frame["rho_shapley"][:2]).all() and np.isfinite(frame["kl_shapley"]).all()
    assert frame["maverick_rank"].dropna().between(1, 4).all() and len(frame["maverick_rank"].dropna()) >= 2


def test_means_and_bests_compare_methods_on_the_federations_all_of_them_ran():
    import pandas as pd

    # B ran seed 1 only, where A (mean over both seeds 80) scores 70: on the shared seed B (75) is ahead
    frame = pd.DataFrame([{"dataset": "fmnist", "split": "PLS", "seed": s, "method": m, "accuracy": a}
                          for s, m, a in ((0, "A", 90.0), (1, "A", 70.0), (1, "B", 75.0))])
    shared = lb.on_shared_federations(frame)
    assert list(shared["seed"]) == [1, 1]
    means = shared.groupby("method")["accuracy"].mean()
    assert means["B"] > means["A"] and frame.groupby("method")["accuracy"].mean()["A"] > 75.0


def test_poisoning_metrics_and_the_note_name_what_the_monitor_cannot_tell():
    """Two of four clients flip signs: 3 rounds in which they point against an agreeing majority (core
    cosine -0.5 against 0.9). The table judges the stored statistics with today's rule (not the warning the
    run stored): both flippers named, no benign client; one such round is not enough (3 rounds needed)."""
    from types import SimpleNamespace

    def history(rounds, flipper_cosine=-0.5):
        cos = [0.9, flipper_cosine, 0.9, flipper_cosine]
        return [{"round": t, "aggregated": [0, 1, 2, 3], "accuracy": 0.5,
                 "disagreement": {"cosine": cos, "core_cosine": cos, "norm_ratio": [1.0] * 4, "unchanged": [],
                                  "identical": [], "anomalous": []}} for t in range(rounds)]

    meta = {"client_roles": ["benign", "sign_flip", "benign", "sign_flip"], "client_sizes": [10] * 4}
    run = SimpleNamespace(meta=meta, history=history(3), final={"accuracy": 0.5, "poisoning_warning": None})
    assert lb.poisoning_metrics(run) == {"accuracy": 50.0, "warned": True, "flippers_named": 1.0, "benign_named": 0}
    short = SimpleNamespace(meta=meta, history=history(2), final={"accuracy": 0.25, "poisoning_warning": {"clients": [0]}})
    assert lb.poisoning_metrics(short) == {"accuracy": 25.0, "warned": False, "flippers_named": 0.0, "benign_named": 0}
    agreeing = SimpleNamespace(meta=meta, history=history(3, 0.9), final={"accuracy": 0.5, "poisoning_warning": None})
    assert lb.poisoning_metrics(agreeing)["warned"] is False
    for claim in ("label skew", "Maverick", "label flipping", "Krum", "no committed run without a hostile client"):
        assert claim in lb.POISONING_NOTE
