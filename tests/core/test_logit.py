"""Logit-based FL: the three aggregators by hand, the batched GMM against its loop oracle,
UWA weights on the simplex, the meta-model with a dropped client, UWA beating simple
averaging when each client knows two classes, the distillation loss, configs and the loop."""

import json

import fedlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib.cache import ResultCache
from fedlib.config import ConfigError
from fedlib.data import load_dataset
from fedlib.app.chapters.logitfl.protocol import fedavg_config, protocol_config
from fedlib.methods import logit as agg
from fedlib.models import build_model
from fedlib.partition import k_classes
from fedlib.population import LocalTraining, ParamLayout, make_client_batches, predict
from fedlib.training import train_clients

SHAPE = (1, 8, 8)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_simple_average_by_hand_with_an_absent_client():
    z = torch.tensor([[[1.0, 0.0]], [[3.0, 2.0]], [[5.0, 10.0]]])  # [N=3, n=1, C=2]
    torch.testing.assert_close(agg.simple_average(z), torch.tensor([[3.0, 4.0]]))
    present = torch.tensor([True, True, False])
    torch.testing.assert_close(agg.simple_average(z, present), torch.tensor([[2.0, 1.0]]))
    with pytest.raises(ValueError, match="at least one client"):
        agg.simple_average(z, torch.zeros(3, dtype=torch.bool))


def test_uwa_weights_lie_on_the_simplex_for_every_public_sample():
    g = torch.Generator().manual_seed(0)
    ll = 50 * torch.randn(6, 400, generator=g)  # log-likelihoods of very different scales
    w = agg.uwa_weights(ll)
    assert w.shape == (6, 400) and bool((w >= 0).all())
    torch.testing.assert_close(w.sum(0), torch.ones(400))
    present = torch.rand(6, 400, generator=g) > 0.5
    present[0] = True  # every sample keeps a client
    w = agg.uwa_weights(ll, present)
    torch.testing.assert_close(w.sum(0), torch.ones(400))
    assert float(w[~present].abs().max()) == 0.0  # absent clients get no weight
    # the softmax over clients by hand for one sample
    torch.testing.assert_close(w[:, 3], torch.softmax(ll[:, 3].masked_fill(~present[:, 3], -float("inf")), 0))
    z = torch.randn(6, 400, 10, generator=g)
    out, w2 = agg.uwa_aggregate(z, ll, present)
    torch.testing.assert_close(out[7], (w2[:, 7:8] * z[:, 7]).sum(0))


def test_batched_gmm_equals_the_per_client_loop_oracle():
    g = torch.Generator().manual_seed(1)
    n, m, d, k = 4, 30, 3, 5
    z = torch.randn(n, m, d, generator=g, dtype=torch.float64) * 3
    valid = torch.arange(m).unsqueeze(0) < torch.tensor([[30], [12], [25], [7]])  # unequal splits
    labels = torch.randint(0, 2, (n, m), generator=g) + torch.arange(n).unsqueeze(1)  # each client 2 of 5
    init = F.one_hot(labels, k).double()
    for iters in (0, 5):
        fast = agg.fit_gmm(z, valid, init, iters, reg_covar=0.01)
        slow = agg.fit_gmm_loop(z, valid, init, iters, reg_covar=0.01)
        for a, b in ((fast.log_pi, slow.log_pi),):
            assert torch.equal(torch.isinf(a), torch.isinf(b))
            torch.testing.assert_close(a[~torch.isinf(a)], b[~torch.isinf(b)])
        held = ~torch.isinf(fast.log_pi)
        torch.testing.assert_close(fast.mean[held], slow.mean[held])
        torch.testing.assert_close(fast.var[held], slow.var[held])
    assert int(held.sum()) == 2 * n  # the class-conditional start switches off classes not held


