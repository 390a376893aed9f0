"""Shapley estimators: closed forms of known games (per class), efficiency, Monte-Carlo and
GTG against exact values on a 6-client federation, and the batched coalition utility
against a loop oracle."""

import math

import numpy as np
import pytest
import torch

from fedlib.data import load_dataset
from fedlib.models import build_model
from fedlib.population import LocalTraining, ParamLayout, make_client_batches
from fedlib.training import train_clients
from fedlib.valuation import (
    all_coalitions,
    best_coalition,
    class_difficulty,
    coalition_utility,
    exact_shapley,
    gtg_shapley,
    leave_one_out,
    monte_carlo_shapley,
    mr_shapley,
    tmr_shapley,
)

SHAPE = (1, 8, 8)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ----------------------------------------------------------------------------- toy games


class Game:
    """A utility from a Python function of coalitions, one column per class; counts calls."""

    def __init__(self, *columns):
        self.columns = columns
        self.asked = 0

    def __call__(self, coalitions):
        self.asked += len(coalitions)
        rows = [[f(set(np.flatnonzero(q.numpy()).tolist())) for f in self.columns] for q in coalitions]
        return torch.tensor(rows, dtype=torch.float64)


def additive(a):
    return lambda q: sum(a[i] for i in q)


def glove(left, right):
    return lambda q: float(min(len(q & left), len(q & right)))


def weighted_majority(quota, weights):
    return lambda q: float(sum(weights[i] for i in q) >= quota)


def test_exact_shapley_matches_closed_forms_per_class():
    a = [0.3, -0.1, 0.5, 0.2]
    game = Game(
        additive(a),  # φ_i = a_i
        lambda q: len(q) ** 2,  # symmetric: φ_i = (f(n) - f(0)) / n = 4
        glove({0}, {1, 2}),  # one left glove, two right: φ = (2/3, 1/6, 1/6, 0)
        weighted_majority(3, [2, 1, 1, 0]),  # [3; 2, 1, 1, 0]: φ = (2/3, 1/6, 1/6, 0)
        lambda q: float(len(q) >= 3),  # majority of 4: 1/4 each
    )
    phi = exact_shapley(game, 4)
    expected = torch.tensor([a, [4.0] * 4, [2 / 3, 1 / 6, 1 / 6, 0], [2 / 3, 1 / 6, 1 / 6, 0], [0.25] * 4],
                            dtype=torch.float64).T
    torch.testing.assert_close(phi, expected)
    assert game.asked == 16  # all coalitions in one call


def test_efficiency_holds_per_class_and_scalar_utilities_work():
    rng = np.random.default_rng(0)
    table = torch.from_numpy(rng.random((2**6, 3)))  # an arbitrary game, 3 "classes"
    u = lambda s: table[(s.long() << torch.arange(6)).sum(1)]  # noqa: E731
    phi = exact_shapley(u, 6)
    torch.testing.assert_close(phi.sum(0), table[-1] - table[0])
    scalar = exact_shapley(lambda s: u(s)[:, 0], 6)
    assert scalar.shape == (6,)
    torch.testing.assert_close(scalar, phi[:, 0])
    torch.testing.assert_close(mr_shapley(u, 6), phi)
    loo = leave_one_out(u, 6)
    torch.testing.assert_close(loo[2], table[-1] - table[63 - 4])


def test_monte_carlo_and_gtg_are_exact_on_additive_games():
    a = np.array([[0.3, 0.0], [0.1, 0.2], [0.0, 0.4], [0.05, 0.05], [0.2, 0.1]])
    game = lambda s: s.double() @ torch.from_numpy(a)  # noqa: E731
    torch.testing.assert_close(monte_carlo_shapley(game, 5, 3, rng=0), torch.from_numpy(a))
    phi, info = gtg_shapley(game, 5, rng=0, eps_within=0.0, return_info=True)
    torch.testing.assert_close(phi, torch.from_numpy(a))
    assert info["converged"] and info["permutations"] == 10  # two guided iterations agree


def test_between_round_truncation_gives_zero():
    game = Game(lambda q: 0.5 + 1e-4 * len(q))  # the round changed nothing worth valuing
    assert torch.equal(gtg_shapley(game, 3, rng=0, eps_between=0.001), torch.zeros(3, 1, dtype=torch.float64))
    assert torch.equal(tmr_shapley(game, 3, eps_between=0.001), torch.zeros(3, 1, dtype=torch.float64))
    torch.testing.assert_close(tmr_shapley(game, 3, eps_between=1e-5), exact_shapley(game, 3))


