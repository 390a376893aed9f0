"""CGSV and ShapFed against per-client, per-class loops of their formulas; degenerate updates; runs."""

import numpy as np
import pytest
import torch

import fedlib
from fedlib.methods import ClientUpdates, Federation, RoundState, build_method
from fedlib.metrics import detection_summary
from fedlib.models import build_model
from fedlib.population import ParamLayout

N, C = 4, 3
# (selected clients) per round: full participation, then two partial rounds with a newcomer
SCHEDULE = [[0, 1, 2], [1, 2], [0, 1, 2, 3]]


def _federation():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), C)
    return Federation(model=model, n_clients=N, n_classes=C, rounds=len(SCHEDULE), clients_per_round=N,
                      client_sizes=np.full(N, 10), device=torch.device("cpu"))


def _rounds(fed, seed=1):
    """Random global models and client updates of different sizes for every round of SCHEDULE."""
    g = torch.Generator().manual_seed(seed)
    size = ParamLayout(fed.model).size
    rounds = []
    for clients in SCHEDULE:
        global_flat = torch.randn(size, generator=g)
        common = torch.randn(size, generator=g)  # a shared direction, so similarities differ
        scale = torch.rand(len(clients), 1, generator=g) * 3
        flat = global_flat + scale * (common + 1.5 * torch.randn(len(clients), size, generator=g))
        rounds.append((global_flat, np.array(clients), flat))
    return rounds


def _play(method, fed, rounds):
    method.setup(fed)
    out = []
    for t, (global_flat, clients, flat) in enumerate(rounds):
        state = RoundState(round=t, rng=np.random.default_rng(0), global_flat=global_flat, global_buffers={}, lr=0.1)
        updates = ClientUpdates(clients=clients, flat=flat, buffers={}, sizes=np.full(len(clients), 10))
        w = method.aggregate(state, updates)
        out.append((w.double(), torch.as_tensor(method.scores())))
    return out


def _simplex(values):
    positive = [max(v, 0.0) for v in values]
    total = sum(positive)
    return [v / total for v in positive] if total > 0 else [1.0 / len(values)] * len(values)


def _prior(values, seen):
    known = [v for v, s in zip(values, seen) if s]
    return sum(known) / len(known) if known else 0.0


def _cos(a, b):
    return float(a @ b / (a.norm() * b.norm()))


def cgsv_loop(rounds, alpha=0.95):
    r, seen, out = [0.0] * N, [False] * N, []
    for global_flat, clients, flat in rounds:
        prior = _prior(r, seen)
        previous = [r[i] if seen[i] else prior for i in clients]
        w = _simplex(previous)
        u = []
        for k in range(len(clients)):
            d = (flat[k] - global_flat).double()
            u.append(d / (d.norm() + 1e-7))
        u_n = sum(w[k] * u[k] for k in range(len(clients)))
        for k, i in enumerate(clients):
            r[i] = max(alpha * previous[k] + (1 - alpha) * _cos(u[k], u_n), 1e-3)
            seen[i] = True
        r = [v / sum(r) for v in r]
        out.append((torch.tensor(w, dtype=torch.float64), torch.tensor(r, dtype=torch.float64)))
    return out


def shapfed_loop(rounds, layout, mu=0.5):
    gamma, seen, out = [0.0] * N, [False] * N, []
    for global_flat, clients, flat in rounds:
        prior = _prior(gamma, seen)
        omega = _simplex([gamma[i] if seen[i] else prior for i in clients])
        rows = []
        for k in range(len(clients)):
            p = layout.unflatten((flat[k] - global_flat).double())
            rows.append([torch.cat([p["head.weight"][c], p["head.bias"][c : c + 1]]) for c in range(C)])
        for k, i in enumerate(clients):
            sigma = []
            for c in range(C):
                coalition = sum(omega[j] * rows[j][c] for j in range(len(clients)))
                sigma.append(_cos(rows[k][c], coalition))
            value = sum(sigma) / C
            gamma[i] = mu * gamma[i] + (1 - mu) * value if seen[i] else value
            seen[i] = True
        w = _simplex([gamma[i] for i in clients])
        out.append((torch.tensor(w, dtype=torch.float64), torch.tensor(gamma, dtype=torch.float64)))
    return out


def test_cgsv_matches_the_per_client_loop():
    fed = _federation()
    rounds = _rounds(fed)
    fast = _play(build_method("cgsv"), fed, rounds)
    for (w, s), (w_ref, s_ref) in zip(fast, cgsv_loop(rounds)):
        torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(s, s_ref, atol=1e-6, rtol=1e-5)
    assert fast[0][0].tolist() == pytest.approx([1 / 3] * 3)  # first round: uniform
    assert len(set(np.round(fast[-1][1].tolist(), 6))) == N  # the reputations differ


def test_shapfed_matches_the_per_client_per_class_loop():
    fed = _federation()
    rounds = _rounds(fed, seed=2)
    method = build_method("shapfed", {"mu": 0.3})
    fast = _play(method, fed, rounds)
    for (w, s), (w_ref, s_ref) in zip(fast, shapfed_loop(rounds, ParamLayout(fed.model), mu=0.3)):
        torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(s, s_ref, atol=1e-6, rtol=1e-5)
    assert method.class_values.shape == (N, C)
    torch.testing.assert_close(method.class_values.mean(1), method.gamma)  # γ = mean of the smoothed CSSVs