def test_gmm_log_likelihood_by_hand():
    from scipy.stats import multivariate_normal

    gmm = agg.GMM(log_pi=torch.log(torch.tensor([[0.25, 0.75]], dtype=torch.float64)),
                  mean=torch.tensor([[[0.0, 1.0], [2.0, -1.0]]], dtype=torch.float64),
                  var=torch.tensor([[[1.0, 4.0], [0.5, 2.0]]], dtype=torch.float64))
    x = torch.tensor([[[0.3, 0.2], [1.5, -2.0]]], dtype=torch.float64)
    ll = agg.gmm_log_likelihood(gmm, x)
    for s in range(2):
        expected = np.log(0.25 * multivariate_normal([0, 1], np.diag([1, 4])).pdf(x[0, s].numpy())
                          + 0.75 * multivariate_normal([2, -1], np.diag([0.5, 2])).pdf(x[0, s].numpy()))
        assert float(ll[0, s]) == pytest.approx(expected, rel=1e-9)


def _two_class_federation(n_clients=3, n_classes=6, epochs=4):
    """A synthetic federation where every client knows two classes; trained clients' logits."""
    ds = load_dataset("synthetic", num_classes=n_classes, image_shape=SHAPE, n_train=1800, n_test=600, seed=0,
                      noise=1.5)
    part = k_classes(ds.y_train.numpy(), n_clients=n_clients, k=2, seed=0)
    torch.manual_seed(0)
    model = build_model("mlp", SHAPE, n_classes)
    layout = ParamLayout(model)
    # every client: 80 % training, 20 % validation (for its GMM)
    train = [ix[: int(0.8 * len(ix))] for ix in part.indices]
    val = [ix[int(0.8 * len(ix)):] for ix in part.indices]
    batches = make_client_batches(train, 32, epochs, torch.Generator().manual_seed(0))
    flat, bufs = train_clients(model, layout.flat_of(model), {}, ds.x_train, ds.y_train, batches,
                               LocalTraining(epochs=epochs, batch_size=32, lr=0.05))
    width = max(len(v) for v in val)
    val_table = torch.stack([torch.from_numpy(np.pad(v, (0, width - len(v)))) for v in val])
    val_valid = torch.arange(width).unsqueeze(0) < torch.tensor([[len(v)] for v in val])
    logits_val = predict(model, flat, bufs, ds.x_train[val_table.flatten()])
    val_logits = logits_val.reshape(n_clients, n_clients, width, n_classes).diagonal(dim1=0, dim2=1).permute(2, 0, 1)
    test_logits = predict(model, flat, bufs, ds.x_test)
    return ds, part, val_logits, val_valid, ds.y_train[val_table], test_logits


def _logit_federation(n_clients=3, per_class=200, scale=4.0, seed=0):
    """A synthetic federation of logits: client i knows classes 2i and 2i+1. On a sample of a
    class it knows, its logits are ``scale`` on that class plus unit noise (its validation split
    is drawn the same way); on any other sample it is confidently wrong — ``scale`` on one of its
    own two classes — with a wider spread (noise std 2.5), the failure that sinks simple
    averaging on MNIST with k = 2."""
    g = torch.Generator().manual_seed(seed)
    c = 2 * n_clients
    labels = torch.arange(c).repeat_interleave(per_class)  # the public/test samples
    holder = labels // 2
    own = torch.arange(n_clients).unsqueeze(1) == holder.unsqueeze(0)  # [N, n]
    guess = 2 * torch.arange(n_clients).unsqueeze(1) + torch.randint(0, 2, own.shape, generator=g)
    target = torch.where(own, labels.unsqueeze(0), guess)
    noise = torch.where(own, 1.0, 2.5).unsqueeze(-1) * torch.randn(n_clients, len(labels), c, generator=g)
    logits = scale * F.one_hot(target, c) + noise
    val_labels = 2 * torch.arange(n_clients).unsqueeze(1) + torch.randint(0, 2, (n_clients, 100), generator=g)
    val_logits = scale * F.one_hot(val_labels, c) + torch.randn(n_clients, 100, c, generator=g)
    return logits, labels, holder, val_logits, val_labels


