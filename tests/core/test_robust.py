"""Byzantine-robust aggregation (fedlib.methods.robust) against closed-form cases."""

import numpy as np
import pytest
import torch

import fedlib
from fedlib.config import make_config
from fedlib.methods import ClientUpdates, RoundState, build_method
from fedlib.methods.robust import coordinate_median, krum_scores, trimmed_mean

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _state(flat, sizes=None, buffers=None):
    n = flat.shape[0]
    updates = ClientUpdates(clients=np.arange(n), flat=flat, buffers=buffers or {},
                            sizes=np.asarray(sizes if sizes is not None else [10] * n))
    state = RoundState(round=0, rng=np.random.default_rng(0), global_flat=torch.zeros(flat.shape[1]),
                       global_buffers={}, lr=0.1, updates=updates)
    return state, updates


def _server_step(method, flat, sizes=None, buffers=None):
    """What the engine does: weights, the weighted average, then the method's server step; with the
    round's diagnostics."""
    from fedlib.population import aggregate

    state, updates = _state(flat, sizes, buffers)
    weights = method.weigh(state, updates)
    avg, avg_buffers = aggregate(updates.flat, weights, updates.buffers)
    new_flat, new_buffers = method.server_update(state, weights, avg, avg_buffers)
    return weights, new_flat, new_buffers, method.diagnostics(state)


# ----------------------------------------------------------------------------- median


def test_median_of_an_odd_number_is_the_middle_value_and_credits_its_owner():
    values = torch.tensor([[1.0, 50.0], [3.0, -2.0], [2.0, 7.0]])
    median, credit = coordinate_median(values)
    assert median.tolist() == [2.0, 7.0]  # both medians come from row 2
    assert credit.tolist() == [0.0, 0.0, 1.0]


def test_median_of_an_even_number_is_the_mean_of_the_two_middle_values():
    values = torch.tensor([[1.0, 4.0], [3.0, 1.0], [2.0, 3.0], [10.0, 2.0]])
    median, credit = coordinate_median(values)
    assert median.tolist() == [2.5, 2.5]  # (2 + 3) / 2 and (2 + 3) / 2, as np.median
    np.testing.assert_allclose(median.numpy(), np.median(values.numpy(), axis=0))
    # coordinate 0: rows 2 and 1 (half each); coordinate 1: rows 3 and 2
    assert credit.tolist() == pytest.approx([0.0, 0.25, 0.5, 0.25])


def test_fedmedian_sets_the_global_model_to_the_median_and_its_weights_sum_to_one():
    torch.manual_seed(0)
    flat = torch.randn(7, 30)
    flat[5:] = 1e3  # two hostile rows far away
    bn = {"running_mean": torch.arange(7.0).unsqueeze(1).repeat(1, 3), "num_batches_tracked": torch.arange(7)}
    weights, new_flat, new_buffers, _ = _server_step(build_method("fedmedian"), flat, buffers=bn)
    np.testing.assert_allclose(new_flat.numpy(), np.median(flat.numpy(), axis=0), rtol=0, atol=0)
    assert new_flat.abs().max() < 10  # the hostile rows moved nothing beyond the benign range
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-6) and float(weights[5:].sum()) == 0.0
    assert new_buffers["running_mean"].tolist() == [3.0, 3.0, 3.0]  # median of 0..6
    assert int(new_buffers["num_batches_tracked"]) == 6  # integer buffers: the engine's maximum


# ----------------------------------------------------------------------------- trimmed mean


def test_trimmed_mean_cuts_floor_beta_n_from_each_end_of_every_coordinate():
    values = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [100.0, -100.0], [4.0, 40.0]])
    mean, credit = trimmed_mean(values, 1)
    assert mean.tolist() == [3.0, 20.0]  # (2+3+4)/3 and (10+20+30)/3
    from scipy.stats import trim_mean

    np.testing.assert_allclose(mean.numpy(), trim_mean(values.numpy(), 0.2, axis=0), rtol=1e-6)
    # kept: coordinate 0 rows 1, 2, 4; coordinate 1 rows 0, 1, 2 -> 6 kept values
    assert credit.tolist() == pytest.approx([1 / 6, 2 / 6, 2 / 6, 0.0, 1 / 6])
    with pytest.raises(ValueError, match="cutting 2 from each end leaves nothing of 4 values"):
        trimmed_mean(values[:4], 2)