@pytest.mark.parametrize("name", ["cgsv", "shapfed"])
@pytest.mark.parametrize("case", ["all_zero", "one_huge", "opposed"])
def test_weights_stay_on_the_simplex_for_degenerate_updates(name, case):
    fed = _federation()
    global_flat, clients, flat = _rounds(fed)[2]
    if case == "all_zero":  # every client returns the global model
        flat = global_flat.expand_as(flat).clone()
    elif case == "one_huge":
        flat[0] = global_flat + 1e6 * (flat[0] - global_flat)
    else:  # two clients with exactly opposite updates: the aggregate is 0, so is every similarity
        global_flat = torch.zeros_like(global_flat)
        flat, clients = torch.stack([flat[0], -flat[0]]), clients[:2]
    method = build_method(name)
    method.setup(fed)
    for t in range(2):
        state = RoundState(round=t, rng=np.random.default_rng(0), global_flat=global_flat, global_buffers={}, lr=0.1)
        w = method.aggregate(state, ClientUpdates(clients=clients, flat=flat, buffers={}, sizes=np.ones(len(clients))))
        assert torch.isfinite(w).all() and (w >= 0).all() and float(w.sum()) == pytest.approx(1.0, abs=1e-6)
        assert np.isfinite(method.scores()).all() and method.scores().shape == (N,)
    if case != "one_huge":
        assert w.tolist() == pytest.approx([1 / len(clients)] * len(clients))


@pytest.mark.parametrize("name,params,message", [
    ("cgsv", {"alpha": 1.0}, r"alpha must be in \[0, 1\)"),
    ("cgsv", {"alpha": -0.1}, r"alpha must be in \[0, 1\)"),
    ("shapfed", {"mu": 1.5}, r"mu must be in \[0, 1\)"),
    ("shapfed", {"mu": "x"}, "mu must be a number"),
])
def test_bad_hyperparameters_give_one_line_errors(name, params, message):
    with pytest.raises(ValueError, match=message) as info:
        build_method(name, params)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["cgsv", "shapfed"])
def test_a_run_scores_the_free_rider_lowest(name):
    config = {"dataset": "synthetic", "method": name, "n_clients": 4, "rounds": 2, "batch_size": 16,
              "fraction": 0.25, "test_samples": 100, "split": {"name": "iid", "free_riders": 1}}
    r = fedlib.run(config, cache=False, progress=False)
    roles = np.array(r.meta["client_roles"])
    history = np.array([h["scores"] for h in r.history])
    assert history.shape == (2, 4) and np.isfinite(history).all()
    for h in r.history:
        assert np.isfinite(h["weights"]).all() and sum(h["weights"]) == pytest.approx(1.0, abs=1e-6)
    assert detection_summary(history, roles == "free_rider")["auroc"] == 1.0


# ----------------------------------------------------------------------------- FedFV


def _fedfv_loop(g, loss, alpha, history, tau):
    """FedFV's projection as written in the paper's Algorithm 1: client by client, in loss order."""
    import math

    k = g.shape[0]
    order = sorted(range(k), key=lambda i: float(loss[i]))
    keep = set(order[math.ceil((k - 1) * (1 - alpha)):]) if alpha > 0 else set()
    out = []
    for i in range(k):
        gi = g[i].clone()
        if i not in keep:
            for j in order:
                if j != i and float(gi @ g[j]) < 0:
                    gi = gi - (gi @ g[j]) / (g[j] @ g[j]) * g[j]
        out.append(gi)
    d = torch.stack(out).mean(0)
    for past in reversed(history[-tau:] if tau else []):
        if float(d @ past) < 0:
            d = d - (d @ past) / (past @ past) * past
    return d * g.mean(0).norm() / d.norm()


@pytest.mark.parametrize("alpha,tau", [(0.0, 0), (0.1, 1), (0.5, 2)])
def test_fedfv_direction_matches_the_per_client_loop(alpha, tau):
    from fedlib.methods.gradient import fair_direction

    g = torch.Generator().manual_seed(4)
    history, history_ref = [], []
    for _ in range(3):
        grads = torch.randn(6, 12, generator=g, dtype=torch.float64)
        loss = torch.rand(6, generator=g, dtype=torch.float64)
        ref = _fedfv_loop(grads, loss, alpha, history_ref, tau)
        history_ref.append(ref)
        torch.testing.assert_close(fair_direction(grads, loss, alpha, history, tau), ref)


def test_fedfv_steps_the_global_model_by_the_fair_direction():
    fed = _federation()
    method = build_method("fedfv", {"alpha": 0.0, "tau": 0})
    method.setup(fed)
    (global_flat, clients, flat) = _rounds(fed)[0]
    state = RoundState(round=0, rng=np.random.default_rng(0), global_flat=global_flat, global_buffers={}, lr=0.1)
    loss = torch.tensor([0.3, 0.1, 0.2])
    updates = ClientUpdates(clients=clients, flat=flat, buffers={}, sizes=np.full(3, 10), extras={"loss": loss})
    w = method.aggregate(state, updates)
    new, _ = method.server_update(state, w, w @ flat, {})
    expected = global_flat - _fedfv_loop(global_flat - flat, loss, 0.0, [], 0)
    torch.testing.assert_close(new, expected)


def test_fedfv_bad_hyperparameters():
    with pytest.raises(ValueError, match="alpha must be in"):
        build_method("fedfv", {"alpha": 2.0})
    with pytest.raises(ValueError, match="tau must be an integer"):
        build_method("fedfv", {"tau": -1})