def test_uwa_beats_simple_averaging_when_each_client_knows_two_classes():
    logits, labels, holder, val_logits, val_labels = _logit_federation()
    valid = torch.ones(val_labels.shape, dtype=torch.bool)
    gmm = agg.fit_gmm(val_logits, valid, F.one_hot(val_labels, 6).float(), iters=10)  # the clients' GMMs
    uwa, w = agg.uwa_aggregate(logits, agg.gmm_log_likelihood(gmm, logits))
    simple = agg.simple_average(logits)
    acc_uwa = float((uwa.argmax(-1) == labels).float().mean())
    acc_simple = float((simple.argmax(-1) == labels).float().mean())
    assert acc_simple < 0.5 and acc_uwa > 0.9, (acc_uwa, acc_simple)
    assert float((w.argmax(0) == holder).float().mean()) > 0.9  # the weight goes to the class's holder
    torch.testing.assert_close(w.sum(0), torch.ones(len(labels)))
    # a softer softmax (τ > 1) moves UWA towards simple averaging
    soft, _ = agg.uwa_aggregate(logits, agg.gmm_log_likelihood(gmm, logits), tau=1e9)
    torch.testing.assert_close(soft, simple, atol=1e-4, rtol=1e-4)


def test_meta_model_accepts_a_round_with_a_dropped_client():
    ds, part, val_logits, val_valid, val_labels, test_logits = _two_class_federation()
    labelled = slice(0, 300)
    meta = agg.train_meta_model(test_logits[:, labelled], ds.y_test[labelled], 6, steps=200, seed=0)
    x = agg.meta_features(test_logits, None, meta.mean, meta.std)
    assert x.shape == (600, 3 * 6 + 3)  # the input size is fixed
    present = torch.tensor([True, False, True])
    out = agg.meta_aggregate(meta, test_logits, present)
    assert out.shape == (600, 6) and bool(torch.isfinite(out).all())
    # the dropped client's logits do not reach the aggregator (masked, imputed with the mean)
    scrambled = test_logits.clone()
    scrambled[1] = 1e6
    torch.testing.assert_close(agg.meta_aggregate(meta, scrambled, present), out)
    held_out = slice(300, 600)
    acc_all = float((agg.meta_aggregate(meta, test_logits)[held_out].argmax(-1) == ds.y_test[held_out]).float().mean())
    assert acc_all > 0.8
    # without client 1, its two classes are lost but the others stay right
    holder = torch.from_numpy(np.argmax(part.counts, 0))[ds.y_test[held_out]]
    kept = holder != 1
    acc_kept = float((out[held_out][kept].argmax(-1) == ds.y_test[held_out][kept]).float().mean())
    assert acc_kept > 0.8


def test_distillation_loss_is_temperature_scaled_kl():
    g = torch.Generator().manual_seed(2)
    teacher_logits = torch.randn(5, 4, generator=g)
    student = torch.randn(5, 4, generator=g)
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])
    t = 3.0
    loss = agg.distillation_loss(student, torch.softmax(teacher_logits, -1), mask, t)
    p = torch.softmax(teacher_logits / t, -1)
    kl = (p * (torch.log(p) - torch.log_softmax(student / t, -1))).sum(-1)
    assert float(loss) == pytest.approx(float(t**2 * kl[mask > 0].mean()), rel=1e-5)
    same = agg.distillation_loss(teacher_logits, torch.softmax(teacher_logits, -1), mask, t)
    assert float(same) == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("method,message", [
    ({"name": "logit_meta", "meta_labeled": 600}, "meta_labeled must be <= the 500 public samples"),
    ({"name": "logit_median"}, "unknown method 'logit_median'"),
    ({"name": "logit_simple", "temperature": 0}, "temperature must be > 0"),
    ({"name": "logit_simple", "public_logits": "before"}, "public_logits must be 'after_local' or 'after_refine'"),
    ({"name": "logit_uwa", "uwa_score": "z"}, "uwa_score must be 'loglik' or 'standardized'"),
    ({"name": "logit_simple", "meta_steps": 3}, "unknown hyper-parameter 'meta_steps'"),
])
def test_bad_logit_settings_raise_one_line_errors(method, message):
    config = dict(dataset="mnist", fraction=0.05, n_clients=5, split={"name": "k_classes", "k": 2}, server_val=500,
                  rounds=1, method=method)
    with pytest.raises((ConfigError, ValueError)) as info:
        fedlib.run(config, cache=False, progress=False)
    assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match="unknown setting 'rounds_'"):
        protocol_config("simple", rounds_=3)


