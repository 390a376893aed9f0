"""FedMS and the Shapley-based methods: the equations of one round (Eq. 8-10, 12, 13), coreset
aggregation and the ε_d guard, the engine keeping the global model, S-FedAvg and GreedyFed,
hyper-parameter errors, and the chapter's configs and readers."""

import numpy as np
import pytest
import torch

from fedlib.app.kit import sources
from fedlib.app.chapters.fedms import analysis as fedms_analysis
from fedlib.app.chapters.fedms import protocol as fedms_protocol
from fedlib.config import make_config
from fedlib.data import load_dataset
from fedlib.methods import METHODS, ClientUpdates, Federation, Method, RoundState, build_method, register
from fedlib.methods.shapley import selection_probabilities
from fedlib.models import build_model
from fedlib.population import LocalTraining, ParamLayout, make_client_batches
from fedlib.training import train_clients
from fedlib.run import RunResult, run
from fedlib.valuation import all_coalitions, class_difficulty, coalition_utility

SHAPE = (1, 8, 8)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def world():
    """4 clients on a synthetic 4-class task; client 3 alone holds class 3. A round's updates."""
    ds = load_dataset("synthetic", num_classes=4, image_shape=SHAPE, n_train=600, n_test=200, seed=0, noise=1.0)
    y = ds.y_train.numpy()
    shared = np.random.default_rng(0).permutation(np.flatnonzero(y != 3))
    indices = [np.sort(p) for p in np.array_split(shared, 4)]
    indices[3] = np.sort(np.concatenate([indices[3], np.flatnonzero(y == 3)]))
    torch.manual_seed(0)
    model = build_model("mlp", SHAPE, 4)
    start = ParamLayout(model).flat_of(model)
    batches = make_client_batches(indices, 16, 3, torch.Generator().manual_seed(0))
    flat, bufs = train_clients(model, start, {}, ds.x_train, ds.y_train, batches, LocalTraining(lr=0.05))
    sizes = np.array([len(ix) for ix in indices])
    fed = Federation(model=model, n_clients=4, n_classes=4, rounds=10, clients_per_round=4, client_sizes=sizes,
                     device=torch.device("cpu"), x_val=ds.x_test, y_val=ds.y_test)
    updates = ClientUpdates(clients=np.arange(4), flat=flat, buffers=bufs, sizes=sizes)
    return fed, updates, start


def _state(start, t=1, seed=0):
    return RoundState(round=t, rng=np.random.default_rng(seed), global_flat=start, global_buffers={}, lr=0.05)


def test_one_fedms_round_follows_the_equations(world):
    fed, updates, start = world
    m = build_method("fedms", {"estimator": "mr", "alpha": 0.6, "temperature": 0.05})
    m.setup(fed)
    state = _state(start)
    weights = m.weigh(state, updates)
    diagnostics = m.diagnostics(state)
    u = coalition_utility(fed.model, updates.flat, {}, torch.as_tensor(updates.sizes).float(), fed.x_val, fed.y_val,
                          4, start)
    values = u(all_coalitions(4)).double()
    best = int(torch.argmax(values[1:].sum(1))) + 1  # coreset: highest summed class accuracy
    members = all_coalitions(4)[best]
    beta = class_difficulty(values[best], 0.05)  # Eq. 10
    torch.testing.assert_close(torch.tensor(diagnostics["beta"], dtype=torch.float64), beta)
    phi = m.S / (1 - 0.6)  # Eq. 8 from S = 0
    torch.testing.assert_close(m.S_hat, m.S @ beta)  # Eq. 9
    torch.testing.assert_close(torch.tensor(diagnostics["rewards"], dtype=torch.float64), phi @ beta)  # Eq. 13
    torch.testing.assert_close(phi.sum(0), values[-1] - values[0])  # exact values: efficiency
    expected = torch.as_tensor(updates.sizes).float() * members.float()
    torch.testing.assert_close(weights, expected / expected.sum())  # coreset aggregation
    assert diagnostics["coreset"] == np.flatnonzero(members.numpy()).tolist()
    assert 3 in diagnostics["coreset"]  # the Maverick is in the coreset


