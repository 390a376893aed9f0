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
        state.updates = updates
        w = method.weigh(state, updates)
        out.append((w.double(), torch.as_tensor(method.scores())))
    return out


def _sum_normalised(values):
    total = sum(values)
    return [v / total for v in values] if total > 0 else [1.0 / len(values)] * len(values)


def _prior(values, seen):
    known = [v for v, s in zip(values, seen) if s]
    return sum(known) / len(known) if known else 0.0


def _cos(a, b):
    return float(a @ b / (a.norm() * b.norm()))


def cgsv_loop(rounds, alpha=0.95, sizes=10):
    """CGSV's main.py loop (lines 246-267), one client at a time, with our partial-participation prior."""
    r, seen, out = [0.0] * N, [False] * N, []
    for global_flat, clients, flat in rounds:
        if not any(seen):
            w = [1.0 / len(clients)] * len(clients)  # data-size weights, equal sizes
        else:
            prior = _prior(r, seen)
            w = _sum_normalised([r[i] if seen[i] else prior for i in clients])
        u = []
        for k in range(len(clients)):
            d = (flat[k] - global_flat).double()
            u.append(0.5 * d / (d.norm() + 1e-7))
        u_n = sum(w[k] * u[k] for k in range(len(clients)))
        for k, i in enumerate(clients):
            r[i] = max(alpha * r[i] + (1 - alpha) * _cos(u[k], u_n), 1e-3)
            seen[i] = True
        r = [v / sum(r) for v in r]
        out.append((torch.tensor(w, dtype=torch.float64), torch.tensor(r, dtype=torch.float64)))
    return out


def shapfed_loop(rounds, layout, mu=0.9, signal="params"):
    """ShapFed's compute_cssv + round loop (main_synthetic.py 71-111, 247-268), per client and class."""
    gamma, seen, out = [0.0] * N, [False] * N, []
    for global_flat, clients, flat in rounds:
        prior = _prior(gamma, seen)
        omega = _sum_normalised([gamma[i] if seen[i] else prior for i in clients]) if any(seen) else \
            [1.0 / len(clients)] * len(clients)
        rows = []
        for k in range(len(clients)):
            p = layout.unflatten((flat[k] if signal == "params" else flat[k] - global_flat).double())
            rows.append([torch.cat([p["head.weight"][c], p["head.bias"][c : c + 1]]) for c in range(C)])
        for k, i in enumerate(clients):
            sigma = []
            for c in range(C):
                coalition = sum(omega[j] * rows[j][c] for j in range(len(clients)))
                sigma.append(_cos(rows[k][c], coalition))
            value = sum(sigma) / C
            gamma[i] = mu * gamma[i] + (1 - mu) * value if seen[i] else value
            seen[i] = True
        w = _sum_normalised([gamma[i] for i in clients])
        out.append((torch.tensor(w, dtype=torch.float64), torch.tensor(gamma, dtype=torch.float64)))
    return out


def test_cgsv_matches_the_per_client_loop():
    fed = _federation()
    rounds = _rounds(fed)
    fast = _play(build_method("cgsv"), fed, rounds)
    for (w, s), (w_ref, s_ref) in zip(fast, cgsv_loop(rounds)):
        torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(s, s_ref, atol=1e-6, rtol=1e-5)
    assert fast[0][0].tolist() == pytest.approx([1 / 3] * 3)  # first round: data-size weights
    assert len(set(np.round(fast[-1][1].tolist(), 6))) == N  # the reputations differ


@pytest.mark.parametrize("signal", ["params", "updates"])
def test_shapfed_matches_the_per_client_per_class_loop(signal):
    fed = _federation()
    rounds = _rounds(fed, seed=2)
    method = build_method("shapfed", {"mu": 0.3, "signal": signal})
    fast = _play(method, fed, rounds)
    for (w, s), (w_ref, s_ref) in zip(fast, shapfed_loop(rounds, ParamLayout(fed.model), mu=0.3, signal=signal)):
        torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(s, s_ref, atol=1e-6, rtol=1e-5)
    assert method.class_values.shape == (N, C)
    torch.testing.assert_close(method.class_values.mean(1), method.gamma)  # γ = mean of the smoothed CSSVs