SMALL = dict(dataset="synthetic", model="mlp", n_clients=3, k=2, public_size=200, meta_labeled=100,
             rounds=2, batch_size=32, lr=0.05, meta_steps=50, test_samples=200)


@pytest.fixture(scope="module")
def synthetic():
    return load_dataset("synthetic", num_classes=6, image_shape=SHAPE, n_train=1200, n_test=300, seed=0, noise=1.5)


@pytest.mark.parametrize("aggregator", ["simple", "uwa", "meta"])
def test_logit_runs_are_json_cached_and_count_floats(tmp_path, synthetic, aggregator):
    cfg = protocol_config(aggregator, **SMALL)
    assert cfg.method.name == f"logit_{aggregator}" and cfg.server_val == 200 and cfg.update_clip is None
    store = ResultCache(tmp_path)
    result = fedlib.run(cfg, cache=store, dataset=synthetic, progress=False)
    json.dumps(result.to_dict(), allow_nan=False)
    assert len(result.history) == 2 and 0.0 <= result.final["accuracy"] <= 1.0
    h = result.history[0]["diagnostics"]
    extra = 200 if aggregator == "uwa" else 0  # UWA clients also send each sample's log-likelihood
    assert h["floats_up"] == 3 * (200 * 6 + extra) and h["floats_down"] == 3 * 200 * 6
    n_params = sum(t.numel() for t in build_model("mlp", SHAPE, 6).parameters())
    assert h["fedavg_floats"] == 2 * 3 * n_params
    assert ("uwa_weights" in result.final) == (aggregator == "uwa")
    assert all(h["clipped"] == [] for h in result.history)  # no shared model: never clipped
    again = fedlib.run(cfg, cache=store, dataset=synthetic, progress=False)
    assert again.to_dict() == result.to_dict()  # served from the cache
    fedavg = fedavg_config(cfg)
    assert fedavg.server_val == 200 and fedavg.split.params == {"k": 2} and fedavg.method.name == "fedavg"


def test_client_dropout_rounds_run_with_every_aggregator(synthetic):
    for aggregator in ("simple", "uwa", "meta"):
        cfg = protocol_config(aggregator, **{**SMALL, "n_clients": 4, "rounds": 3}, dropout=0.5, seed=3)
        result = fedlib.run(cfg, cache=False, dataset=synthetic, progress=False)
        present = np.asarray([h["diagnostics"]["present"] for h in result.history])
        assert present.sum(1).min() >= 1 and not present.all()
        assert [h["selected"] for h in result.history] == [np.flatnonzero(row).tolist() for row in present]
        assert all(np.isfinite(h["accuracy"]) for h in result.history)


def test_local_validation_split_is_disjoint_and_sized():
    indices = [np.arange(0, 20), np.arange(20, 23), np.arange(23, 73)]
    train, val_table, valid = agg.split_validation(indices, 0.1, seed=0)
    assert valid.sum(1).tolist() == [2, 1, 5]  # ceil(0.1 n), at least one, at most n - 1
    for i, ix in enumerate(indices):
        val = val_table[i][valid[i]].numpy()
        assert set(val) | set(train[i]) == set(ix) and not set(val) & set(train[i])


