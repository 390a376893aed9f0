import numpy as np
import pytest
import torch

from fedlib import allocation, splits
from fedlib import partition as P

N_PER_CLASS = 6000  # Fashion-MNIST-sized synthetic labels: 10 classes x 6000


@pytest.fixture(scope="module")
def fmnist_labels():
    return np.random.default_rng(0).permutation(np.repeat(np.arange(10), N_PER_CLASS))


@pytest.fixture(scope="module")
def small():
    """600 samples per class and matching 1x4x4 images."""
    labels = np.random.default_rng(1).permutation(np.repeat(np.arange(10), 600))
    x = torch.randn(labels.size, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    return labels, x


SPLITS = {
    "iid": lambda y, s: P.iid(y, 7, s),
    "dirichlet": lambda y, s: P.dirichlet(y, 20, 0.1, s),
    "k_classes": lambda y, s: P.k_classes(y, 6, 2, s),
    "pls": lambda y, s: P.pls(y, 5, s),
    "sls": lambda y, s: P.sls(y, 5, s),
    "maverick": lambda y, s: splits.maverick(y, 12, 2, 0.5, s),
    "maverick_iid": lambda y, s: splits.maverick_iid(y, seed=s),
    "celm_maverick": lambda y, s: splits.celm_maverick(y, seed=s),
    "celm_fr": lambda y, s: splits.celm_free_rider(y, seed=s),
    "celm_frm": lambda y, s: splits.celm_free_rider(y, seed=s, with_maverick=True),
    "adversarial": lambda y, s: splits.adversarial(y, gamma=0.5, seed=s, x=torch.zeros(y.size, 2)),
}
FULL = {"iid", "dirichlet", "k_classes", "maverick", "maverick_iid", "adversarial"}


def pool_labels(partition, labels):
    return labels if partition.y is None else partition.y.numpy()


@pytest.mark.parametrize("name", SPLITS)
def test_split_is_a_valid_partition(name, small):
    labels, _ = small
    p = SPLITS[name](labels, 0)
    flat = np.concatenate(p.indices)
    assert all(idx.dtype == np.int64 for idx in p.indices)
    assert all(np.all(np.diff(idx) > 0) for idx in p.indices)  # sorted, no repeats
    assert np.unique(flat).size == flat.size  # disjoint
    assert flat.min() >= 0 and flat.max() < labels.size
    y = pool_labels(p, labels)
    expected = np.stack([np.bincount(y[idx], minlength=10) for idx in p.indices])
    np.testing.assert_array_equal(p.counts, expected)
    assert p.counts.dtype == np.int64
    assert p.n_clients == len(p.roles) == len(p.indices)
    assert p.n_classes == 10
    np.testing.assert_array_equal(p.sizes, [idx.size for idx in p.indices])
    assert (p.sizes.sum() == labels.size) if name in FULL else (p.sizes.sum() <= labels.size)
    assert set(p.roles) <= set(allocation.ROLES)


@pytest.mark.parametrize("name", SPLITS)
def test_split_is_deterministic_in_the_seed(name, small):
    labels, _ = small
    a, b, c = SPLITS[name](labels, 3), SPLITS[name](labels, 3), SPLITS[name](labels, 4)
    assert all(np.array_equal(i, j) for i, j in zip(a.indices, b.indices))
    assert not all(np.array_equal(i, j) for i, j in zip(a.indices, c.indices))


def test_client_class_counts_accepts_indices_or_labels():
    labels = np.array([0, 1, 1, 2, 2, 2])
    by_index = allocation.client_class_counts([np.array([0, 3]), np.array([1, 2, 4, 5])], labels, 4)
    by_label = allocation.client_class_counts([np.array([0, 2]), np.array([1, 1, 2, 2])], n_classes=4)
    np.testing.assert_array_equal(by_index, [[1, 0, 1, 0], [0, 2, 2, 0]])
    np.testing.assert_array_equal(by_label, by_index)


def test_iid_sizes_differ_by_at_most_one(small):
    p = P.iid(small[0], 7, seed=0)
    assert p.sizes.max() - p.sizes.min() <= 1


@pytest.mark.parametrize("min_size", [1, 50])
def test_dirichlet_tiny_alpha_leaves_no_client_below_min_size(fmnist_labels, min_size):
    p = P.dirichlet(fmnist_labels, 100, 0.01, seed=0, min_size=min_size)
    assert p.sizes.min() >= min_size
    assert p.sizes.sum() == fmnist_labels.size


def test_min_size_repair_rule_is_deterministic():
    counts = np.array([[5, 3], [0, 0], [1, 0]])
    # client 1 takes 2 of the largest client's top class; client 2 then takes 1 more
    np.testing.assert_array_equal(allocation._repair_min_size(counts, 2), [[2, 3], [2, 0], [2, 0]])


def mean_entropy(counts):
    q = counts / counts.sum(axis=1, keepdims=True)
    return -np.sum(q * np.log(np.where(q > 0, q, 1)), axis=1).mean()


def test_small_alpha_is_more_skewed(fmnist_labels):
    skewed = P.dirichlet(fmnist_labels, 20, 0.05, seed=0).counts
    mild = P.dirichlet(fmnist_labels, 20, 10.0, seed=0).counts
    assert mean_entropy(skewed) < 1.0 < 2.0 < mean_entropy(mild)


@pytest.mark.parametrize("n_clients,k", [(6, 2), (10, 1), (3, 10), (7, 3)])
def test_k_classes_gives_exactly_k_classes_and_uses_all(small, n_clients, k):
    p = P.k_classes(small[0], n_clients, k, seed=0)
    np.testing.assert_array_equal((p.counts > 0).sum(axis=1), k)
    assert np.all(p.counts.sum(axis=0) == 600)


def test_pls_equal_sizes_and_documented_counts(fmnist_labels):
    p = P.pls(fmnist_labels, 5, seed=0)
    np.testing.assert_array_equal(p.sizes, [5452] * 5)
    np.testing.assert_array_equal((p.counts > 0).sum(axis=1), [1, 3, 6, 8, 10])
    assert np.all(p.counts.sum(axis=0) > 0)


def test_pls_with_the_celm_allocation_documented_counts(fmnist_labels):
    """classes_per_client = (2, 3, 4, 5, 9), clients taking their least-loaded classes in turn: class loads
    1/2 (twice), 1/3 (three), 1/4 + 1/5 (four), 1/5 (one); the 9-class client skips one 1/2 class, so the
    largest load is 1/2 + 1/9, on a class with 2 holders, and it binds:
    S = floor((6000 - 2) / (1/2 + 1/9)) = floor(5998 · 18 / 11) = 9814 samples per client."""
    p = P.pls(fmnist_labels, 5, seed=0, classes_per_client=[2, 3, 4, 5, 9])
    np.testing.assert_array_equal((p.counts > 0).sum(axis=1), [2, 3, 4, 5, 9])
    np.testing.assert_array_equal(p.counts.sum(axis=1), [9814] * 5)


def test_sls_grows_stepwise_with_documented_counts(fmnist_labels):
    p = P.sls(fmnist_labels, 5, seed=0)
    np.testing.assert_array_equal(p.sizes, [3598, 7196, 10794, 14392, 17990])
    n_held = (p.counts > 0).sum(axis=1)
    assert np.all(np.diff(n_held) >= 0) and np.all(np.diff(p.sizes) > 0)
    assert np.all(p.counts.sum(axis=0) > 0)


def test_label_skew_custom_classes_per_client(small):
    p = P.pls(small[0], 4, seed=0, classes_per_client=[2, 2, 3, 5])
    np.testing.assert_array_equal((p.counts > 0).sum(axis=1), [2, 2, 3, 5])
    assert np.all(p.counts.sum(axis=0) > 0) and len(set(p.sizes)) == 1


def test_maverick_classes_are_exclusive(fmnist_labels):
    p = splits.maverick(fmnist_labels, 50, 2, 0.1, seed=0)
    assert p.roles[-2:] == ["maverick"] * 2 and set(p.roles[:-2]) == {"benign"}
    holders = (p.counts > 0).sum(axis=0)
    exclusive = np.flatnonzero(holders == 1)
    mav_classes = [np.argmax(p.counts[i]) for i in (48, 49)]
    assert set(mav_classes) <= set(exclusive)
    np.testing.assert_array_equal(p.counts[:48, mav_classes], 0)
    np.testing.assert_array_equal(p.counts[[48, 49], mav_classes], N_PER_CLASS)
    assert p.sizes.min() >= 1


def test_maverick_share_counts_by_hand():
    """10 classes of 101 samples, 5 clients, Mavericks (clients 3, 4) own classes 2 and 7. Share 0.25:
    floor(0.25 x 101) = 25 samples of each Maverick class, 76 of each left out; the 8 shared classes
    keep all 101 samples each: 8 x 101 + 2 x 25 = 858 samples used. Share 1 is the default, sample
    for sample."""
    labels = np.random.default_rng(2).permutation(np.repeat(np.arange(10), 101))
    p = splits.maverick(labels, 5, 2, 1.0, seed=0, maverick_classes=[2, 7], maverick_share=0.25)
    np.testing.assert_array_equal(p.counts[:, [2, 7]], [[0, 0], [0, 0], [0, 0], [25, 0], [0, 25]])
    shared = np.setdiff1d(np.arange(10), [2, 7])
    np.testing.assert_array_equal(p.counts[:, shared].sum(0), [101] * 8)
    assert p.counts.sum() == 858 and sum(len(i) for i in p.indices) == 858
    assert np.all(labels[p.indices[3]][np.isin(labels[p.indices[3]], [2, 7])] == 2)
    whole = splits.maverick(labels, 5, 2, 1.0, seed=0, maverick_classes=[2, 7])
    same = splits.maverick(labels, 5, 2, 1.0, seed=0, maverick_classes=[2, 7], maverick_share=1.0)
    np.testing.assert_array_equal(whole.counts[:, [2, 7]], [[0, 0], [0, 0], [0, 0], [101, 0], [0, 101]])
    assert all(np.array_equal(a, b) for a, b in zip(whole.indices, same.indices))


def test_maverick_share_is_a_run_parameter_that_enters_the_key_only_when_set():
    """A config without maverick_share resolves (and keys) as before the parameter existed; one that
    sets it carries it in its resolved split and runs with it (MNIST-sized: 50 clients, share 1/50)."""
    from fedlib.config import make_config

    base = dict(dataset="mnist", n_clients=50, split={"name": "maverick", "n_mavericks": 2, "gamma": 10.0})
    plain = make_config(**base)
    assert "maverick_share" not in plain.resolved()["split"]
    assert set(plain.resolved()["split"]) == {"name", "n_mavericks", "gamma", "min_size", "maverick_classes"}
    shared = make_config(**{**base, "split": {**base["split"], "maverick_share": 0.02}})
    assert shared.resolved()["split"]["maverick_share"] == 0.02 and shared.key({}) != plain.key({})
    labels = np.random.default_rng(3).permutation(np.repeat(np.arange(10), 6000))
    p = P._call_with_params(splits.maverick, "maverick", {"n_mavericks": 2, "gamma": 10.0, "maverick_share": 0.02},
                            labels=labels, n_clients=50, seed=0, n_classes=10)
    exclusive = np.flatnonzero(p.counts[:48].sum(0) == 0)
    assert exclusive.size == 2
    own = p.counts[48:][:, exclusive]  # Maverick 48 owns the lower class (sorted random choice)
    np.testing.assert_array_equal(own, [[120, 0], [0, 120]])  # floor(0.02 x 6000)


def test_maverick_iid_documented_counts(fmnist_labels):
    p = splits.maverick_iid(fmnist_labels, seed=0, maverick_class=8)
    np.testing.assert_array_equal(p.sizes, [10800] * 4 + [16800])
    np.testing.assert_array_equal(p.counts[:4, 8], 0)
    assert np.all(p.counts[:4] == p.counts[0])  # identical (IID) non-Mavericks


def test_celm_maverick_documented_counts(fmnist_labels):
    p = splits.celm_maverick(fmnist_labels, seed=0)
    np.testing.assert_array_equal(p.sizes, [12000] * 4 + [1200])
    rare = np.flatnonzero(p.counts[-1])
    assert rare.size == 2 and np.all(p.counts[:-1, rare] == 0)
    assert p.roles == ["benign"] * 4 + ["maverick"]


def test_celm_maverick_shared_documented_counts(fmnist_labels):
    """The reading where the Maverick also shares the common classes (issue 30): every client holds
    6000 / 5 = 1200 of each of the 8 common classes; the Maverick also all 6000 of each of its 2 rare
    classes, which no other client holds; the rare classes are the same draw as celm_maverick's."""
    p = splits.celm_maverick_shared(fmnist_labels, seed=0)
    rare = np.flatnonzero(p.counts[:-1].sum(0) == 0)
    common = np.setdiff1d(np.arange(10), rare)
    assert rare.tolist() == np.flatnonzero(splits.celm_maverick(fmnist_labels, seed=0).counts[-1]).tolist()
    assert np.all(p.counts[:, common] == 1200) and np.all(p.counts[-1, rare] == 6000)
    np.testing.assert_array_equal(p.sizes, [9600] * 4 + [9600 + 12000])
    assert p.roles == ["benign"] * 4 + ["maverick"]
    half = splits.celm_maverick_shared(fmnist_labels, seed=0, rare_fraction=0.1)
    assert np.all(half.counts[-1, rare] == 600)


def test_celm_free_rider_documented_counts(fmnist_labels):
    fr = splits.celm_free_rider(fmnist_labels, seed=0)
    frm = splits.celm_free_rider(fmnist_labels, seed=0, with_maverick=True)
    np.testing.assert_array_equal(fr.sizes, [14940] * 4 + [240])
    np.testing.assert_array_equal(frm.sizes, [15920] * 3 + [1200, 240])
    assert frm.roles == ["benign"] * 3 + ["maverick", "weak_free_rider"]
    rider_classes = np.flatnonzero(frm.counts[-1])
    assert np.all(frm.counts[:3, rider_classes] > 0)  # globally well represented


def test_frm_maverick_can_share_the_common_classes_and_keep_the_earlier_keys(fmnist_labels):
    """FRM with Table 2's shared Maverick: the Maverick also takes an even share of every common class; the
    parameter, added later, stays out of the key at its default (``ADDED_LATER``)."""
    from fedlib.config import make_config

    frm = splits.celm_free_rider(fmnist_labels, seed=0, with_maverick=True, rare_fraction=0.5, maverick_shares_common=True)
    rare = np.flatnonzero(frm.counts[:3].sum(axis=0) == 0)
    assert len(rare) == 2 and np.all(frm.counts[3, rare] == 3000)
    common = np.setdiff1d(np.flatnonzero(frm.counts[:3].sum(axis=0)), np.flatnonzero(frm.counts[-1]))
    np.testing.assert_array_equal(frm.counts[3, common], frm.counts[0, common])  # four sharers, evenly
    with pytest.raises(ValueError, match="maverick_shares_common needs with_maverick"):
        splits.celm_free_rider(fmnist_labels, seed=0, maverick_shares_common=True)
    split = {"name": "celm_free_rider", "with_maverick": True}
    base = make_config(dataset="fmnist", split=split).resolved()["split"]
    assert "maverick_shares_common" not in base
    assert make_config(dataset="fmnist", split={**split, "maverick_shares_common": False}).resolved()["split"] == base
    shared = make_config(dataset="fmnist", split={**split, "maverick_shares_common": True}).resolved()["split"]
    assert shared == {**base, "maverick_shares_common": True}


def test_weak_free_rider_takes_the_most_abundant_classes():
    labels = np.repeat(np.arange(5), [100, 400, 100, 300, 100])
    p = splits.celm_free_rider(labels, 3, seed=0, free_rider_classes=2, rare_classes=1)
    assert set(np.flatnonzero(p.counts[-1])) == {1, 3}


def test_free_rider_marks_last_benign_clients(fmnist_labels):
    base = splits.maverick(fmnist_labels, 10, 2, 1.0, seed=0)
    p = splits.free_rider(base, 2)
    assert p.roles == ["benign"] * 6 + ["free_rider"] * 2 + ["maverick"] * 2
    np.testing.assert_array_equal(p.counts, base.counts)


def test_adversarial_pool(small):
    labels, x = small
    p = splits.adversarial(labels, gamma=0.1, seed=0, x=x)
    assert p.n_clients == 58
    expected_roles = (["benign"] * 48 + ["maverick"] * 2 + ["label_flip"] * 2
                      + ["random_data"] * 2 + ["random_update"] * 2 + ["free_rider"] * 2)
    assert p.roles == expected_roles
    flipped = np.concatenate(p.indices[50:52])
    noised = torch.from_numpy(np.concatenate(p.indices[52:54]))
    np.testing.assert_array_equal(p.y.numpy()[flipped], 9 - labels[flipped])
    untouched = np.setdiff1d(np.arange(labels.size), flipped)
    np.testing.assert_array_equal(p.y.numpy()[untouched], labels[untouched])
    assert not torch.isclose(p.x[noised], x[noised]).any()
    clean = torch.ones(labels.size, dtype=torch.bool)
    clean[noised] = False
    assert torch.equal(p.x[clean], x[clean])
    assert abs(p.x[noised].std().item() - x.std().item()) < 0.2


def test_adversarial_without_random_data_keeps_images():
    labels = np.repeat(np.arange(10), 60)
    p = splits.adversarial(labels, gamma=1.0, seed=0, n_benign=8, n_random_data=0)
    assert p.x is None and p.y is not None and p.n_clients == 16


def test_covariate_shift_is_client_specific_and_deterministic(small):
    labels, _ = small
    x = torch.ones(labels.size, 2, 3, 3)
    p = P.pls(labels, 5, seed=0)
    shifted = splits.covariate_shift(x, labels, p, 0.05, seed=0)
    again = splits.covariate_shift(x, labels, p, 0.05, seed=0)
    other = splits.covariate_shift(x, labels, p, 0.05, seed=1)
    assert shifted.x.shape == x.shape and torch.equal(shifted.x, again.x)
    assert not torch.equal(shifted.x, other.x)
    first = [shifted.x[torch.from_numpy(idx[:1])] for idx in p.indices]
    for idx, row in zip(p.indices, first):  # one affine map per client ...
        assert torch.equal(shifted.x[torch.from_numpy(idx)], row.expand(idx.size, -1, -1, -1))
    assert len({tuple(row.flatten().tolist()) for row in first}) == 5  # ... differing by client
    unused = np.setdiff1d(np.arange(labels.size), np.concatenate(p.indices))
    assert torch.equal(shifted.x[unused], x[unused])
    np.testing.assert_array_equal(shifted.counts, p.counts)
    # each output feature is x + sum_j Lambda_ij x_j + delta_i: std sigma * sqrt(d + 1)
    assert abs((shifted.x[p.indices[4]] - 1).std().item() - 0.05 * 19**0.5) < 0.1


def test_covariate_shift_sigma_zero_is_identity(small):
    labels, x = small
    p = P.iid(labels, 4, seed=0)
    assert torch.equal(splits.covariate_shift(x, labels, p, 0.0, seed=0).x, x)


def test_label_noise_rates(small):
    labels, x = small
    p = P.iid(labels, 4, seed=0)
    y = torch.from_numpy(labels)
    assert torch.equal(splits.label_noise(x, y, p, 0.0, seed=0).y, y)
    all_noisy = splits.label_noise(x, y, p, 1.0, seed=0)
    assert bool((all_noisy.y != y).all())
    part = splits.label_noise(x, y, p, 0.3, seed=0, clients=[1])
    changed = (part.y != y).numpy()
    assert changed.sum() == changed[p.indices[1]].sum() == round(0.3 * p.sizes[1])
    expected = np.stack([np.bincount(part.y.numpy()[idx], minlength=10) for idx in p.indices])
    np.testing.assert_array_equal(part.counts, expected)


def test_feature_noise_only_on_chosen_clients(small):
    labels, x = small
    p = P.iid(labels, 4, seed=0)
    assert torch.equal(splits.feature_noise(x, labels, p, 0.0, seed=0).x, x)
    noisy = splits.feature_noise(x, labels, p, 0.5, seed=0, clients=[2])
    chosen = torch.from_numpy(p.indices[2])
    others = torch.from_numpy(np.concatenate([p.indices[i] for i in (0, 1, 3)]))
    assert torch.equal(noisy.x[others], x[others])
    assert abs((noisy.x[chosen] - x[chosen]).std().item() - 0.5) < 0.05


def test_transforms_use_the_partition_pool(small):
    labels, x = small
    adv = splits.adversarial(labels, gamma=1.0, seed=0, x=x)
    noisy = splits.label_noise(x, labels, adv, 0.0, seed=0)
    assert torch.equal(noisy.y, adv.y) and noisy.x is adv.x


ERRORS = [
    ("alpha", lambda y: P.dirichlet(y, 5, 0.0, seed=0)),
    ("gamma", lambda y: splits.maverick(y, 5, 1, -1.0, seed=0)),
    ("k", lambda y: P.k_classes(y, 5, 0, seed=0)),
    ("k", lambda y: P.k_classes(y, 5, 11, seed=0)),
    ("n_clients", lambda y: P.iid(y, 0, seed=0)),
    ("n_clients", lambda y: P.dirichlet(y, y.size + 1, 1.0, seed=0)),
    ("n_mavericks", lambda y: splits.maverick(y, 20, 10, 1.0, seed=0)),
    ("n_mavericks", lambda y: splits.maverick(y, 3, 3, 1.0, seed=0)),
    ("min_size", lambda y: P.dirichlet(y, 10, 1.0, seed=0, min_size=1000)),
    ("classes_per_client", lambda y: P.pls(y, 3, seed=0, classes_per_client=[1, 2, 3])),
    ("rate", lambda y: splits.label_noise(None, y, P.iid(y, 2, seed=0), 1.5, seed=0)),
    ("rate", lambda y: splits.label_noise(None, y, P.iid(y, 2, seed=0), -0.1, seed=0)),
    ("sigma", lambda y: splits.covariate_shift(None, y, P.iid(y, 2, seed=0), -0.1, seed=0)),
    ("std", lambda y: splits.feature_noise(None, y, P.iid(y, 2, seed=0), -1.0, seed=0)),
    ("n_free_riders", lambda y: splits.free_rider(P.iid(y, 2, seed=0), 3)),
    ("x", lambda y: splits.adversarial(y, gamma=1.0, seed=0)),
    ("maverick_classes", lambda y: splits.maverick(y, 5, 1, 1.0, seed=0, maverick_classes=[10])),
    ("maverick_share", lambda y: splits.maverick(y, 5, 1, 1.0, seed=0, maverick_share=0.0)),
    ("maverick_share", lambda y: splits.maverick(y, 5, 1, 1.0, seed=0, maverick_share=1.5)),
    ("maverick_share", lambda y: splits.maverick(y, 5, 1, 1.0, seed=0, maverick_share=0.005)),  # floor(0.5) = 0
    ("free_rider_fraction", lambda y: splits.celm_free_rider(y, seed=0, free_rider_fraction=0.0)),
]


@pytest.mark.parametrize("field,call", ERRORS, ids=[f for f, _ in ERRORS])
def test_errors_are_one_line_and_name_the_field(field, call):
    labels = np.repeat(np.arange(10), 100)
    with pytest.raises(ValueError) as err:
        call(labels)
    message = str(err.value)
    assert "\n" not in message and message.startswith(field + " ")


def test_even_split_rows_matches_the_per_row_loop():
    """The vectorized row split (PLS/SLS counts, k_classes, Maverick and CELM columns) against
    its loop oracle: row i is ``_even_split(totals[i], parts[i])`` over its held entries."""
    from fedlib.allocation import _even_split, _even_split_rows

    rng = np.random.default_rng(4)
    holds = rng.random((9, 7)) < 0.5
    holds[np.arange(9), rng.integers(0, 7, 9)] = True  # every row holds at least one entry
    totals = rng.integers(0, 50, 9)
    loop = np.zeros(holds.shape, dtype=np.int64)
    for i in range(len(holds)):
        loop[i, holds[i]] = _even_split(int(totals[i]), int(holds[i].sum()))
    np.testing.assert_array_equal(_even_split_rows(holds, totals, holds.sum(axis=1)), loop)
    # by hand: 7 over 3 held entries -> 3, 2, 2 (larger first), in column order
    np.testing.assert_array_equal(_even_split_rows(np.array([[True, False, True, True]]), np.array([7]),
                                                   np.array([3])), [[3, 0, 2, 2]])


def test_free_rider_and_hostile_roles_mark_the_last_benign_clients():
    from fedlib.splits import _mark_benign

    base = P.iid(np.arange(40) % 4, n_clients=5, seed=0)
    base.roles[4] = "maverick"
    marked = splits.free_rider(base, 2)
    assert marked.roles == ["benign", "benign", "free_rider", "free_rider", "maverick"]
    hostile = _mark_benign(marked, 1, "nan_update", "nan_updates")
    assert hostile.roles[1] == "nan_update"
    with pytest.raises(ValueError, match=r"huge_updates must be in \[0, 1\] \(the benign clients\), got 2"):
        _mark_benign(hostile, 2, "huge_update", "huge_updates")


def test_split_kinds_are_a_registry_with_every_numeric_parameter_ranged_in_one_place():
    """Issue 31: the split kinds, their parameters, defaults and ranges in fedlib.partition; the config
    reads them there (a bad value is one line at validation, before any data is read)."""
    from fedlib.config import make_config
    from fedlib.errors import ConfigError
    from fedlib.partition import PARAMETER_RANGES, SPLIT_KINDS, SPLITS, split_defaults

    assert SPLITS == tuple(SPLIT_KINDS) and "dirichlet" in SPLITS
    assert split_defaults("dirichlet") == {"min_size": 1} and split_defaults("not a split") == {}
    numeric = {p for kind in SPLIT_KINDS.values() for p, v in kind.defaults.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert numeric <= set(PARAMETER_RANGES), sorted(numeric - set(PARAMETER_RANGES))
    config = make_config({"dataset": "synthetic", "split": {"name": "dirichlet", "alpha": 0.3}})
    assert config.resolved()["split"] == {"name": "dirichlet", "min_size": 1, "alpha": 0.3}
    with pytest.raises(ConfigError, match=r"split\.rare_fraction: split 'celm_maverick' needs a number in \(0, 1\] "
                                          r"\(got 1.5\)$"):
        make_config({"dataset": "synthetic", "split": {"name": "celm_maverick", "rare_fraction": 1.5}})
    with pytest.raises(ConfigError, match=r"split\.k: split 'k_classes' needs an integer in \[1, 100000\] \(got 2.5\)$"):
        make_config({"dataset": "synthetic", "split": {"name": "k_classes", "k": 2.5}})