def test_fedtrimmedavg_beta_zero_is_the_uniform_mean_and_beta_cuts_as_flower():
    torch.manual_seed(1)
    flat = torch.randn(5, 12)
    weights, new_flat, _, _ = _server_step(build_method("fedtrimmedavg", {"beta": 0.0}), flat, sizes=[1, 2, 3, 4, 5])
    torch.testing.assert_close(new_flat, flat.mean(0))  # sample counts ignored
    assert weights.tolist() == pytest.approx([0.2] * 5)
    method = build_method("fedtrimmedavg")  # beta = 0.2: floor(0.2 * 5) = 1 from each end
    weights, new_flat, _, diagnostics = _server_step(method, flat)
    expected = flat.sort(0).values[1:4].mean(0)
    torch.testing.assert_close(new_flat, expected)
    assert diagnostics == {"cut_each_end": 1} and float(weights.sum()) == pytest.approx(1.0, abs=1e-6)
    assert build_method("fedtrimmedavg", {"beta": 0.49}).cut(2) == 0  # never cuts everything


# ----------------------------------------------------------------------------- Krum


def test_krum_scores_sum_the_n_minus_f_minus_2_nearest_squared_distances():
    points = torch.tensor([[0.0], [1.0], [2.0], [10.0]])
    # f = 0: m = 2 nearest: 0 -> 1 + 4, 1 -> 1 + 1, 2 -> 1 + 4, 10 -> 64 + 81
    assert krum_scores(points, 0).tolist() == pytest.approx([5.0, 2.0, 5.0, 145.0])
    # f = 1: m = max(1, 4 - 1 - 2) = 1
    assert krum_scores(points, 1).tolist() == pytest.approx([1.0, 1.0, 1.0, 64.0])
    # f too large for n: still one neighbour (Flower's max(1, ...))
    assert krum_scores(points, 9).tolist() == pytest.approx([1.0, 1.0, 1.0, 64.0])
    assert krum_scores(points[:1], 0).tolist() == [0.0]


def test_krum_picks_the_lowest_score_and_multi_krum_averages_the_k_lowest_by_sample_count():
    points = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [10.0, 0.0]])
    weights, new_flat, _, _ = _server_step(build_method("krum"), points)
    assert weights.tolist() == [0.0, 1.0, 0.0, 0.0] and new_flat.tolist() == [1.0, 0.0]
    # ties (scores 1, 1, 1 with f = 1) go to the lower client id
    weights, _, _, _ = _server_step(build_method("krum", {"num_malicious_clients": 1}), points)
    assert weights.tolist() == [1.0, 0.0, 0.0, 0.0]
    multi = build_method("krum", {"num_clients_to_keep": 2})  # scores 5, 2, 5, 145: rows 1 and 0
    weights, new_flat, _, diagnostics = _server_step(multi, points, sizes=[30, 10, 5, 5])
    assert weights.tolist() == pytest.approx([0.75, 0.25, 0.0, 0.0])
    assert new_flat.tolist() == pytest.approx([0.25, 0.0])
    assert diagnostics["kept"] == [0, 1] and diagnostics["krum_scores"] == pytest.approx([5.0, 2.0, 5.0, 145.0])
    # more to keep than uploads: refused in one line (Flower would silently average them all)
    with pytest.raises(ValueError) as err:
        _server_step(build_method("krum", {"num_clients_to_keep": 9}), points[:2], sizes=[1, 3])
    assert str(err.value) == "method 'krum': round 1 received 2 upload(s), fewer than num_clients_to_keep = 9"


def test_multi_krum_refuses_to_keep_more_than_a_round_samples():
    cfg = make_config(dataset="synthetic", n_clients=6, clients_per_round=3, rounds=1,
                      method={"name": "krum", "num_clients_to_keep": 4})
    with pytest.raises(ValueError) as err:
        fedlib.run(cfg, cache=False, progress=False)
    assert "num_clients_to_keep must be <= the 3 clients per round (got 4)" in str(err.value)
    assert "\n" not in str(err.value)


def test_krum_picks_identical_uploads_as_flower_does():
    """Finding (issue 43): two free-riders' identical uploads (w_g = 0) are each other's nearest
    neighbours at distance 0. f = 1, m = max(1, 5 - 1 - 2) = 2 nearest. Honest rows close together
    (1, 1.2, 1.4) score 0.04 + 0.16 = 0.2, 0.04 + 0.04 = 0.08, 0.2 and win against the pair's 0 + 1 = 1;
    spread wider (1, 2, 3: scores 2, 2, 5), the pair wins and the model stays where it was."""
    close = torch.tensor([[0.0], [0.0], [1.0], [1.2], [1.4]])
    assert krum_scores(close, 1).tolist() == pytest.approx([1.0, 1.0, 0.2, 0.08, 0.2], abs=1e-6)
    spread = torch.tensor([[0.0], [0.0], [1.0], [2.0], [3.0]])  # scores 1, 1, 2, 2, 5
    assert krum_scores(spread, 1).tolist() == pytest.approx([1.0, 1.0, 2.0, 2.0, 5.0])
    weights, new_flat, _, _ = _server_step(build_method("krum", {"num_malicious_clients": 1}), spread)
    assert weights.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0] and new_flat.tolist() == [0.0]  # the model stays