def test_within_round_truncation_skips_evaluations():
    # U saturates after any one player: later marginals are truncated, not evaluated
    game = Game(lambda q: float(len(q) > 0))
    phi = gtg_shapley(game, 6, rng=0)
    torch.testing.assert_close(phi.squeeze(1), torch.full((6,), 1 / 6, dtype=torch.float64))
    assert game.asked < 2**6


def test_class_difficulty_is_a_softmax_of_errors():
    beta = class_difficulty(torch.tensor([1.0, 0.5, 0.0]), temperature=0.5)
    expected = torch.softmax(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), 0)
    torch.testing.assert_close(beta, expected)


# ----------------------------------------------------------------------------- a real federation


@pytest.fixture(scope="module")
def federation():
    """6 MLP clients trained for 2 epochs on a synthetic 4-class task; client 5 alone holds class 3."""
    ds = load_dataset("synthetic", num_classes=4, image_shape=SHAPE, n_train=720, n_test=400, seed=0, noise=1.0)
    y = ds.y_train.numpy()
    rng = np.random.default_rng(0)
    shared = rng.permutation(np.flatnonzero(y != 3))
    indices = [np.sort(part) for part in np.array_split(shared, 6)]
    indices[5] = np.sort(np.concatenate([indices[5], np.flatnonzero(y == 3)]))
    torch.manual_seed(0)
    model = build_model("mlp", SHAPE, 4)
    layout = ParamLayout(model)
    start = layout.flat_of(model)
    batches = make_client_batches(indices, 16, 5, torch.Generator().manual_seed(0))
    flat, bufs = train_clients(model, start, {}, ds.x_train, ds.y_train, batches, LocalTraining(lr=0.05))
    sizes = np.array([len(ix) for ix in indices])
    return model, layout, flat, bufs, start, ds.x_test, ds.y_test, sizes


def _utility(fed, classwise=True):
    model, layout, flat, bufs, start, x, y, sizes = fed
    return coalition_utility(model, flat, bufs, torch.from_numpy(sizes).float(), x, y, 4, start,
                             classwise=classwise)


def test_batched_coalitions_equal_a_loop_oracle(federation):
    model, layout, flat, bufs, start, x, y, sizes = federation
    u = _utility(federation)
    coalitions = all_coalitions(6)
    batched = u(coalitions)
    assert u.evaluations == 64
    oracle = []
    for q in coalitions:  # oracle: one model at a time, plain module forward
        members = np.flatnonzero(q.numpy())
        if len(members) == 0:
            w = start
        else:
            w = sum(float(sizes[i]) * flat[i] for i in members) / float(sizes[members].sum())
        local = layout.load_into(build_model("mlp", SHAPE, 4).eval(), w)
        with torch.no_grad():
            pred = local(x).argmax(1)
        oracle.append([float((pred[y == c] == c).float().mean()) for c in range(4)])
    torch.testing.assert_close(batched, torch.tensor(oracle, dtype=batched.dtype))
    # memoized: asking again evaluates nothing new
    again = u(coalitions.flip(0))
    assert u.evaluations == 64
    torch.testing.assert_close(again, batched.flip(0))
    plain = _utility(federation, classwise=False)(coalitions)
    counts = torch.bincount(y, minlength=4).float()
    torch.testing.assert_close(plain, batched @ (counts / counts.sum()))


def test_estimators_approach_exact_values_on_six_clients(federation):
    """Tolerance: max |φ̂ - φ| over clients and classes <= 0.025 (accuracy units) for
    Monte-Carlo with 2,000 permutations and for GTG with 1,800 guided permutations (ε_i = 0);
    with the paper's stopping rule (Eq. 11, 0.05; ~60-80 permutations here) within 0.1."""
    u = _utility(federation)
    exact = exact_shapley(u, 6)
    top = u(torch.ones(1, 6, dtype=torch.bool))[0] - u(torch.zeros(1, 6, dtype=torch.bool))[0]
    torch.testing.assert_close(exact.sum(0), top.double())  # efficiency per class
    assert exact[5, 3] > 0.3  # the class-3 owner carries class 3
    assert bool((exact[:5, 3] < 0).all())  # the others dilute it
    mc = monte_carlo_shapley(u, 6, 2000, rng=1)
    assert (mc - exact).abs().max() <= 0.025
    gtg = gtg_shapley(u, 6, rng=1, eps_within=0.0, min_iterations=300, max_iterations=300)
    assert (gtg - exact).abs().max() <= 0.025
    quick, info = gtg_shapley(u, 6, rng=1, return_info=True)
    assert info["converged"] and info["permutations"] < 200
    assert (quick - exact).abs().max() <= 0.1
    assert u.evaluations == 64  # every estimator reused the memo


