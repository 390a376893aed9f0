"""FLCE: the contrastive loss and the prototypes against loop oracles, the server equations
(mass, velocity, momentum on the simplex per class), the low-rank completion, the final
contributions, the ablation switches, a run, and the chapter's Table 4 arithmetic."""

import numpy as np
import pytest
import torch

import fedlib
from fedlib.config import make_config
from fedlib.methods import ClientUpdates, Federation, RoundState, build_method
from fedlib.methods.flce import (
    aggregation_weights,
    class_mass,
    class_momentum,
    class_prototypes,
    class_velocity,
    complete_contributions,
    complete_matrix,
    final_contributions,
    global_prototypes,
    supcon_loss,
)
from fedlib.models import build_model
from fedlib.population import LocalTraining, ParamLayout, make_client_batches
from fedlib.training import train_clients
from fedlib.testing import class_prototypes_loop, supcon_loss_loop, train_clients_loop


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_contrastive_loss_equals_the_loop_and_ignores_padding():
    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(10, 6, generator=g), torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 1, 0])
    ours = supcon_loss(z, y, torch.ones(10), tau=0.5)
    torch.testing.assert_close(ours, supcon_loss_loop(z, y, tau=0.5))
    padded = supcon_loss(torch.cat([z, torch.randn(3, 6, generator=g)]), torch.cat([y, torch.tensor([0, 1, 2])]),
                         torch.cat([torch.ones(10), torch.zeros(3)]), tau=0.5)
    torch.testing.assert_close(padded, ours)
    z.requires_grad_(True)
    supcon_loss(z, y, torch.ones(10), 0.5).backward()
    assert torch.isfinite(z.grad).all()


def test_contrastive_training_vectorized_equals_the_per_client_loop():
    """L_CE + λ L_CL through the vmapped engine and through the per-client SGD loop."""
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 3)
    layout = ParamLayout(model)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(60, 1, 4, 4, generator=g), torch.randint(0, 3, (60,), generator=g)
    indices = [np.arange(0, 25), np.arange(25, 35), np.arange(35, 60)]
    batches = make_client_batches(indices, 8, 1, torch.Generator().manual_seed(2))
    method = build_method("flce", {"lam": 0.7})
    cfg = method.local_training(None, LocalTraining(batch_size=8, lr=0.1), np.arange(3))
    start = layout.flat_of(model)
    flat, _ = train_clients(model, start, {}, x, y, batches, cfg)
    flat_ref, _ = train_clients_loop(model, start, {}, x, y, batches, cfg)
    torch.testing.assert_close(flat, flat_ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name,shape", [("mlp", (1, 6, 6)), ("resnet20", (3, 8, 8))])
def test_vectorized_prototypes_equal_the_per_client_loop(name, shape):
    torch.manual_seed(0)
    model = build_model(name, shape, 4)
    layout = ParamLayout(model)
    flats = torch.stack([layout.flat_of(build_model(name, shape, 4)) for _ in range(3)])
    buffers = {k: torch.stack([v.clone() for _ in range(3)]) for k, v in layout.buffers_of(model).items()}
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(50, *shape, generator=g), torch.randint(0, 4, (50,), generator=g)
    indices = [np.arange(0, 20), np.arange(20, 27), np.arange(27, 50)]
    protos, counts = class_prototypes(model, flats, buffers, x, y, indices, 4, batch_size=6)
    ref, ref_counts = class_prototypes_loop(model, flats, buffers, x, y, indices, 4)
    torch.testing.assert_close(counts, ref_counts)
    torch.testing.assert_close(protos, ref, atol=1e-5, rtol=1e-4)
    assert counts.sum() > 0 and protos.shape == (3, 4, model.feature_dim)


def _round():
    g = torch.Generator().manual_seed(5)
    p = torch.randn(5, 4, 8, generator=g, dtype=torch.float64)
    present = torch.ones(5, 4, dtype=torch.float64)
    present[0, 1] = present[3, 1] = present[2, 3] = 0  # some clients lack some classes
    present[:, 2] = 0
    present[4, 2] = 1  # class 2 held by one client only
    return p, present


def test_mass_velocity_momentum_sum_to_one_per_class():
    p, present = _round()
    g = torch.randn(4, 8, dtype=torch.float64)
    known = torch.tensor([True, True, False, True])
    m = class_mass(p, present)
    v = class_velocity(p, present, g, known)
    q = class_momentum(m, v, present)
    for values in (m, v, q):
        torch.testing.assert_close(values.sum(0), torch.ones(4, dtype=torch.float64))
        assert (values >= 0).all() and (values[present == 0] == 0).all()
    torch.testing.assert_close(v[:, 2], present[:, 2])  # unknown g_c: uniform over holders (one here)
    # Eq. 7 by hand for class 0
    d = (p[:, 0] - g[0]).square().sum(1)
    torch.testing.assert_close(v[:, 0], d / d.sum())
    # Eq. 8: Q ∝ M V
    torch.testing.assert_close(q[:, 0], m[:, 0] * v[:, 0] / (m[:, 0] * v[:, 0]).sum())
    # Eq. 9 and 10
    g_new, known_new = global_prototypes(q, p, present, g, known)
    torch.testing.assert_close(g_new[0], (q[:, 0:1] * p[:, 0]).sum(0))
    assert known_new.all()
    w = aggregation_weights(q)
    torch.testing.assert_close(w, q.sum(1) / q.sum())


def test_mass_by_hand():
    """Eq. 6 on two 2-d prototypes: p̂ is the cosine-weighted mean, M the normalised cosine to it."""
    p = torch.tensor([[[1.0, 0.0]], [[1.0, 1.0]]], dtype=torch.float64)
    present = torch.ones(2, 1, dtype=torch.float64)
    mean = p.mean(0)[0]
    cos = torch.nn.functional.cosine_similarity(p[:, 0], mean.unsqueeze(0), dim=1)
    p_hat = (cos / cos.sum()) @ p[:, 0]
    cos_hat = torch.nn.functional.cosine_similarity(p[:, 0], p_hat.unsqueeze(0), dim=1)
    torch.testing.assert_close(class_mass(p, present)[:, 0], cos_hat / cos_hat.sum())


def test_completion_recovers_a_rank_two_matrix_with_half_missing():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 2, generator=g, dtype=torch.float64) @ torch.rand(2, 30, generator=g, dtype=torch.float64)
    observed = torch.rand(40, 30, generator=g) < 0.5
    completed = complete_matrix(torch.where(observed, x, torch.zeros_like(x)), observed, rank=2)
    missing = ~observed
    error = (completed[missing] - x[missing]).norm() / x[missing].norm()
    assert error < 0.05
    torch.testing.assert_close(completed[observed], x[observed])  # observed entries are kept


