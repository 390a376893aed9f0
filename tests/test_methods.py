"""The method registry and the FedAvg family."""

import numpy as np
import pytest
import torch

from fedlib.methods import METHODS, ClientUpdates, build_method
from fedlib.methods.fedavg import sample_count_weights


def test_registry_has_the_first_methods():
    assert {"fedavg", "fedavg_uniform", "fedprox"} <= set(METHODS)


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("nope", {}, "unknown method 'nope'"),
        ("fedprox", {"mux": 1}, "unknown hyper-parameter 'mux'; allowed: mu"),
        ("fedprox", {"mu": -0.5}, "mu must be >= 0"),
        ("fedprox", {"mu": "x"}, "mu must be a number"),
        ("fedavg", {"mu": 1}, "allowed: none"),
    ],
)
def test_bad_methods_give_one_line_errors(name, params, message):
    with pytest.raises(ValueError, match=message) as info:
        build_method(name, params)
    assert "\n" not in str(info.value)


def test_weights_are_on_the_simplex():
    sizes = np.array([10, 30, 60])
    updates = ClientUpdates(clients=np.arange(3), flat=torch.zeros(3, 4), buffers={}, sizes=sizes)
    w = build_method("fedavg").weigh(None, updates)
    torch.testing.assert_close(w, torch.tensor([0.1, 0.3, 0.6]))
    u = build_method("fedavg_uniform").weigh(None, updates)
    torch.testing.assert_close(u, torch.full((3,), 1 / 3))
    assert sample_count_weights([0, 0]).sum() == 0  # no samples: no NaN


def test_the_method_hooks_are_listed_in_the_order_the_engine_calls_them():
    """Issue 31: Method's hooks appear once, in the order of fedlib.engine's round loop, and the module
    docstring names each of them."""
    import inspect
    import re

    from fedlib import engine
    from fedlib.methods import base

    called = []
    for name in re.findall(r"method\.([a-z_]+)\(", inspect.getsource(engine)):
        if name not in called and name != "resolved_hyperparameters":  # a key of the run, not a hook
            called.append(name)
    listed = [name for name in vars(base.Method) if name in called]
    assert listed == called
    assert all(f"``{name}``" in base.__doc__ for name in called)