def _head_federation(n_clients):
    torch.manual_seed(0)
    model = build_model("mlp", (1, 2, 2), 2)
    return Federation(model=model, n_clients=n_clients, n_classes=2, rounds=4, clients_per_round=n_clients,
                      client_sizes=np.array([1, 1, 1][:n_clients]), device=torch.device("cpu"))


def test_shapfed_values_weights_and_broadcast_by_hand():
    """Three clients whose head rows differ only in class 1 (first two weight columns, bias 0):
        class 0: A = B = C = (1, 0);    class 1: A = B = (0, 1), C = (1, 0).
    Round 1, ω = (1/3, 1/3, 1/3), signal 'params' (main_synthetic.py compute_cssv):
        class 0: coalition (1, 0), every σ = 1
        class 1: coalition (1/3, 2/3), |.| = √5/3;  σ_A = σ_B = (2/3)/(√5/3) = 2/√5,  σ_C = 1/√5
        γ_A = γ_B = (1 + 2/√5)/2 = 0.9472136,  γ_C = (1 + 1/√5)/2 = 0.7236068
        w = γ / Σγ,  Σγ = 2.6180340:  w_A = w_B = 0.3618034,  w_C = 0.2763932
    Broadcast (line 269, κ = γ): θ_A <- (1 - 0.9472136) w_A + 0.9472136 θ_g.
    Round 2, same uploads, ω = the round-1 w: class 1 coalition (w_C, 2 w_A) = (0.2763932, 0.7236068),
        |.| = √0.6;  σ_A = 0.7236068/√0.6 = 0.9341724,  σ_C = 0.2763932/√0.6 = 0.3568221
        γ_A = 0.9 · 0.9472136 + 0.1 · (1 + 0.9341724)/2 = 0.9492009
        γ_C = 0.9 · 0.7236068 + 0.1 · (1 + 0.3568221)/2 = 0.7190872"""
    from fedlib.methods import ClientState

    fed = _head_federation(3)
    layout = ParamLayout(fed.model)
    size = layout.size
    flat = torch.zeros(3, size)
    head = layout.unflatten(flat)  # views into flat
    head["head.weight"][:, 0, 0] = 1.0
    head["head.weight"][0, 1, 1] = head["head.weight"][1, 1, 1] = 1.0
    head["head.weight"][2, 1, 0] = 1.0
    method = build_method("shapfed")
    method.setup(fed)
    global_flat = torch.zeros(size)
    client_state = method.init_client_state(fed, global_flat, {})
    expected = [([0.3618034, 0.3618034, 0.2763932], [0.9472136, 0.9472136, 0.7236068]),
                ([None] * 3, [0.9492009, 0.9492009, 0.7190872])]
    for t, (w_ref, gamma_ref) in enumerate(expected):
        updates = ClientUpdates(clients=np.arange(3), flat=flat, buffers={}, sizes=np.ones(3))
        state = RoundState(round=t, rng=np.random.default_rng(0), global_flat=global_flat, global_buffers={},
                           lr=0.1, client_state=client_state, updates=updates)
        w = method.weigh(state, updates)
        assert method.scores().tolist() == pytest.approx(gamma_ref, abs=1e-6)
        if t == 0:
            assert w.tolist() == pytest.approx(w_ref, abs=1e-6)
            new_global = w @ flat
            client_state = method.update_client_state(state, w, new_global, {})
            assert isinstance(client_state, ClientState)
            torch.testing.assert_close(client_state.flat[0], (1 - 0.9472136) * flat[0] + 0.9472136 * new_global)
            torch.testing.assert_close(client_state.flat[2], (1 - 0.7236068) * flat[2] + 0.7236068 * new_global)