def test_final_contributions():
    x = torch.tensor([[0.2, 0.0, 0.3], [0.0, 0.4, 0.1]], dtype=torch.float64)
    ce = final_contributions(x)  # Eq. 14 with a_t = 1/2
    torch.testing.assert_close(ce, torch.tensor([0.2, 0.4, 0.4], dtype=torch.float64))


def _federation(rounds=3, n=4, k=2):
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 3)
    return Federation(model=model, n_clients=n, n_classes=3, rounds=rounds, clients_per_round=k,
                      client_sizes=np.full(n, 10), device=torch.device("cpu"))


@pytest.mark.parametrize("params", [{}, {"mass": False}, {"velocity": False}, {"momentum": False},
                                    {"completion": False}])
def test_server_rounds_keep_weights_and_contributions_on_the_simplex(params):
    fed = _federation()
    method = build_method("flce", params)
    method.setup(fed)
    layout = ParamLayout(fed.model)
    w = layout.flat_of(fed.model)
    g = torch.Generator().manual_seed(0)
    for t, clients in enumerate([[0, 1], [2, 3], [1, 2]]):
        protos = torch.randn(2, 3, 64, generator=g)
        counts = torch.ones(2, 3)
        counts[0, 2] = 0
        updates = ClientUpdates(clients=np.asarray(clients), flat=w.repeat(2, 1), buffers={}, sizes=np.full(2, 10),
                                extras={"prototypes": protos, "prototype_counts": counts})
        state = RoundState(round=t, rng=np.random.default_rng(t), global_flat=w, global_buffers={}, lr=0.1)
        weights = method.weigh(state, updates)
        assert weights.sum().item() == pytest.approx(1.0, abs=1e-6) and (weights >= 0).all()
        scores = method.scores()
        assert scores.sum() == pytest.approx(1.0) and (scores >= 0).all()
    if params.get("momentum") is False:  # −Q: uniform over the clients holding each class
        torch.testing.assert_close(weights, torch.tensor([1 / 3, 2 / 3]))  # Q rows (½, ½, 0), (½, ½, 1)
    # X: every client observed once or twice; completion fills the rest
    assert torch.isnan(method.matrix).sum() == 3 * 4 - 6


