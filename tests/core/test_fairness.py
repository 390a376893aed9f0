"""CFFL: the reputation update against a loop of the authors' formula, validation scoring, runs."""

import math

import numpy as np
import pytest
import torch

import fedlib
from fedlib.methods import ClientState, ClientUpdates, Federation, RoundState, build_method
from fedlib.models import build_model
from fedlib.population import ParamLayout

N, C = 4, 5


def _federation(clients_per_round=N):
    """A tiny MLP (the 'teacher') and a validation set labelled by the teacher's predictions; the
    teacher's logits are standardised per class on that set, so its labels use every class."""
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), C)
    x_val = torch.randn(300, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(x_val)
        mean, std = logits.mean(0), logits.std(0)
        model.head.weight.div_(std[:, None])
        model.head.bias.sub_(mean).div_(std)
        y_val = model(x_val).argmax(1)
    return Federation(model=model, n_clients=N, n_classes=C, rounds=3, clients_per_round=clients_per_round,
                      client_sizes=np.full(N, 10), device=torch.device("cpu"), x_val=x_val, y_val=y_val)


def _state(t, global_flat):
    return RoundState(round=t, rng=np.random.default_rng(t), global_flat=global_flat, global_buffers={}, lr=0.1)


def _updates(clients, flat):
    return ClientUpdates(clients=np.asarray(clients), flat=flat, buffers={}, sizes=np.full(len(clients), 10))


def reference(vaccs, alpha=5.0, fade=0.8, coef=1 / 3):
    """compute_reputations_sinh of the authors' code, full participation, one loop step per client."""
    r, reputable, threshold, out = [0.0] * N, list(range(N)), coef / N, []
    for vacc in vaccs:
        total = sum(vacc[i] for i in reputable)
        for i in reputable:
            r[i] = fade * r[i] + (1 - fade) * vacc[i] / total
        r = [math.sinh(alpha * x) for x in r]
        r = [x / sum(r) for x in r]
        kept = [i for i in reputable if r[i] >= threshold]
        r = [x if i in kept else 0.0 for i, x in enumerate(r)]
        if len(kept) != len(reputable):
            r = [x / sum(r) for x in r]
            threshold = coef / len(kept)
        reputable = kept
        out.append((list(r), list(reputable)))
    return out


def test_reputation_update_matches_the_authors_formula():
    vaccs = [[0.90, 0.85, 0.80, 0.30], [0.92, 0.86, 0.82, 0.20], [0.93, 0.40, 0.85, 0.10], [0.95, 0.3, 0.9, 0.1]]
    method = build_method("cffl", {"fade": 0.3})
    method.setup(_federation())
    expected = reference(vaccs, fade=0.3)
    for vacc, (r_ref, reputable_ref) in zip(vaccs, expected):
        clients = method.select_clients(_state(0, None))
        method.update_reputation(torch.as_tensor(clients), torch.tensor(vacc, dtype=torch.float64)[clients])
        assert method.scores() == pytest.approx(r_ref, abs=1e-12)
        assert np.flatnonzero(method.reputable.numpy()).tolist() == reputable_ref
    assert expected[-1][1] == [0, 2]  # two clients were removed along the way
    assert method.select_clients(_state(0, None)).tolist() == [0, 2]


def test_a_random_upload_gets_a_lower_reputation_and_is_removed():
    fed = _federation()
    layout = ParamLayout(fed.model)
    teacher = layout.flat_of(fed.model)
    torch.manual_seed(5)
    flat = torch.stack([teacher, teacher, teacher, layout.flat_of(build_model("mlp", (1, 4, 4), C))])
    # full uploads judged as they are (clip off, θ = 1) and a constant α, to isolate the reputation rule
    method = build_method("cffl", {"clip": 0.0, "theta": 1.0, "alpha_growth": False})
    method.setup(fed)
    method.update_reputation(torch.arange(N), torch.tensor([1.0, 1.0, 1.0, 0.9], dtype=torch.float64))
    r = method.scores()
    assert 0 < r[3] < r[:3].min()  # slightly worse: lower reputation, still reputable
    method.setup(fed)
    for t in range(2):
        clients = method.select_clients(_state(t, teacher))
        state = _state(t, teacher)
        w = method.weigh(state, _updates(clients, flat[clients]))
        assert torch.isfinite(w).all() and float(w.sum()) == pytest.approx(1.0, abs=1e-6)
        r = method.scores()
        assert r[3] == 0 and r[:3] == pytest.approx([1 / 3] * 3)  # chance accuracy: removed at once
        assert w.tolist() == pytest.approx([1 / 3] * 3 + [0.0] * (len(clients) - 3))
        assert method.diagnostics(state)["removed"] == ([3] if t == 0 else [])
    assert not method.reputable[3] and clients.tolist() == [0, 1, 2]
    assert method.removed_round.tolist() == [-1, -1, -1, 0]


def test_partial_participation_samples_the_reputable_set_and_keeps_the_others():
    method = build_method("cffl")
    method.setup(_federation(clients_per_round=2))
    method.update_reputation(torch.tensor([0, 1]), torch.tensor([0.9, 0.8], dtype=torch.float64))
    r = method.scores()
    assert r[2:].tolist() == [0.0, 0.0] and r[:2].sum() == pytest.approx(0.5)  # the two held 2/4 of the mass
    method.reputable[1] = False
    picks = {tuple(method.select_clients(_state(t, None))) for t in range(20)}
    assert all(len(p) == 2 and 1 not in p for p in picks) and len(picks) > 1


@pytest.mark.parametrize("case", ["all_zero", "one_huge"])
def test_weights_stay_on_the_simplex_for_degenerate_updates(case):
    fed = _federation()
    layout = ParamLayout(fed.model)
    global_flat = layout.flat_of(fed.model)
    flat = global_flat + 0.01 * torch.randn(N, layout.size, generator=torch.Generator().manual_seed(2))
    if case == "all_zero":
        flat = global_flat.expand(N, -1).clone()
    else:
        flat[0] = global_flat + 1e6 * (flat[0] - global_flat)
    method = build_method("cffl")
    method.setup(fed)
    for t in range(2):
        w = method.weigh(_state(t, global_flat), _updates(np.arange(N), flat))
        assert torch.isfinite(w).all() and (w >= 0).all() and float(w.sum()) == pytest.approx(1.0, abs=1e-6)
        assert np.isfinite(method.scores()).all()
    if case == "all_zero":
        assert w.tolist() == pytest.approx([1 / N] * N)


def test_cffl_clip_and_upload_share_by_hand():
    """clip_gradient_update (±0.01) then mask_grad_update_by_order(mode='all') with θ = 0.5:
        Δ = (0.3, -0.02, 0.005, -0.5) -> c = (0.01, -0.01, 0.005, -0.01)
        k = int(4 · 0.5) = 2, the 2nd largest |c| is 0.01, entries below it are zeroed:
        f = (0.01, -0.01, 0, -0.01)   (ties are kept, as in their '< topk[-1]' mask)"""
    from fedlib.methods.fairness import top_share

    c = torch.tensor([[0.3, -0.02, 0.005, -0.5]]).clamp(-0.01, 0.01)
    assert c[0].tolist() == pytest.approx([0.01, -0.01, 0.005, -0.01])
    assert top_share(c, 0.5)[0].tolist() == pytest.approx([0.01, -0.01, 0.0, -0.01])
    assert top_share(c, 0.1).tolist() == [[0.0] * 4]  # int(0.4) = 0 entries


def test_cffl_reputation_growth_and_removal_by_hand():
    """compute_reputations_sinh with fade 0.8 and α_t = 5 (1 + t/T), T = 4, three clients:
    round 0, vacc = (0.8, 0.6, 0.2): r̃ = (0.5, 0.375, 0.125), r = 0.2 r̃ = (0.1, 0.075, 0.025),
        sinh(5 r) = (0.521095, 0.383852, 0.125326) -> r = (0.5057841, 0.3725725, 0.1216434);
        threshold 1/(3·3) = 0.1111: nobody removed.
    round 1, α = 6.25, vacc = (0.8, 0.6, 0.1): r̃ = (0.533333, 0.4, 0.066667),
        r = 0.8 r + 0.2 r̃ = (0.5112940, 0.3780580, 0.1106480),
        sinh(6.25 r) normalised = (0.6697543, 0.2891542, 0.0410915): client 2 < 0.1111 is removed,
        the others renormalised: (0.6984549, 0.3015451), threshold 1/(3·2)."""
    fed = _federation()
    fed.n_clients, fed.rounds = 3, 4
    method = build_method("cffl")
    method.setup(fed)
    method.update_reputation(torch.arange(3), torch.tensor([0.8, 0.6, 0.2], dtype=torch.float64), alpha=5.0)
    assert method.scores().tolist() == pytest.approx([0.5057841, 0.3725725, 0.1216434], abs=1e-6)
    method.update_reputation(torch.arange(3), torch.tensor([0.8, 0.6, 0.1], dtype=torch.float64),
                             alpha=5.0 * (1 + 1 / 4))
    assert method.scores().tolist() == pytest.approx([0.6984549, 0.3015451, 0.0], abs=1e-6)
    assert method.reputable.tolist() == [True, True, False]


@pytest.mark.parametrize("params,removed", [
    ({}, True),  # other splits: 1/(3 |R|) = 0.1111 > 0.0644, removed
    ({"split_kind": "label_imbalance"}, False),  # their 'classimbalance': 1/(6 |R|) = 0.0556 < 0.0644, kept
    ({"split_kind": "label_imbalance", "threshold": 0.9}, False),  # theirs ignores the coefficient there
    ({"threshold": 0.0}, False),  # removal off
])
def test_cffl_threshold_follows_the_split_kind_by_hand(params, removed):
    """compute_reputation_threshold (Federated_Learner.py lines 856-860): round 0, three clients,
    vacc = (0.8, 0.6, 0.1): r̃ = (0.533333, 0.4, 0.066667), r = 0.2 r̃ = (0.106667, 0.08, 0.013333),
    sinh(5 r) = (0.558979, 0.410752, 0.066716), normalised (0.5393223, 0.3963078, 0.0643699).
    Removed: the others renormalised to (0.5764268, 0.4235732)."""
    fed = _federation()
    fed.n_clients, fed.rounds = 3, 4
    method = build_method("cffl", params)
    method.setup(fed)
    method.update_reputation(torch.arange(3), torch.tensor([0.8, 0.6, 0.1], dtype=torch.float64), alpha=5.0)
    expected = [0.5764268, 0.4235732, 0.0] if removed else [0.5393223, 0.3963078, 0.0643699]
    assert method.scores().tolist() == pytest.approx(expected, abs=1e-6)
    assert method.reputable.tolist() == [True, True, not removed]
    assert method.coefficient == pytest.approx({"label_imbalance": 1 / 6}.get(params.get("split_kind"),
                                                                              params.get("threshold", 1 / 3)))


def test_cffl_sum_step_and_downloads_by_hand():
    """'sum' aggregation (Federated_Learner.py 460-479): θ_g <- θ_g + Σ_R f_i; 'topk' download
    (503-563) of int(r_i / max r · n_i / max n · P) entries of the aggregate: with the aggregate
    (0.4, -0.1, 0.3, 0) and counts (2, 1), client A gets (0.4, 0, 0.3, 0), client B (0.4, 0, 0, 0)."""
    fed = _federation()
    method = build_method("cffl", {"download": "topk"})
    method.setup(fed)
    masks = method.download_masks(_state(0, None), torch.tensor([0.4, -0.1, 0.3, 0.0]), torch.tensor([2, 1]))
    assert masks.tolist() == [[True, False, True, False], [True, False, False, False]]
    random = build_method("cffl").download_masks(_state(0, None), torch.arange(10.0), torch.tensor([3, 7, 0]))
    assert random.sum(1).tolist() == [3, 7, 0] and (random[0] <= random[1]).all()  # nested prefixes of one order
    layout = ParamLayout(fed.model)
    global_flat = layout.flat_of(fed.model)
    delta = 0.001 * torch.randn(N, layout.size, generator=torch.Generator().manual_seed(3))
    updates = _updates(np.arange(N), global_flat + delta)
    state = _state(0, global_flat)
    state.updates = updates
    state.client_state = method.init_client_state(fed, global_flat, {})
    w = method.weigh(state, updates)
    new, _ = method.server_update(state, w, w @ updates.flat, {})
    inside = method.reputable.double()
    expected = global_flat + (inside.float().unsqueeze(1) * method.uploads(state, updates)[1]).sum(0)
    torch.testing.assert_close(new, expected)
    after = method.update_client_state(state, w, new, {})
    best = int(np.argmax(method.scores()))  # downloads the largest share: int(1 · 1 · P) = every entry
    _, upload = method.uploads(state, updates)
    torch.testing.assert_close(after.flat[best], global_flat + delta[best] - upload[best] + (new - global_flat))


@pytest.mark.parametrize("params,message", [
    ({"alpha": 0}, "alpha must be > 0"),
    ({"fade": 1.0}, r"fade must be in \[0, 1\)"),
    ({"threshold": 1.0}, r"threshold must be in \[0, 1\)"),
    ({"threshold": "a"}, "threshold must be a number"),
    ({"theta": 0}, r"theta must be in \(0, 1\]"),
    ({"aggregation": "avg"}, "aggregation must be sum, reputation_sum or mean"),
    ({"download": "all"}, "download must be random or topk"),
    ({"split_kind": "pls"}, "split_kind must be label_imbalance or other"),
])
def test_bad_hyperparameters_give_one_line_errors(params, message):
    with pytest.raises(ValueError, match=message) as info:
        build_method("cffl", params)
    assert "\n" not in str(info.value)


def test_cffl_needs_the_validation_set():
    fed = _federation()
    fed.x_val = fed.y_val = None
    with pytest.raises(ValueError, match="needs the server's validation set"):
        build_method("cffl").setup(fed)


def test_a_cffl_run_finishes_with_finite_weights():
    config = {"dataset": "synthetic", "method": "cffl", "n_clients": 4, "rounds": 2, "batch_size": 16,
              "fraction": 0.25, "server_val": 100, "test_samples": 100}
    r = fedlib.run(config, cache=False, progress=False)
    assert len(r.history) == 2 and r.final["stopped"] is None
    for h in r.history:
        assert np.isfinite(h["weights"]).all() and sum(h["weights"]) == pytest.approx(1.0, abs=1e-6)
        assert len(h["scores"]) == 4 and sum(h["scores"]) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- FLCE's baselines


def _two_clients():
    from fedlib.methods import ClientData

    fed = _federation()
    layout = ParamLayout(fed.model)
    g = torch.Generator().manual_seed(3)
    w = layout.flat_of(fed.model)
    flat = w + 0.1 * torch.randn(2, layout.size, generator=g)
    x = fed.x_val[:40]
    y = fed.y_val[:40]
    data = ClientData(x, y, [np.arange(0, 15), np.arange(15, 40)], torch.Generator().manual_seed(0))
    return fed, layout, w, flat, data


def test_global_model_on_clients_matches_a_per_client_evaluation():
    from fedlib.methods.fairness import global_model_on_clients

    fed, layout, w, flat, data = _two_clients()
    loss, acc = global_model_on_clients(fed, _state(0, w), data)
    for i, ix in enumerate(data.indices):
        with torch.no_grad():
            logits = fed.model(data.x[ix])
        assert loss[i].item() == pytest.approx(torch.nn.functional.cross_entropy(logits, data.y[ix]).item(), rel=1e-5)
        assert acc[i].item() == pytest.approx((logits.argmax(1) == data.y[ix]).float().mean().item())


def test_qfedavg_step_matches_algorithm_2():
    fed, layout, w, flat, data = _two_clients()
    method = build_method("qfedavg", {"q": 2.0})
    method.setup(fed)
    state = _state(0, w)
    f = torch.tensor([0.8, 1.5])
    updates = ClientUpdates(clients=np.arange(2), flat=flat, buffers={}, sizes=np.array([15, 25]), extras={"loss": f})
    weights = method.weigh(state, updates)
    new, _ = method.server_update(state, weights, weights @ flat, {})
    big_l, q = 1 / state.lr, 2.0
    dw = big_l * (w - flat)
    delta = (f.pow(q).unsqueeze(1) * dw).sum(0)
    h = (q * f.pow(q - 1) * dw.square().sum(1) + big_l * f.pow(q)).sum()
    torch.testing.assert_close(new, w - delta / h, atol=1e-6, rtol=1e-5)


def test_fedfa_weights_and_momentum_follow_the_formula():
    fed, layout, w, flat, data = _two_clients()
    method = build_method("fedfa")
    method.setup(fed)
    acc = torch.tensor([0.2, 0.6])
    state = _state(0, w)
    updates = ClientUpdates(clients=np.array([0, 1]), flat=flat, buffers={}, sizes=np.array([15, 25]),
                            extras={"accuracy": acc})
    p = method.weigh(state, updates).double()
    a = -torch.log2(acc.double() / acc.sum() + 1e-6)
    f = -torch.log2(1 - torch.tensor([1.0, 1.0], dtype=torch.float64) / 2 + 1e-5)
    expected = 0.5 * a / a.sum() + 0.5 * f / f.sum()
    torch.testing.assert_close(p, expected / expected.sum())
    new, _ = method.server_update(state, p.float(), p.float() @ flat, {})
    mixed = p.float() @ flat
    torch.testing.assert_close(new, mixed - state.lr * 0.1 * (mixed - w))
    assert method.scores().sum() == pytest.approx(1.0)
    # dual momentum (flgo fedfa.py: c.momentum = self.gamma): local SGD momentum γ = 0.9
    from fedlib.population import LocalTraining

    base = LocalTraining(epochs=1, batch_size=8, lr=0.1)
    assert method.local_training(state, base, np.array([0, 1])).momentum == 0.9
    assert build_method("fedfa", {"client_momentum": False}).local_training(state, base, np.array([0])).momentum == 0


def test_moon_vectorized_training_equals_the_per_client_loop():
    from fedlib.population import LocalTraining, make_client_batches
    from fedlib.training import train_clients
    from fedlib.testing import train_clients_loop

    fed, _, _, _, data = _two_clients()
    method = build_method("moon", {"mu": 2.0, "out_dim": 6})
    fed.model = method.adapt_model(fed.model)  # their ModelFedCon: features -> l1 -> relu -> l2 -> head
    method.setup(fed)
    layout = ParamLayout(fed.model)
    w = layout.flat_of(fed.model)
    flat = w + 0.1 * torch.randn(2, layout.size, generator=torch.Generator().manual_seed(3))
    state = _state(0, w)
    state.client_state = method.init_client_state(fed, w, {})
    state.updates = _updates([1], flat[1:])
    state.client_state = method.update_client_state(state, None, w, {})  # client 1 trained before
    assert state.client_state.tensors["seen"].tolist() == [False, True, False, False]
    assert torch.equal(state.client_state.tensors["previous"][1], flat[1])
    cfg = method.local_training(state, LocalTraining(batch_size=8, lr=0.1), np.array([0, 1]))
    assert torch.equal(cfg.client_context["prev"][0], w) and torch.equal(cfg.client_context["prev"][1], flat[1])
    batches = make_client_batches(data.indices, 8, 1, torch.Generator().manual_seed(5))
    out, _ = train_clients(fed.model, w, {}, data.x, data.y, batches, cfg)
    ref, _ = train_clients_loop(fed.model, w, {}, data.x, data.y, batches, cfg)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_moon_projection_head_and_contrastive_term_by_hand():
    """ModelFedCon: z = l2(relu(l1(h))), logits = l3(z). Eq. 3 with cos(z, z_glob) = 1,
    cos(z, z_prev) = 0, τ = 0.5: ℓ_con = -2 + log(e^2 + e^0) = log(1 + e^-2); swapped: log(1 + e^2)."""
    fed = _federation()
    method = build_method("moon", {"mu": 1.0, "tau": 0.5, "out_dim": 3})
    model = method.adapt_model(fed.model)
    h_dim = model.base.feature_dim
    assert (model.l1.in_features, model.l1.out_features, model.l2.out_features) == (h_dim, h_dim, 3)
    assert (model.head.in_features, model.head.out_features, model.feature_dim) == (3, C, 3)
    x = torch.randn(5, 1, 4, 4)
    logits, z = model(x, return_features=True)
    torch.testing.assert_close(z, model.l2(torch.relu(model.l1(model.base.features(x)))))
    torch.testing.assert_close(logits, model.head(z))
    assert build_method("moon", {"out_dim": 0}).adapt_model(fed.model) is fed.model
    from fedlib.methods.fairness import model_contrastive_term

    z = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    z_glob = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])  # cos 1, then 0
    z_prev = torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # cos 0, then 1
    value = model_contrastive_term(z, z_glob, z_prev, 0.5)
    assert value.tolist() == pytest.approx([math.log(1 + math.exp(-2)), math.log(1 + math.exp(2))], rel=1e-5)