def test_divergence_guard_discards_a_bad_coreset(world):
    fed, updates, start = world
    m = build_method("fedms", {"eps_d_start": 1e-6, "eps_d_end": 1e-6})
    m.setup(fed)
    good = (torch.as_tensor(updates.sizes).float() / updates.sizes.sum()) @ updates.flat  # better than any client
    noise = ClientUpdates(clients=updates.clients, flat=good + 0.5 * torch.randn_like(updates.flat),
                          buffers={}, sizes=updates.sizes)
    state = _state(good)
    weights = m.weigh(state, noise)
    diagnostics = m.diagnostics(state)
    assert diagnostics["d_hat"] < 0 and diagnostics["coreset"] == []
    assert not bool(weights.any())


def test_eps_d_decays_exponentially_from_3_to_the_end_value():
    m = build_method("fedms", {"eps_d_end": 0.2})
    m.fed = type("F", (), {"rounds": 11})()
    assert m.eps_d(0) == pytest.approx(3.0)
    assert m.eps_d(10) == pytest.approx(0.2)
    assert m.eps_d(5) == pytest.approx(np.sqrt(3.0 * 0.2))


def test_selection_follows_the_scores(world):
    fed, _, start = world
    m = build_method("fedms", {"score_scale": 100.0})  # the scaled variant, softmax(100 Ŝ)
    many = Federation(**{**fed.__dict__, "n_clients": 20, "clients_per_round": 2})
    m.setup(many)
    m.S_hat = torch.zeros(20, dtype=torch.float64)
    m.S_hat[[4, 11]] = 0.2  # 20 percentage points above the rest: P ≈ e^20 / (e^20 * 2 + 18)
    picks = [m.select_clients(_state(start, t=1, seed=s)).tolist() for s in range(20)]
    assert all(p == [4, 11] for p in picks)
    assert m.select_clients(_state(start, t=0)).tolist() == list(range(20))  # round 0: everyone


class _ZeroWeights(Method):
    name = "_zero_weights_test"

    def weigh(self, state, updates):
        return torch.zeros(len(updates.clients))


def test_engine_keeps_the_global_model_when_all_weights_are_zero():
    register(_ZeroWeights)  # registered only inside this test: other tests iterate over METHODS
    try:
        r = run(make_config(dataset="synthetic", n_clients=3, rounds=2, batch_size=32, method="_zero_weights_test"),
                cache=False, progress=False)
    finally:
        METHODS.pop("_zero_weights_test")
    assert r.history[0]["accuracy"] == r.history[1]["accuracy"]


def test_fedms_runs_on_a_maverick_federation_and_records_rewards():
    cfg = make_config(dataset="synthetic", model="mlp", n_clients=10, clients_per_round=3, rounds=3, batch_size=16,
                      lr=0.05, server_val=200, split={"name": "maverick", "n_mavericks": 2, "gamma": 1.0},
                      method={"name": "fedms"})
    r = run(cfg, cache=False, progress=False)
    assert len(r.history[0]["selected"]) == 10 and len(r.history[1]["selected"]) == 3
    for h in r.history[1:]:
        d = h["diagnostics"]
        assert len(d["rewards"]) == len(h["aggregated"]) and abs(sum(d["beta"]) - 1) < 1e-9
        assert set(d["coreset"]) <= set(h["aggregated"])
        assert d["evaluations"] <= 2**3
    assert len(r.history[-1]["scores"]) == 10


def test_s_fedavg_and_greedyfed(world):
    fed, updates, start = world
    s = build_method("s_fedavg")
    s.setup(fed)
    state = _state(start)
    s.weigh(state, updates)
    np.testing.assert_allclose(s.values, 0.3 * np.asarray(s.diagnostics(state)["rewards"]))
    g = build_method("greedyfed")
    many = Federation(**{**fed.__dict__, "n_clients": 7, "clients_per_round": 3})
    g.setup(many)
    seen = []
    for t in range(3):  # round-robin until every client was seen
        chosen = g.select_clients(_state(start, t))
        seen.append(chosen.tolist())
        g.taken[chosen] += 1
    assert seen[0] == [0, 1, 2] and seen[1] == [3, 4, 5] and 6 in seen[2]
    g.values = np.arange(7.0)
    assert g.select_clients(_state(start, 3)).tolist() == [4, 5, 6]  # greedy: top K