def test_coreset_is_the_best_summed_class_accuracy(federation):
    u = _utility(federation)
    values = u(all_coalitions(6))
    members, v_hat = best_coalition(u, 6)
    best = int(torch.argmax(values[1:].sum(1))) + 1
    assert torch.equal(members, all_coalitions(6)[best])
    torch.testing.assert_close(v_hat, values[best].double())
    assert bool(members[5])  # the class-3 owner is in it


def test_bad_inputs_raise_one_line_errors(federation):
    u = _utility(federation)
    with pytest.raises(ValueError, match=r"coalitions must be a \[M, 6\]"):
        u(torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="permutations must be >= 1"):
        monte_carlo_shapley(u, 6, 0)
    with pytest.raises(ValueError, match="n must be in"):
        exact_shapley(u, 17)
    model, layout, flat, bufs, start, x, y, sizes = federation
    with pytest.raises(ValueError, match="weights must be 6 positive"):
        coalition_utility(model, flat, bufs, torch.zeros(6), x, y, 4, start)
    assert math.isfinite(float(exact_shapley(u, 6).sum()))


# ----------------------------------------------------------------------------- GTG as its authors' code runs it


def test_gtg_original_budget_and_rescaling_by_hand():
    """cyyever/torch_algorithm gtg_shapley_value.py on an additive game of 3 players
    a = (0.3, 0.1, -0.05), v_0 = 0.5:
    - budget: min(2^3, max(30, 3, int(0.8 · 8))) = 8 permutations, i.e. 3 iterations of 3 orders
      (the 9th > 8 stops the loop; 9 are used, as theirs finishes an outer round too);
    - every marginal of an additive game is a_i, so φ = a before rescaling;
    - gain G = v_N - v_0 = 0.35 >= 0: φ <- G φ / Σ_{φ>=0} φ = 0.35 φ / 0.4 = (0.2625, 0.0875, -0.04375)."""
    a = torch.tensor([0.3, 0.1, -0.05], dtype=torch.float64)
    game = lambda s: 0.5 + s.double() @ a  # noqa: E731
    raw, info = gtg_shapley(game, 3, rng=0, eps_within=0.0, stopping="original", return_info=True)
    torch.testing.assert_close(raw, a)
    assert info["permutations"] == 9 and not info["converged"]
    scaled = gtg_shapley(game, 3, rng=0, eps_within=0.0, stopping="original", rescale=True)
    torch.testing.assert_close(scaled, torch.tensor([0.2625, 0.0875, -0.04375], dtype=torch.float64))
    # a round that lost accuracy: a = (0.05, -0.05, -0.1), G = -0.1, Σ_{φ<0} φ = -0.15:
    # φ <- φ · (-0.1) / (-0.15) = (0.0333.., -0.0333.., -0.0666..)
    loss = lambda s: 0.5 + s.double() @ torch.tensor([0.05, -0.05, -0.1], dtype=torch.float64)  # noqa: E731
    torch.testing.assert_close(gtg_shapley(loss, 3, rng=0, eps_within=0.0, stopping="original", rescale=True),
                               torch.tensor([1 / 30, -1 / 30, -2 / 30], dtype=torch.float64))


def test_gtg_original_stops_on_the_last_ten_running_means():
    """n = 6: at least max(30, 6) = 30 permutations (5 iterations of 6); an additive game has
    constant running means, so the rule (max relative change over the last 10 <= 0.05) stops
    at the first check after 30, i.e. after 36 permutations, converged."""
    a = torch.linspace(0.05, 0.3, 6, dtype=torch.float64)
    _, info = gtg_shapley(lambda s: s.double() @ a, 6, rng=0, eps_within=0.0, stopping="original",
                          return_info=True)
    assert info["permutations"] == 36 and info["converged"]
    with pytest.raises(ValueError, match="stopping must be"):
        gtg_shapley(lambda s: s.double() @ a, 6, stopping="fast")