def test_cgsv_server_step_reputation_and_reward_by_hand():
    """Two clients from the global model 0, updates only in the first two coordinates:
        Δ_A = (3, 4) -> u_A = Γ (0.6, 0.8);   Δ_B = (1, 0) -> u_B = Γ (1, 0);   Γ = 0.5
    Round 0 weights by data size (main.py 246-248): n = (1, 3) -> c = (0.25, 0.75)
        u_N = Γ (0.25·0.6 + 0.75, 0.25·0.8) = Γ (0.9, 0.2);   θ_g = 0 + u_N = (0.45, 0.1)
        ψ_A = (0.54 + 0.16)/√0.85 = 0.7/√0.85 = 0.7592566,   ψ_B = 0.9/√0.85 = 0.9761871
        r = 0.05 ψ -> r / Σ r = (0.7, 0.9)/1.6 = (0.4375, 0.5625)          (main.py 264-267)
        q = tanh(r) / max tanh(r) = (0.4115..., 0.5099...)/0.5099 = (0.8072692, 1)   (β = 1)"""
    fed = _head_federation(2)
    fed.client_sizes = np.array([1, 3])
    size = ParamLayout(fed.model).size
    flat = torch.zeros(2, size)
    flat[0, :2] = torch.tensor([3.0, 4.0])
    flat[1, 0] = 1.0
    method = build_method("cgsv")
    method.setup(fed)
    global_flat = torch.zeros(size)
    updates = ClientUpdates(clients=np.arange(2), flat=flat, buffers={}, sizes=np.array([1, 3]))
    state = RoundState(round=0, rng=np.random.default_rng(0), global_flat=global_flat, global_buffers={}, lr=0.1,
                       client_state=method.init_client_state(fed, global_flat, {}), updates=updates)
    w = method.weigh(state, updates)
    assert w.tolist() == pytest.approx([0.25, 0.75])
    new, _ = method.server_update(state, w, w @ flat, {})
    assert new[:2].tolist() == pytest.approx([0.45, 0.1], abs=1e-6) and float(new[2:].abs().max()) == 0
    assert method.scores().tolist() == pytest.approx([0.4375, 0.5625], abs=1e-6)
    assert method.download_shares().tolist() == pytest.approx([0.8072692, 1.0], abs=1e-6)
    # round 1: the reputations are the weights (main.py 250)
    assert method.weigh(state, updates).tolist() == pytest.approx([0.4375, 0.5625], abs=1e-6)


def test_cgsv_layerwise_download_mask_by_hand():
    """mask_grad_update_by_order(mode='layer'): per layer keep |x| >= the k-th largest,
    k = min(ceil(L q), L - 1). Layer 1 = (3, -1, 2, 0.5), layer 2 = (5, 1); q = (0.5, 1):
        layer 1: k = (2, min(4, 3) = 3): thresholds 2 and 1 -> (3, 0, 2, 0) and (3, -1, 2, 0)
        layer 2: k = (1, min(2, 1) = 1): threshold 5      -> (5, 0) for both (the L - 1 cap)"""
    from fedlib.methods.gradient import layerwise_top_share

    out = layerwise_top_share(torch.tensor([3.0, -1.0, 2.0, 0.5, 5.0, 1.0]), torch.tensor([0.5, 1.0]), [4, 2])
    assert out.tolist() == [[3.0, 0.0, 2.0, 0.0, 5.0, 0.0], [3.0, -1.0, 2.0, 0.0, 5.0, 0.0]]
    zero = layerwise_top_share(torch.tensor([3.0, -1.0]), torch.tensor([0.0]), [2])
    assert zero.tolist() == [[0.0, 0.0]]  # q = 0 downloads nothing


@pytest.mark.parametrize("name", ["cgsv", "shapfed"])
@pytest.mark.parametrize("case", ["all_zero", "one_huge", "opposed"])
def test_weights_stay_finite_and_sum_to_one_for_degenerate_updates(name, case):
    fed = _federation()
    global_flat, clients, flat = _rounds(fed)[2]
    if case == "all_zero":  # every client returns the global model
        flat = global_flat.expand_as(flat).clone()
    elif case == "one_huge":
        flat[0] = global_flat + 1e6 * (flat[0] - global_flat)
    else:  # two clients with exactly opposite models: the aggregate is 0, so is every similarity
        global_flat = torch.zeros_like(global_flat)
        flat, clients = torch.stack([flat[0], -flat[0]]), clients[:2]
    method = build_method(name)
    method.setup(fed)
    for t in range(2):
        state = RoundState(round=t, rng=np.random.default_rng(0), global_flat=global_flat, global_buffers={}, lr=0.1)
        w = method.weigh(state, ClientUpdates(clients=clients, flat=flat, buffers={}, sizes=np.ones(len(clients))))
        assert torch.isfinite(w).all() and float(w.sum()) == pytest.approx(1.0, abs=1e-6)
        assert np.isfinite(method.scores()).all() and method.scores().shape == (N,)
    if case != "one_huge":
        assert w.tolist() == pytest.approx([1 / len(clients)] * len(clients))