@pytest.mark.parametrize("name,params,message", [
    ("fedms", {"alpha": 1.0}, "alpha must be in"),
    ("fedms", {"temperature": 0.0}, "temperature must be > 0"),
    ("fedms", {"estimator": "nope"}, "estimator must be one of"),
    ("fedms", {"eps_d_start": 0.1, "eps_d_end": 0.5}, "eps_d_end <= eps_d_start"),
    ("shapley_rewards", {"excluded": [-1]}, "excluded must be client ids"),
    ("s_fedavg", {"score_scale": 0}, "score_scale must be > 0"),
    ("greedyfed", {"ucb": -1}, "ucb must be >= 0"),
])
def test_bad_hyperparameters_are_one_line_errors(name, params, message):
    with pytest.raises(ValueError, match=message) as info:
        build_method(name, params)
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- the chapter


def test_chapter_configs_use_the_papers_hyperparameters():
    quick = sources.load_profile("fedms", "quick")
    assert len(fedms_protocol.experiment_configs(quick, "table1")) == 3 * (7 + 2)  # + FedMS, S-FedAvg with ×100
    c = fedms_protocol.run_config(quick, "Dir(10)", "fedms", 0)
    assert c.method.params["alpha"] == 0.8 and c.split.params == {"n_mavericks": 2, "gamma": 10.0}
    assert fedms_protocol.run_config(quick, "Dir(0.1)", "fedms", 0).method.params["eps_d_end"] == 0.2
    assert fedms_protocol.run_config(quick, "Dir(1)", "poc", 0).method.params["decay"] == 0.9
    assert fedms_protocol.run_config(quick, "Dir(10)", "fedemd", 0).method.params["beta"] == 0.001
    assert fedms_protocol.run_config(quick, "Dir(1)", "fedprox", 0).method.params["mu"] == 1.0
    assert fedms_protocol.adversarial_config(quick, "fedms", 0).n_clients == 58
    paper = sources.load_profile("fedms", "paper")
    assert (paper["rounds"], paper["local_epochs"], paper["batch_size"], paper["lr"], len(paper["seeds"])) == \
        (100, 5, 64, 0.05, 3)


def _fake(roles, history):
    return RunResult(config={}, history=history, final={}, meta={"client_roles": roles})


def test_participation_and_reward_series():
    roles = ["benign", "benign", "maverick", "label_flip"]
    history = [
        {"aggregated": [0, 2], "weights": [0.5, 0.5], "diagnostics": {"rewards": [0.1, 0.4]}},
        {"aggregated": [1, 3], "weights": [1.0, 0.0], "diagnostics": {"rewards": [0.2, -0.3]}},
    ]
    rates = fedms_protocol.participation(_fake(roles, history))
    assert rates["maverick"] == 50.0 and rates["label_flip"] == 0.0 and np.isnan(rates["free_rider"])
    s = fedms_protocol.reward_series(_fake(roles, history))
    np.testing.assert_allclose(s["cumulative_maverick"], [0.4, 0.4])
    np.testing.assert_allclose(s["cumulative_other"], [0.1 / 3, 0.0], atol=1e-12)
    assert np.isnan(s["mean_maverick"][1])


# ----------------------------------------------------------------------------- Eq. 12 as printed


def test_eq12_softmax_by_hand():
    """P_i = exp(Ŝ_i) / Σ_j exp(Ŝ_j): Ŝ = (0, ln 3) gives (1/4, 3/4). The ×100 variant on
    Ŝ = (0, 0.01) is softmax(0, 1) = (1/(1 + e), e/(1 + e)) ≈ (0.26894, 0.73106); unscaled the same
    scores are nearly uniform, (1/(1 + e^0.01), ...) ≈ (0.49750, 0.50250)."""
    np.testing.assert_allclose(selection_probabilities([0.0, np.log(3.0)]), [0.25, 0.75])
    np.testing.assert_allclose(selection_probabilities([0.0, 0.01], scale=100.0),
                               [1 / (1 + np.e), np.e / (1 + np.e)])
    np.testing.assert_allclose(selection_probabilities([0.0, 0.01]), [1 / (1 + np.exp(0.01)), 1 / (1 + np.exp(-0.01))])
    assert selection_probabilities([0.0, 0.01])[0] == pytest.approx(0.497500, abs=1e-6)