def _ditto(lam=0.5, scored="personal"):
    """Ditto on the tiny federation: N clients, client k holding the validation samples k, k+N, ..."""
    from fedlib.methods import ClientData

    fed = _federation()
    owners = [np.arange(k, 40, N) for k in range(N)]
    fed.client_data = lambda c: ClientData(fed.x_val, fed.y_val, [owners[i] for i in c], torch.Generator())
    method = build_method("ditto", {"lam": lam, "scored": scored})
    method.setup(fed)
    w = ParamLayout(fed.model).flat_of(fed.model)
    state = _state(0, w)
    state.client_state = method.init_client_state(fed, w, {})
    return fed, method, state, w, owners


def test_ditto_personal_models_are_a_local_phase_from_the_initial_model():
    """Alg. 1 line 6: v_k <- v_k - η(∇F_k(v_k) + λ(v_k - w^t)), v_k from w^0 (their local_models);
    the engine runs the phase on the round's batches and keeps v_k in its client state."""
    from fedlib.population import LocalTraining, make_client_batches
    from fedlib.training import train_clients
    from fedlib.testing import train_clients_loop

    fed, method, state, w, owners = _ditto()
    clients = np.array([0, 2])
    w_t = w + 0.05  # the round's global model differs from w^0: v_k still starts at w^0
    state.global_flat = w_t
    [phase] = method.local_phases(state, clients, LocalTraining(batch_size=4, lr=0.1))
    assert phase.name == "personal" and torch.equal(phase.start, w.unsqueeze(0).repeat(2, 1))
    batches = make_client_batches([owners[0], owners[2]], 4, 1, torch.Generator().manual_seed(5))
    v, _ = train_clients(fed.model, phase.start, {}, fed.x_val, fed.y_val, batches, phase.training)
    v_loop, _ = train_clients_loop(fed.model, phase.start, {}, fed.x_val, fed.y_val, batches, phase.training)
    torch.testing.assert_close(v, v_loop, atol=1e-5, rtol=1e-4)
    assert phase.training.prox_mu == 0.0 and torch.equal(phase.training.client_context[1], w_t)  # λ/2||v - w^t||²
    after = method.phase_done(state, phase, clients, v, {})
    personal = after.tensors["personal"]
    assert torch.equal(personal[[0, 2]], v) and torch.equal(personal[[1, 3]], w.unsqueeze(0).repeat(2, 1))
    assert torch.equal(state.client_state.tensors["personal"], w.unsqueeze(0).repeat(N, 1))  # never in place
    updates = ClientUpdates(clients=clients, flat=v, buffers={}, sizes=np.array([15, 25]))
    torch.testing.assert_close(method.weigh(state, updates), torch.tensor([15 / 40, 25 / 40]))