class _Shift(fedlib.methods.Method):
    """A probe of the engine's client state: after every round each client's model becomes
    the new global model + (client id + 1); FedAvg-uniform aggregation."""

    name = "_shift_probe"

    def init_client_state(self, fed, global_flat, global_buffers):
        from fedlib.methods import ClientState

        return ClientState.replicate(fed.n_clients, global_flat, global_buffers,
                                     offset=torch.arange(1.0, fed.n_clients + 1))

    def weigh(self, state, updates):
        self.seen_starts = getattr(self, "seen_starts", []) + [(state.global_flat.clone(), updates.start.clone(),
                                                                updates.clients.copy())]
        return torch.full((len(updates.clients),), 1.0 / len(updates.clients))

    def update_client_state(self, state, weights, global_flat, global_buffers):
        cs = state.client_state
        return type(cs)(global_flat + cs.tensors["offset"].unsqueeze(1), cs.buffers, cs.tensors)


def test_the_engine_starts_clients_from_their_client_state(monkeypatch):
    from fedlib.methods import base

    monkeypatch.setitem(base.METHODS, "_shift_probe", _Shift)
    config = {"dataset": "synthetic", "method": "_shift_probe", "n_clients": 3, "rounds": 3, "batch_size": 16,
              "fraction": 0.25, "test_samples": 50, "update_clip": None}
    from fedlib.run import _execute, prepare

    prepared = prepare(fedlib.config.make_config(config))
    _execute(prepared, progress=False)
    starts = prepared.method.seen_starts
    first_global, first_start, _ = starts[0]
    torch.testing.assert_close(first_start, first_global.expand(3, -1))  # round 1: everyone at the global model
    for (_, _, _), (global_flat, start, clients) in zip(starts, starts[1:]):
        expected = global_flat.unsqueeze(0) + torch.as_tensor(clients + 1.0, dtype=torch.float32).unsqueeze(1)
        torch.testing.assert_close(start, expected)  # round t: the state update_client_state returned


@pytest.mark.parametrize("name,params,message", [
    ("cgsv", {"alpha": 1.0}, r"alpha must be in \[0, 1\)"),
    ("cgsv", {"alpha": -0.1}, r"alpha must be in \[0, 1\)"),
    ("shapfed", {"mu": 1.5}, r"mu must be in \[0, 1\)"),
    ("shapfed", {"mu": "x"}, "mu must be a number"),
    ("shapfed", {"signal": "grads"}, "signal must be 'params' or 'updates'"),
    ("cgsv", {"gamma": 0}, "gamma must be > 0"),
    ("cgsv", {"beta": -1}, "beta must be > 0"),
])
def test_bad_hyperparameters_give_one_line_errors(name, params, message):
    with pytest.raises(ValueError, match=message) as info:
        build_method(name, params)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["cgsv", "shapfed"])
def test_a_run_scores_the_free_rider_lowest(name):
    """A free-rider returns the global model, so its update is 0 (signal 'updates'; ShapFed's
    'params' signal compares parameters, which a copy of the global model shares)."""
    method = {"name": name, "signal": "updates", "broadcast": False} if name == "shapfed" else \
        {"name": name, "download_reward": False}
    config = {"dataset": "synthetic", "method": method, "n_clients": 4, "rounds": 2, "batch_size": 16,
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
    loss = torch.tensor([0.3, 0.1, 0.2])
    updates = ClientUpdates(clients=clients, flat=flat, buffers={}, sizes=np.full(3, 10), extras={"loss": loss})
    state = RoundState(round=0, rng=np.random.default_rng(0), global_flat=global_flat, global_buffers={}, lr=0.1,
                       updates=updates)  # as the engine: the round's uploads, set before weigh
    w = method.weigh(state, updates)
    new, _ = method.server_update(state, w, w @ flat, {})
    expected = global_flat - _fedfv_loop(global_flat - flat, loss, 0.0, [], 0)
    torch.testing.assert_close(new, expected)


def test_fedfv_bad_hyperparameters():
    with pytest.raises(ValueError, match="alpha must be in"):
        build_method("fedfv", {"alpha": 2.0})
    with pytest.raises(ValueError, match="tau must be an integer"):
        build_method("fedfv", {"tau": -1})