def _final_logits(synthetic, **overrides):
    result = fedlib.run(protocol_config("simple", **{**SMALL, **overrides}), cache=False, dataset=synthetic,
                        progress=False)
    return [h["accuracy"] for h in result.history], [h["diagnostics"]["client_accuracy"] for h in result.history]


def test_public_logits_orders_refinement_and_upload(synthetic):
    # one round: after_local refines only after an aggregation that has a next round, after_refine
    # only on a previous round's aggregate -- neither refines, so both runs are the same
    assert _final_logits(synthetic, rounds=1) == _final_logits(synthetic, rounds=1, public_logits="after_refine")
    # no refinement at all: the order cannot matter
    assert _final_logits(synthetic, distill_epochs=0) == _final_logits(synthetic, distill_epochs=0,
                                                                       public_logits="after_refine")
    # two rounds: round 1 is the same; in round 2 after_refine uploads refined models, a different run
    local, refined = _final_logits(synthetic), _final_logits(synthetic, public_logits="after_refine")
    assert local[0][0] == refined[0][0] and local[1][1] != refined[1][1]
    # distill_lr = None is the local lr; a different step size changes the refinement
    assert _final_logits(synthetic, distill_lr=SMALL["lr"]) == local
    assert _final_logits(synthetic, distill_lr=0.5)[1][1] != local[1][1]


LOGIT_TINY = dict(dataset="mnist", fraction=0.05, test_samples=500, model="mlp", n_clients=5, rounds=3,
                  batch_size=32, split={"name": "k_classes", "k": 2}, server_val=200, update_clip=None)


@pytest.mark.parametrize("method", [
    {"name": "logit_simple"}, {"name": "logit_simple", "public_logits": "after_refine"},
    {"name": "logit_uwa"}, {"name": "logit_uwa", "public_logits": "after_refine", "uwa_score": "standardized"},
    {"name": "logit_meta", "meta_labeled": 100, "meta_steps": 30},
    {"name": "logit_meta", "meta_labeled": 100, "meta_steps": 30, "dropout": 0.4},
])
def test_the_logit_protocol_on_the_engine_equals_its_own_round_loop(method):
    """The engine runs the logit protocol (local phases for the refinement, the evaluate hook for
    the ensemble) with the same numbers as the protocol's own loop (fedlib.testing oracle). Under
    dropout the engine draws batches for the present clients only (its convention for every method;
    the loop drew them for all), so there the rounds' clients agree and the numbers may not."""
    from fedlib.config import make_config
    from fedlib.testing import logit_protocol_loop

    config = make_config(LOGIT_TINY, method=method)
    loop = logit_protocol_loop(config)
    engine = fedlib.run(config, cache=False, progress=False)
    assert [h["diagnostics"]["present"] for h in engine.history] == [h["present"] for h in loop]
    assert [h["selected"] for h in engine.history] == [np.flatnonzero(h["present"]).tolist() for h in loop]
    if method.get("dropout"):
        assert any(not all(h["present"]) for h in loop) and all(0 <= h["accuracy"] <= 1 for h in engine.history)
        return
    assert [h["accuracy"] for h in engine.history] == [h["accuracy"] for h in loop]
    assert [h["diagnostics"]["public_accuracy"] for h in engine.history] == [h["public_accuracy"] for h in loop]
    for h, ref in zip(engine.history, loop):  # absent clients: null (the loop scores their stale models)
        got = h["diagnostics"]["client_accuracy"]
        assert [g for g, on in zip(got, ref["present"]) if on] == [r for r, on in zip(ref["client_accuracy"], ref["present"]) if on]
        assert all(g is None for g, on in zip(got, ref["present"]) if not on)
    assert engine.final["accuracy"] == loop[-1]["accuracy"] and engine.final["public_accuracy"] == loop[-1]["public_accuracy"]