def test_ditto_scores_personal_models_as_their_test_routine_by_hand():
    """Their score: Σ_k correct_k / Σ_k test_k over each client's own test split. With one test set,
    client k's split is the test set reweighted to k's label shares p_k and clients weigh by n_k:
    accuracy = Σ_k (n_k/n) Σ_c p_k[c] acc_k[c]. Two clients, two classes, by hand:
    n = (10, 30), p_0 = (1, 0), p_1 = (0.5, 0.5), acc_0 = (0.8, 0.2), acc_1 = (0.6, 0.4)
    -> 0.25 * 0.8 + 0.75 * (0.5 * 0.6 + 0.5 * 0.4) = 0.575; class 0: (0.25*0.8 + 0.375*0.6)/0.625 = 0.68."""
    from fedlib.population import Evaluation

    fed, method, state, w, owners = _ditto()
    method.label_share = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    method.client_weight = torch.tensor([0.25, 0.75])
    confusion = torch.tensor([[[80.0, 20.0], [80.0, 20.0]], [[60.0, 40.0], [60.0, 40.0]]])  # 100 per class
    seen = {}

    class Test:
        def score(self, flat, buffers):
            seen["models"] = flat.shape[0]
            return Evaluation(confusion, torch.tensor([1.0, 3.0]))

    state.client_state = ClientState(tensors={"personal": torch.zeros(2, 3)})
    ev = method.evaluate(state, w, {}, Test())
    assert seen["models"] == 2
    assert ev.accuracy.item() == pytest.approx(0.575)
    assert ev.per_class_accuracy[0].tolist() == pytest.approx([0.68, 0.4])
    assert ev.confusion.sum().item() == pytest.approx(200.0) and ev.loss.item() == pytest.approx(2.5)
    assert _ditto(scored="global")[1].evaluate(state, w, {}, Test()) is None  # the engine scores w