@pytest.mark.parametrize("average,expected", [
    # ucb_run (pringlesinghal/GreedyFed): SV_i <- ((N_i - 1) SV_i + φ_i) / N_i
    #   φ = 0.3, 0.1, 0.2 -> 0.3, (0.3 + 0.1)/2 = 0.2, (2 · 0.2 + 0.2)/3 = 0.2
    ("mean", [0.3, 0.2, 0.2]),
    # FedMS §5.1: first value φ, then 0.7 v + 0.3 φ -> 0.3, 0.21 + 0.03 = 0.24, 0.168 + 0.06 = 0.228
    ("ema", [0.3, 0.24, 0.228]),
])
def test_greedyfed_value_update_by_hand(monkeypatch, average, expected):
    from fedlib.methods import ClientUpdates, Federation, RoundState, build_method
    from fedlib.methods import shapley as module

    rounds = iter([0.3, 0.1, 0.2])
    monkeypatch.setattr(module, "gtg_shapley", lambda *a, **k: torch.tensor([next(rounds)], dtype=torch.float64))
    method = build_method("greedyfed", {"average": average})
    fed = Federation(model=build_model("mlp", (1, 2, 2), 2), n_clients=1, n_classes=2, rounds=3, clients_per_round=1,
                     client_sizes=np.ones(1), device=torch.device("cpu"), x_val=torch.zeros(1, 1, 2, 2),
                     y_val=torch.zeros(1, dtype=torch.long))
    method.setup(fed)
    monkeypatch.setattr(method, "round_utility", lambda state, updates: None)
    monkeypatch.setattr(method, "uniform_view", lambda utility: None)
    updates = ClientUpdates(clients=np.array([0]), flat=torch.zeros(1, 3), buffers={}, sizes=np.ones(1))
    values = []
    for t in range(3):
        method.weigh(RoundState(round=t, rng=np.random.default_rng(0), global_flat=torch.zeros(3),
                                    global_buffers={}, lr=0.1), updates)
        values.append(float(method.values[0]))
    assert values == pytest.approx(expected)


# ----------------------------------------------------------------------------- repeated orders (issue 30)

# A 3-player round: v_0 = 0.5, v_N = 0.9 (efficiency: the Shapley values add up to 0.4).
ROUND = {(): 0.5, (0,): 0.7, (1,): 0.6, (2,): 0.55, (0, 1): 0.8, (0, 2): 0.72, (1, 2): 0.66, (0, 1, 2): 0.9}


def _table_game(table):
    return lambda s: torch.tensor([table[tuple(np.flatnonzero(r.numpy()).tolist())] for r in s], dtype=torch.float64)


def _order_marginals(table, order):
    """Marginals by player along one order (hand rule: v(prefix + i) - v(prefix))."""
    out, prefix = [0.0] * len(order), []
    for i in order:
        out[i] = table[tuple(sorted(prefix + [i]))] - table[tuple(sorted(prefix))]
        prefix.append(i)
    return out


def test_gtg_authors_count_a_repeated_order_once():
    """cyyever/torch_algorithm gtg_shapley_value.py lines 89, 115-118: when the grand coalition is the
    best evaluated one, the values are the mean over the dict of distinct orders. Seed 2 draws 9 orders
    (budget 8, 3 iterations of 3) covering all 3! = 6, three of them twice: so their rule gives the
    exact Shapley value, by hand
      φ_0 = (0.2)/3 + (0.8 - 0.6)/6 + (0.72 - 0.55)/6 + (0.9 - 0.66)/3 = 0.208333..
      φ_1 = (0.1)/3 + (0.8 - 0.7)/6 + (0.66 - 0.55)/6 + (0.9 - 0.72)/3 = 0.128333..
      φ_2 = (0.05)/3 + (0.72 - 0.7)/6 + (0.66 - 0.6)/6 + (0.9 - 0.8)/3 = 0.063333..
    (adding up to the gain 0.4, so rescaling leaves them unchanged), while the mean over every draw
    weighs the repeated orders twice."""
    game = _table_game(ROUND)
    phi, info = gtg_shapley(game, 3, rng=2, eps_within=0.0, stopping="original", orderings="authors",
                            return_info=True)
    drawn = [tuple(o) for o in info["orderings"].tolist()]
    assert len(drawn) == 9 and len(set(drawn)) == 6 and info["distinct"]
    assert sorted(drawn.count(o) for o in set(drawn)) == [1, 1, 1, 2, 2, 2]
    by_hand = torch.tensor([0.2 / 3 + 0.2 / 6 + 0.17 / 6 + 0.24 / 3, 0.1 / 3 + 0.1 / 6 + 0.11 / 6 + 0.18 / 3,
                            0.05 / 3 + 0.02 / 6 + 0.06 / 6 + 0.1 / 3], dtype=torch.float64)
    torch.testing.assert_close(phi, by_hand)
    torch.testing.assert_close(phi, exact_shapley(game, 3))
    torch.testing.assert_close(gtg_shapley(game, 3, rng=2, eps_within=0.0, stopping="original", orderings="authors",
                                           rescale=True), by_hand)
    every_draw = torch.tensor([_order_marginals(ROUND, o) for o in drawn], dtype=torch.float64).mean(0)
    every = gtg_shapley(game, 3, rng=2, eps_within=0.0, stopping="original")  # orderings="all"
    torch.testing.assert_close(every, every_draw)
    assert (every - by_hand).abs().max() > 0.005