@pytest.mark.parametrize("name, params, text", [
    ("fedtrimmedavg", {"beta": 0.5}, "method 'fedtrimmedavg': beta must be in [0, 0.5) (got 0.5)"),
    ("fedtrimmedavg", {"beta": -0.1}, "method 'fedtrimmedavg': beta must be in [0, 0.5) (got -0.1)"),
    ("krum", {"num_malicious_clients": -1}, "method 'krum': num_malicious_clients must be an integer >= 0 (got -1)"),
    ("krum", {"num_malicious_clients": 1.5}, "method 'krum': num_malicious_clients must be an integer >= 0 (got 1.5)"),
    ("krum", {"num_clients_to_keep": -2}, "method 'krum': num_clients_to_keep must be an integer >= 0 (got -2)"),
    ("fedmedian", {"beta": 0.1}, "method 'fedmedian': unknown hyper-parameter 'beta'; allowed: none"),
])
def test_bad_hyperparameters_give_one_line(name, params, text):
    with pytest.raises(ValueError) as err:
        build_method(name, params)
    assert str(err.value) == text


def test_krum_hyperparameters_must_fit_the_federation():
    with pytest.raises(ValueError, match=r"num_malicious_clients must be < n_clients = 4 \(got 4\)"):
        make_config(dataset="synthetic", n_clients=4, method={"name": "krum", "num_malicious_clients": 4})
    with pytest.raises(ValueError, match=r"num_clients_to_keep must be <= n_clients = 4 \(got 5\)"):
        make_config(dataset="synthetic", n_clients=4, method={"name": "krum", "num_clients_to_keep": 5})


def test_robust_methods_resist_sign_flippers_where_fedavg_does_not():
    """6 clients, 2 of them send 2 w_g - w (sign-flipped updates) every round: FedAvg's average
    moves against the benign direction, the robust rules keep to it."""
    base = dict(dataset="synthetic", n_clients=6, rounds=6, batch_size=16, lr=0.1, seed=2,
                split={"name": "iid", "sign_flips": 2})
    accuracy = {}
    for name, params in [("fedavg", {}), ("fedmedian", {}), ("fedtrimmedavg", {"beta": 0.34}),
                         ("krum", {"num_malicious_clients": 2, "num_clients_to_keep": 4})]:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            r = fedlib.run(make_config(base, method={"name": name, **params}), cache=False, progress=False)
        accuracy[name] = r.final["accuracy"]
        if name == "krum":
            flippers = [i for i, role in enumerate(r.meta["client_roles"]) if role == "sign_flip"]
            assert all(h["weights"][i] == 0 for h in r.history for i in flippers)  # never kept
    clean = fedlib.run(make_config(base, split={"name": "iid"}, method={"name": "fedavg"}), cache=False,
                       progress=False).final["accuracy"]
    for name in ("fedmedian", "fedtrimmedavg", "krum"):
        assert accuracy[name] > accuracy["fedavg"] + 0.05, accuracy
    # multi-Krum drops the flippers and averages the 4 benign uploads: close to the clean run; the
    # coordinate-wise rules keep the flippers' pull on every coordinate (a smaller, slower step)
    assert accuracy["krum"] > clean - 0.1, (accuracy, clean)


def test_blocks_of_columns_give_the_same_numbers(monkeypatch):
    """Large models are sorted a block of parameters at a time: same medians, means and credits."""
    import fedlib.methods.robust as robust

    torch.manual_seed(3)
    values = torch.randn(6, 40, 3)
    whole = [coordinate_median(values), trimmed_mean(values, 2)]
    monkeypatch.setattr(robust, "BLOCK", 6 * 7)  # 7 columns a block, the last one short
    for (stat, credit), (stat_b, credit_b) in zip(whole, [coordinate_median(values), trimmed_mean(values, 2)]):
        assert torch.equal(stat, stat_b) and torch.allclose(credit, credit_b, rtol=0, atol=1e-12)
        assert float(credit.sum()) == pytest.approx(1.0, abs=1e-12)


def test_two_contested_rounds_of_a_short_run_are_no_warning():
    """A 2-round run whose label skew sets two clients against the median in both rounds (the CELM
    smoke page's CIFAR-10 Dir(0.05)) does not warn; three contested rounds of three do."""
    from fedlib.screening import MIN_CONTESTED, PoisoningMonitor

    monitor = PoisoningMonitor()
    monitor.rounds, monitor.contested = 2, {0: [0, 1], 1: [0, 1]}
    assert MIN_CONTESTED == 3 and monitor.report() is None
    monitor.rounds, monitor.contested = 3, {0: [0, 1], 1: [0, 1], 2: [0, 1]}
    assert monitor.report()["clients"] == [0, 1]