def test_bad_hyperparameters_give_one_line_errors():
    for params, message in [({"lam": -1}, "lam must be >= 0"), ({"tau": 0}, "tau must be > 0"),
                            ({"rank": 0}, "rank must be an integer >= 1")]:
        with pytest.raises(ValueError, match=message) as info:
            build_method("flce", params)
        assert "\n" not in str(info.value)


def test_a_flce_run_records_prototype_weights_and_contributions():
    config = {"dataset": "synthetic", "method": {"name": "flce", "completion_steps": 200}, "n_clients": 5,
              "clients_per_round": 3, "rounds": 3, "batch_size": 16, "fraction": 0.3, "test_samples": 100,
              "split": {"name": "dirichlet", "alpha": 0.5}}
    r = fedlib.run(config, cache=False, progress=False)
    assert r.final["stopped"] is None and 0 <= r.final["f1"] <= 1
    for h in r.history:
        assert sum(h["weights"]) == pytest.approx(1.0, abs=1e-6)
        assert len(h["diagnostics"]["x"]) == len(h["aggregated"]) and len(h["similarity"]) == 3
    assert sum(r.history[-1]["scores"]) == pytest.approx(1.0)
    from fedlib.app.chapters.flce import contributions, flce_contributions, similarity_contributions

    # the chapter rebuilds X from the history and gets the method's own final contributions
    np.testing.assert_allclose(contributions(r), r.history[-1]["scores"], rtol=1e-6, atol=1e-9)
    uncompleted = flce_contributions(r, complete=False)
    assert uncompleted.sum() == pytest.approx(1.0) and similarity_contributions(r).sum() == pytest.approx(1.0)
    assert np.asarray(r.history[-1]["diagnostics"]["class_momentum_sum"]).shape == (5, len(r.final["per_class_accuracy"]))


def test_table4_communication_counts():
    from fedlib.app.chapters.flce import communication_cost

    rows = {row["Dataset"]: row for row in communication_cost()}
    assert rows["CIFAR-10"]["Model"] == 272474 and rows["CIFAR-10"]["Prototype"] == 640
    assert rows["CIFAR-100"]["Model"] == 278324 and rows["CIFAR-100"]["Prototype"] == 6400
    assert rows["EuroSAT"]["Model"] == 272474 and rows["EuroSAT"]["Prototype"] == 640
    assert rows["CIFAR-10"]["Ratio"] == pytest.approx(640 / (2 * 272474 + 640))
    assert rows["CIFAR-100"]["Ratio"] == pytest.approx(6400 / (2 * 278324 + 6400))


def test_chapter_configs_are_valid_for_every_profile():
    from fedlib.app.kit.sources import load_profile
    from fedlib.app.chapters.flce import configs

    for profile in ("smoke", "quick", "paper"):
        runs = configs(load_profile("flce", profile))
        assert runs and len({c.key() for c in runs}) == len(runs)
        assert all(isinstance(c, type(make_config())) for c in runs)


# ----------------------------------------------------------------------------- Eq. 4 and Eq. 11 as printed


def _three_embeddings():
    """z1 = z2 = (1, 0) with label 0, z3 = (0, 1) with label 1: cosines s12 = 1, s13 = s23 = 0."""
    return torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64), torch.tensor([0, 0, 1])


def test_contrastive_loss_as_printed_by_hand():
    """Eq. 4, τ = 1, self-pair included (its cosine is 1). Denominators over k ≠ i:
    anchors 1, 2: e^1 + e^0 = 1 + e; anchor 3: e^0 + e^0 = 2.
    Anchor 1: positives {1, 2}, N = 2, both terms log(e / (1 + e)) = 1 - ln(1 + e); anchor 2 alike;
    anchor 3: positive {3}, N = 1, term 1 - ln 2.
    L = -(1/3) [2 (1 - ln(1 + e)) + (1 - ln 2)] = (2 ln(1 + e) + ln 2 - 3) / 3 ≈ 0.10656."""
    z, y = _three_embeddings()
    e = np.e
    expected = (2 * np.log(1 + e) + np.log(2) - 3) / 3
    assert supcon_loss(z, y, torch.ones(3, dtype=torch.float64), tau=1.0).item() == pytest.approx(expected)
    assert supcon_loss_loop(z, y, tau=1.0).item() == pytest.approx(expected)
    assert expected == pytest.approx(0.106556, abs=1e-6)