def test_fedsv_exact_values_are_efficient():
    """Σ_i φ_i = U(K) - U(∅) for the exact Shapley value of each round."""
    fed = _federation()
    layout = ParamLayout(fed.model)
    method = build_method("fedsv", {"exact": True})
    method.setup(fed)
    g = torch.Generator().manual_seed(2)
    w = layout.flat_of(fed.model)
    flat = w + 0.5 * torch.randn(3, layout.size, generator=g)
    updates = ClientUpdates(clients=np.array([0, 1, 3]), flat=flat, buffers={}, sizes=np.array([10, 20, 30]))
    weights = method.weigh(_state(0, w), updates)
    torch.testing.assert_close(weights, torch.tensor([1 / 6, 2 / 6, 3 / 6]))
    from fedlib.population import evaluate

    full = evaluate(fed.model, (weights @ flat).unsqueeze(0), {}, fed.x_val, fed.y_val, C).accuracy[0]
    empty = evaluate(fed.model, w.unsqueeze(0), {}, fed.x_val, fed.y_val, C).accuracy[0]
    assert method.total.sum().item() == pytest.approx((full - empty).item(), abs=1e-5)
    assert method.total[2] == 0


@pytest.mark.parametrize("name,params,message", [
    ("qfedavg", {"q": -1}, "q must be >= 0"), ("fedfa", {"beta": 2}, "beta must be in"),
    ("ditto", {"lam": -1}, "lam must be >= 0"), ("ditto", {"scored": "best"}, "scored must be"), ("moon", {"tau": 0}, "tau must be > 0"),
    ("fedsv", {"permutations": 0}, "permutations must be"),
])
def test_flce_baselines_bad_hyperparameters(name, params, message):
    with pytest.raises(ValueError, match=message) as info:
        build_method(name, params)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["qfedavg", "fedfa", "ditto", "moon"])
