"""FedMS §5.1: "we randomly split 20 % of testing samples as validation dataset" (``validation_from: test``)."""

import pytest
import torch

from fedlib.config import ConfigError, make_config
from fedlib.federation import prepare

SYNTH = {"dataset": "synthetic", "model": "mlp", "n_clients": 4, "rounds": 1, "local_epochs": 1, "batch_size": 16}


def _rows(x, pool):
    """Row indices of ``x`` in ``pool`` (each row of x is unique in the synthetic test set)."""
    flat, ref = x.reshape(len(x), -1), pool.reshape(len(pool), -1)
    return {int(torch.nonzero((ref == r).all(1))[0]) for r in flat}


def test_validation_from_the_test_set_is_disjoint_from_the_evaluated_part_and_from_training():
    c = make_config({**SYNTH, "method": "s_fedavg", "test_samples": 300, "server_val": 100, "validation_from": "test"})
    p = prepare(c)
    ds = p.dataset
    test_rows, val_rows = _rows(p.x_test, ds.x_test), _rows(p.x_val, ds.x_test)
    assert len(p.x_test) == 300 and len(p.x_val) == 100
    assert not test_rows & val_rows  # the two parts of the test set never overlap
    assert sum(len(i) for i in p.partition.indices) == len(ds.y_train)  # nothing held out of training
    held_out = prepare(make_config({**SYNTH, "method": "s_fedavg", "test_samples": 300, "server_val": 100}))
    assert sum(len(i) for i in held_out.partition.indices) == len(ds.y_train) - 100
    assert torch.equal(held_out.x_test, p.x_test)  # the evaluated part is the same fixed subset
    other_seed = prepare(make_config({**c.to_dict(), "seed": 5}))
    assert torch.equal(other_seed.x_val, p.x_val)  # one fixed split of the test set for every run


def test_validation_from_keeps_earlier_keys_and_enters_the_key_when_set():
    plain = make_config({**SYNTH, "test_samples": 300, "server_val": 100})
    assert "validation_from" not in plain.resolved()
    moved = make_config({**plain.to_dict(), "validation_from": "test"})
    assert moved.resolved()["validation_from"] == "test" and moved.key() != plain.key()


@pytest.mark.parametrize("bad, message", [
    ({"validation_from": "test"}, "needs test_samples"),
    ({"validation_from": "train"}, "validation_from"),
    ({"validation_from": "test", "test_samples": 10**9}, "test_samples"),
])
def test_validation_from_refuses_in_one_line(bad, message):
    with pytest.raises(ConfigError, match=message) as err:
        prepare(make_config({**SYNTH, "method": "s_fedavg", "server_val": 100, **bad}))
    assert "\n" not in str(err.value)


def test_a_test_set_too_small_for_both_parts_is_refused():
    c = make_config({**SYNTH, "method": "s_fedavg", "server_val": 10**5 // 2, "test_samples": 10, "validation_from": "test"})
    with pytest.raises(ConfigError, match="test_samples \\+ server_val"):
        prepare(c)