def test_contrastive_loss_simplified_by_hand():
    """The simplified form (no self-pair): anchors 1, 2 have the one positive j ≠ i, term
    1 - ln(1 + e); anchor 3 has none and adds 0. L = -(1/3) 2 (1 - ln(1 + e)) ≈ 0.20884."""
    z, y = _three_embeddings()
    expected = -2 * (1 - np.log(1 + np.e)) / 3
    ours = supcon_loss(z, y, torch.ones(3, dtype=torch.float64), tau=1.0, self_pair=False)
    assert ours.item() == pytest.approx(expected)
    assert supcon_loss_loop(z, y, tau=1.0, self_pair=False).item() == pytest.approx(expected)
    assert expected == pytest.approx(0.208842, abs=1e-6)


def test_contrastive_variants_match_their_loops_on_random_batches():
    g = torch.Generator().manual_seed(3)
    z, y = torch.randn(9, 5, generator=g), torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 1])
    for self_pair in (True, False):
        torch.testing.assert_close(supcon_loss(z, y, torch.ones(9), 0.5, self_pair),
                                   supcon_loss_loop(z, y, 0.5, self_pair))


def _rank_one_tensor():
    """X[t, k, c] = u_t V[k, c], u = (1, 2), V = [[1, 2], [3, 4]]; client 1 is not selected in
    round 1, so X[1, 1, :] = 2 (3, 4) = (6, 8) is missing."""
    u = torch.tensor([1.0, 2.0], dtype=torch.float64)
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    x = u[:, None, None] * v[None]
    observed = x.clone()
    observed[1, 1] = float("nan")
    return x, observed


def test_completion_over_the_client_class_structure_by_hand():
    """Unfolded to rounds x (client, class): [[1, 2, 3, 4], [2, 4, ?, ?]]. Rank 1: round 1 is twice
    round 0 (from client 0's cells), so the missing cells are (6, 8) and Σ_c X̂ = [[3, 7], [6, 14]];
    CE = (½ (3 + 6), ½ (7 + 14)) = (4.5, 10.5), normalised (0.3, 0.7)."""
    x, observed = _rank_one_tensor()
    summed = complete_contributions(observed, "client_class", rank=1, steps=3000)
    torch.testing.assert_close(summed, x.sum(-1), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(final_contributions(summed), torch.tensor([0.3, 0.7], dtype=torch.float64),
                               atol=1e-4, rtol=1e-4)
    # the class-summed simplification on this rank-1 tensor: [[3, 7], [6, ?]] -> 14, the same here
    torch.testing.assert_close(complete_contributions(observed, "summed", rank=1, steps=3000), x.sum(-1),
                               atol=1e-3, rtol=1e-3)


def test_completion_keeps_the_per_class_cells_it_observed():
    """Client 0 holds only class 0 (its class-1 cells are observed zeros): completing the
    client x class structure keeps that zero for the missing round, the summed form cannot tell."""
    u = torch.tensor([1.0, 3.0], dtype=torch.float64)
    v = torch.tensor([[2.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    x = u[:, None, None] * v[None]
    observed = x.clone()
    observed[1, 0] = float("nan")  # client 0 missing in round 1: truth (6, 0)
    summed = complete_contributions(observed, "client_class", rank=1, steps=3000)
    torch.testing.assert_close(summed[1, 0], torch.tensor(6.0, dtype=torch.float64), atol=1e-2, rtol=1e-3)
    with pytest.raises(ValueError, match="completion_over must be one of client_class, summed"):
        complete_contributions(observed, "classes")


def test_flce_defaults_are_the_equations_as_printed_and_options_are_checked():
    method = build_method("flce", {})
    assert (method.contrastive, method.completion_over, method.rule_version) == ("paper", "client_class", "2")
    for params, message in [({"contrastive": "supcon"}, "contrastive must be paper or simplified"),
                            ({"completion_over": "rows"}, "completion_over must be client_class or summed")]:
        with pytest.raises(ValueError, match=message) as info:
            build_method("flce", params)
        assert "\n" not in str(info.value)


def test_chapter_table3_runs_the_simplified_loss_and_reads_summed_completion_from_flce():
    from fedlib.app.kit.sources import load_profile
    from fedlib.app.chapters.flce import FROM_FLCE_RUN, experiment_configs, variant_run

    params = load_profile("flce", "smoke")
    variants = [c.method.params for c in experiment_configs(params, "table3")]
    assert sum(v.get("contrastive") == "simplified" for v in variants) == len(params["seeds"]) * 2  # IID, Non-IID
    assert variant_run("FLCE summed-CMC") == "FLCE" and FROM_FLCE_RUN["FLCE summed-CMC"] == {"over": "summed"}
    assert variant_run("FLCE simplified-CL") == "FLCE simplified-CL"