def test_flce_baseline_runs_finish(name):
    config = {"dataset": "synthetic", "method": name, "n_clients": 4, "clients_per_round": 2, "rounds": 2,
              "batch_size": 16, "fraction": 0.25, "test_samples": 100}
    r = fedlib.run(config, cache=False, progress=False)
    assert len(r.history) == 2 and r.final["stopped"] is None and np.isfinite(r.final["accuracy"])


def _fake_run(method, history, counts):
    from fedlib.run import RunResult

    return RunResult(config={"method": {"name": method}}, history=history,
                     final={"accuracy": 0.5, "balanced_accuracy": 0.5},
                     meta={"client_sizes": [int(sum(r)) for r in counts], "client_class_counts": counts,
                           "client_roles": ["benign"] * len(counts)})


def test_celm_page_reads_cffl_removals_and_cgsv_concentration_from_the_history():
    from fedlib.app.chapters.celm.analysis import diagnose_baseline, removal_rounds

    counts = [[5, 0, 0], [0, 5, 0], [3, 3, 3]]
    # recorded diagnostics (new runs): client 1 removed in round index 1 -> "after round 2"
    history = [{"round": 0, "selected": [0, 1, 2], "diagnostics": {"removed": []}},
               {"round": 1, "selected": [0, 1, 2], "diagnostics": {"removed": [1]}},
               {"round": 2, "selected": [0, 2], "diagnostics": {"removed": []}}]
    assert removal_rounds(_fake_run("cffl", history, counts)) == [None, 2, None]
    # older runs without diagnostics: the last round a client was selected
    bare = [{k: v for k, v in h.items() if k != "diagnostics"} for h in history]
    assert removal_rounds(_fake_run("cffl", bare, counts)) == [None, 2, None]
    text, table = diagnose_baseline(_fake_run("cffl", history, counts), "cffl")
    assert "removed 1 of 3" in text and "no class was lost" in text  # class 1 is also held by client 2
    assert table["removed after round"].tolist() == ["—", 2, "—"]
    scores = [{"round": t, "selected": [0, 1, 2], "scores": s}
              for t, s in enumerate([[0.4, 0.3, 0.3], [0.6, 0.2, 0.2], [0.8, 0.1, 0.1]])]
    text, table = diagnose_baseline(_fake_run("cgsv", scores, counts), "cgsv")
    # 1 / (0.8² + 0.1² + 0.1²) = 1 / 0.66 = 1.5; first round above one half: round 2
    assert "client 0 holds 0.80" in text and "effective number of clients 1.5 of 3" in text and "round 2" in text