def test_gtg_authors_average_every_draw_when_a_smaller_coalition_is_best():
    """Their lines 119-132: when best_S is not the grand coalition (here {0, 1} scores 0.95 > 0.9), the
    full-set values average every draw, repeats included."""
    table = {**ROUND, (0, 1): 0.95}
    game = _table_game(table)
    phi, info = gtg_shapley(game, 3, rng=2, eps_within=0.0, stopping="original", orderings="authors",
                            return_info=True)
    assert not info["distinct"]
    drawn = [tuple(o) for o in info["orderings"].tolist()]
    torch.testing.assert_close(phi, torch.tensor([_order_marginals(table, o) for o in drawn],
                                                 dtype=torch.float64).mean(0))
    with pytest.raises(ValueError, match="orderings must be 'all' or 'authors'"):
        gtg_shapley(game, 3, orderings="unique")


def _greedyfed(n, k, **params):
    from fedlib.methods import Federation, build_method

    method = build_method("greedyfed", params)
    method.setup(Federation(model=build_model("mlp", (1, 2, 2), 2), n_clients=n, n_classes=2, rounds=20,
                            clients_per_round=k, client_sizes=np.ones(n), device=torch.device("cpu"),
                            x_val=torch.zeros(1, 1, 2, 2), y_val=torch.zeros(1, dtype=torch.long)))
    return method


def _round(t, seed=0):
    from fedlib.methods import RoundState

    return RoundState(round=t, rng=np.random.default_rng(seed), global_flat=torch.zeros(3), global_buffers={}, lr=0.1)


def test_greedyfed_round_n_over_k_is_uniformly_random():
    """ucb_run (pringlesinghal/GreedyFed algorithms.py): N = 6, K = 3: rounds 0 and 1 go round-robin
    (0-2, 3-5); round N/K = 2 draws K of all N uniformly (their np.random.choice over range(0, tK)
    with K(t+1) - N = K draws), whatever the values; round 3 is greedy again."""
    g = _greedyfed(6, 3)
    for t, expected in ((0, [0, 1, 2]), (1, [3, 4, 5])):
        chosen = g.select_clients(_round(t))
        assert chosen.tolist() == expected
        g.taken[chosen] += 1
    g.values = np.array([0.0, 0.0, 0.0, 5.0, 5.0, 5.0])  # greedy would take 3, 4, 5
    draws = [g.select_clients(_round(2, seed)).tolist() for seed in range(40)]
    assert draws == [sorted(np.random.default_rng(seed).choice(6, size=3, replace=False).tolist())
                     for seed in range(40)]
    assert set(np.concatenate(draws).tolist()) == set(range(6))
    assert g.select_clients(_round(3)).tolist() == [3, 4, 5]
    g7 = _greedyfed(7, 3)  # K does not divide N: round 2 takes the unseen client 6 plus two seen ones
    g7.taken[:6] = 1
    assert 6 in g7.select_clients(_round(2)).tolist()


def test_greedyfed_ucb_bonus_uses_log_t():
    """Their UCB_i = SV_i + β sqrt(log(t' + 1) / N_i) computed after round t' = t - 1 and used in round t,
    i.e. log(t). β = 1, round t = 5, client 0: SV 0, N = 1, bonus sqrt(log 5) = 1.2686; client 1:
    SV 0.65, N = 4, 0.65 + sqrt(log 5) / 2 = 1.2843 > 1.2686, so client 1 is chosen (with log(t + 1)
    = log 6 client 0 would win: 1.3386 > 0.65 + 0.6693 = 1.3193)."""
    g = _greedyfed(2, 1, ucb=1.0)
    g.taken[:] = [1, 4]
    g.values = np.array([0.0, 0.65])
    assert g.select_clients(_round(5)).tolist() == [1]
    assert np.sqrt(np.log(5)) < 0.65 + np.sqrt(np.log(5) / 4) and np.sqrt(np.log(6)) > 0.65 + np.sqrt(np.log(6) / 4)