def test_eq12_is_the_default_and_the_scale_an_option(world):
    fed, _, start = world
    for name in ("fedms", "s_fedavg"):
        method = build_method(name)
        assert method.score_scale == 1.0 and method.rule_version == "2"
    m = build_method("fedms")
    two = Federation(**{**fed.__dict__, "n_clients": 2, "clients_per_round": 1})
    m.setup(two)
    m.S_hat = torch.tensor([0.0, np.log(3.0)], dtype=torch.float64)  # P = (1/4, 3/4)
    picks = [m.select_clients(_state(start, t=1, seed=s))[0] for s in range(400)]
    assert np.mean(picks) == pytest.approx(0.75, abs=0.06)  # binomial sd ≈ 0.022


def test_chapter_runs_both_softmax_variants_in_every_profile():
    for profile in ("smoke", "quick", "paper"):
        params = sources.load_profile("fedms", profile)
        specs = [c.method.params | {"name": c.method.name} for c in fedms_protocol.experiment_configs(params, "table1")]
        for name in ("fedms", "s_fedavg"):
            if name in params["methods"]:
                assert any(s["name"] == name and s.get("score_scale") == 100.0 for s in specs)
                assert any(s["name"] == name and "score_scale" not in s for s in specs)
    rows = [("Dir(1)", {"fedms": (92.0, 0.1), "s_fedavg": (80.0, 0.1)},
             {"ours": {"fedms": (90.0, 0.0), "fedms_x100": (91.5, 0.0), "s_fedavg": (79.0, 0.0),
                       "s_fedavg_x100": (70.0, 0.0)}})]
    verdict = {v["method"]: v for v in fedms_analysis.softmax_verdict(rows, "ours")}
    assert verdict["FedMS"]["nearer"] == "×100" and verdict["FedMS"]["gap, softmax(Ŝ) (Eq. 12)"] == 2.0
    assert verdict["S-FedAvg"]["nearer"] == "Eq. 12 as printed" and verdict["S-FedAvg"]["gap, softmax(100 Ŝ)"] == 10.0


def _history_run(maverick_rounds: int, class2_acc: float, accuracies, method=None):
    """3 clients (client 2, a Maverick, alone holds class 2), 5 rounds, 2 aggregated per round."""
    from fedlib.results import RunResult

    history = [{"round": t, "aggregated": [0, 2] if t < maverick_rounds else [0, 1], "weights": [0.5, 0.5],
                "accuracy": a} for t, a in enumerate(accuracies)]
    meta = {"client_sizes": [10, 10, 10], "client_roles": ["benign", "benign", "maverick"],
            "client_class_counts": [[5, 5, 0], [5, 5, 0], [0, 0, 10]]}
    final = {"accuracy": accuracies[-1], "per_class_accuracy": [0.9, 0.9, class2_acc]}
    return RunResult({"method": method or {"name": "fedavg"}}, history, final, meta)


def test_a_shortfall_is_read_from_the_runs_history():
    """Hand-built histories: the Maverick aggregated in 1 of 5 rounds (FedAvg: 4), its class at 10 %
    (FedAvg 80 %); accuracy still rising by 20 points in the last round (FedAvg: 1 point)."""
    fedavg = _history_run(4, 0.8, [0.5, 0.6, 0.7, 0.8, 0.81])
    starved = fedms_analysis.diagnose_shortfall(_history_run(1, 0.1, [0.1, 0.2, 0.3, 0.4, 0.6]), fedavg)
    assert fedms_protocol.aggregated_rounds(fedavg).tolist() == [5, 1, 4]
    assert starved["Mavericks aggregated (rounds)"] == "1" and starved["Maverick classes' accuracy (%)"] == "10"
    assert starved["gain, last fifth (points)"] == pytest.approx(20.0)
    why = starved["why (from the run's history)"]
    assert "aggregated in 1 of 5 rounds (FedAvg: 4)" in why and "end at 10 % (FedAvg: 80 %)" in why
    assert "still learning: +20.0 points" in why and "(FedAvg +1.0)" in why
    slowed = fedms_analysis.diagnose_shortfall(_history_run(4, 0.2, [0.5, 0.6, 0.7, 0.8, 0.8],
                                                     {"name": "fedprox", "mu": 1.0}), fedavg)
    assert "took part as often as under FedAvg" in slowed["why (from the run's history)"]
    assert "μ = 1" in slowed["why (from the run's history)"]