def _label_imbalance_federation(split_kind="label_imbalance", **params):
    """Four clients holding 1, 2, 3 and 4 of the C = 5 classes, with 40, 10, 20 and 10 samples (so sizing by
    classes and by samples differ), reputations r = (0.5, 0.25, 0.125, 0.125): r / max r = (1, 0.5, 0.25, 0.25)."""
    from fedlib.methods import ClientData

    fed = _federation()
    classes = [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]]
    sizes = [40, 10, 20, 10]
    y = torch.cat([torch.tensor(held * n)[:n] for held, n in zip(classes, sizes)])
    bounds = np.cumsum([0] + sizes)
    indices = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    x = torch.zeros(len(y), 1, 4, 4)
    fed.client_sizes = np.asarray(sizes)
    fed.client_data = lambda c: ClientData(x, y, [indices[i] for i in c], torch.Generator().manual_seed(0))
    method = build_method("cffl", {"split_kind": split_kind, **params})
    method.setup(fed)
    method.reputation = torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64)
    method.seen[:] = True
    return fed, method


@pytest.mark.parametrize("split_kind,counts", [
    # their lines 549-554: int(r_i / max r · c_i / C · P), c = (1, 2, 3, 4), C = 5, P = 45,829 (the tiny MLP:
    # 16·256 + 256 + 256·128 + 128 + 128·64 + 64 + 64·5 + 5): 1 · 0.2 · P = 9165.8, 0.5 · 0.4 · P = 9165.8,
    # 0.25 · 0.6 · P = 6874.35, 0.25 · 0.8 · P = 9165.8
    ("label_imbalance", [9165, 9165, 6874, 9165]),
    # other splits: int(r_i / max r · n_i / max n · P), n / max n = (1, 0.25, 0.5, 0.25): P, 0.125 P = 5728.625,
    # 0.125 P, 0.0625 P = 2864.3125
    ("other", [45829, 5728, 5728, 2864]),
])
def test_cffl_download_sizes_follow_the_authors_formula_by_hand(split_kind, counts):
    fed, method = _label_imbalance_federation(split_kind)
    layout = ParamLayout(fed.model)
    assert layout.size == 45829
    global_flat = layout.flat_of(fed.model)
    updates = _updates(np.arange(N), global_flat.repeat(N, 1) + 0.001)
    state = _state(0, global_flat)
    state.updates, state.client_state = updates, method.init_client_state(fed, global_flat, {})
    seen, masks = [], method.download_masks
    method.download_masks = lambda s, aggregate, c: (seen.append(c.tolist()), masks(s, aggregate, c))[1]
    method.update_client_state(state, None, global_flat + 0.01, {})
    assert seen == [counts]


