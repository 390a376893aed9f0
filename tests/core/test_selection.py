"""PoC and FedEMD: batched local losses vs a loop oracle, label distributions, PoC's
highest-loss choice and candidate schedule, FedEMD's preference for far clients and its decay."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib.data import load_dataset
from fedlib.methods import ClientData, Federation, RoundState, build_method
from fedlib.methods.selection import label_distributions, local_losses
from fedlib.models import build_model
from fedlib.population import ParamLayout

SHAPE = (1, 8, 8)


@pytest.fixture(scope="module")
def world():
    ds = load_dataset("synthetic", num_classes=4, image_shape=SHAPE, n_train=400, n_test=40, seed=0, noise=1.0)
    y = ds.y_train.numpy()
    rng = np.random.default_rng(0)
    shared = rng.permutation(np.flatnonzero(y != 3))
    indices = [np.sort(p) for p in np.array_split(shared, 7)]
    indices.append(np.flatnonzero(y == 3))  # client 7: a Maverick holding only class 3
    torch.manual_seed(0)
    model = build_model("mlp", SHAPE, 4)
    flat = ParamLayout(model).flat_of(model)
    sizes = np.array([len(ix) for ix in indices])

    def client_data(clients):
        return ClientData(ds.x_train, ds.y_train, [indices[c] for c in clients], torch.Generator())

    fed = Federation(model=model, n_clients=8, n_classes=4, rounds=20, clients_per_round=2, client_sizes=sizes,
                     device=torch.device("cpu"), client_data=client_data)
    return fed, flat, indices, ds


def _state(flat, t, seed=0):
    return RoundState(round=t, rng=np.random.default_rng(seed), global_flat=flat, global_buffers={}, lr=0.1)


def test_batched_local_losses_equal_a_loop(world):
    fed, flat, indices, ds = world
    losses = local_losses(fed.model, flat, {}, fed.client_data(np.array([5, 0, 7])))
    local = ParamLayout(fed.model).load_into(build_model("mlp", SHAPE, 4).eval(), flat)
    with torch.no_grad():
        oracle = [float(F.cross_entropy(local(ds.x_train[indices[c]]), ds.y_train[indices[c]])) for c in (5, 0, 7)]
    np.testing.assert_allclose(losses.numpy(), oracle, rtol=1e-5)


def test_label_distributions_are_the_client_class_shares(world):
    fed, _, indices, ds = world
    dist = label_distributions(fed, 4)
    np.testing.assert_allclose(dist.sum(1), 1.0)
    assert dist[7, 3] == 1.0 and dist[:7, 3].max() == 0.0


def test_poc_picks_the_highest_losses_among_candidates(world):
    fed, flat, indices, ds = world
    m = build_method("poc", {"decay": 1.0})
    m.setup(fed)
    assert m.candidates(0) == m.candidates(10) == 8  # decay 1.0: every client is a candidate
    chosen = m.select_clients(_state(flat, 0))
    losses = local_losses(fed.model, flat, {}, fed.client_data(np.arange(8))).numpy()
    assert chosen.tolist() == sorted(np.argsort(-losses)[:2].tolist())
    m = build_method("poc", {"decay": 0.5})
    m.setup(fed)
    assert [m.candidates(t) for t in range(4)] == [8, 4, 2, 2]  # decays to K


def test_fedemd_prefers_far_clients_early_and_flattens(world):
    fed, flat, _, _ = world
    m = build_method("fedemd", {"beta": 0.05})
    m.setup(fed)
    assert int(np.argmax(m.scores())) == 7  # the Maverick is farthest from the global distribution
    early = sum(7 in m.select_clients(_state(flat, 0, s)) for s in range(50))
    late = sum(7 in m.select_clients(_state(flat, 10_000, s)) for s in range(50))
    assert early == 50 and late < 30  # late: close to uniform (2 of 8 -> ~12 of 50)


@pytest.mark.parametrize("name,params,message", [
    ("poc", {"decay": 0.0}, "decay must be in"),
    ("poc", {"d0_fraction": 1.5}, "d0_fraction must be in"),
    ("fedemd", {"beta": 0.0}, "beta must be > 0"),
])
def test_bad_hyperparameters(name, params, message):
    with pytest.raises(ValueError, match=message):
        build_method(name, params)