def test_cffl_mean_aggregation_on_label_imbalance_weighs_by_classes_held_by_hand():
    """'mean' (their lines 467-474 and 509-514): the step weighs upload i by c_i / C = (0.2, 0.4, 0.6, 0.8) and
    client i takes back b_i = c_i / max c = (0.25, 0.5, 0.75, 1) of its own upload; other splits n_i / Σ n =
    (0.5, 0.125, 0.25, 0.125) and n_i / max n = (1, 0.25, 0.5, 0.25)."""
    _, method = _label_imbalance_federation(aggregation="mean")
    clients = torch.arange(N)
    assert method.classes_held().tolist() == [1, 2, 3, 4]
    assert method.step_weights(clients).tolist() == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert method.own_share().tolist() == [0.25, 0.5, 0.75, 1.0]
    _, other = _label_imbalance_federation("other", aggregation="mean")
    assert other.step_weights(clients).tolist() == [0.5, 0.125, 0.25, 0.125]
    assert other.own_share().tolist() == [1.0, 0.25, 0.5, 0.25]


def test_cffl_on_label_imbalance_needs_the_clients_labels():
    fed = _federation()
    method = build_method("cffl", {"split_kind": "label_imbalance"})
    method.setup(fed)  # the threshold alone needs no labels
    with pytest.raises(ValueError, match="needs the clients' labels") as info:
        method.download_share()
    assert "\n" not in str(info.value)


def test_a_label_imbalance_cffl_run_finishes():
    config = {"dataset": "synthetic", "method": {"name": "cffl", "split_kind": "label_imbalance"}, "n_clients": 4,
              "rounds": 2, "batch_size": 16, "fraction": 0.25, "server_val": 100, "test_samples": 100,
              "split": {"name": "pls"}}
    r = fedlib.run(config, cache=False, progress=False)
    assert len(r.history) == 2 and all(np.isfinite(h["weights"]).all() for h in r.history)
