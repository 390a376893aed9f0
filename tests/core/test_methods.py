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
    # the logit protocol's own hooks are named apart (DistillationProtocol), each list in the engine's order
    protocol = [name for name in vars(base.DistillationProtocol) if name in called]
    assert protocol == ["training_indices", "round_end_phases", "final_extras"]
    assert [name for name in vars(base.Method) if name in called] == [n for n in called if n not in protocol]
    assert protocol == [n for n in called if n in protocol] and not set(protocol) & set(vars(base.Method))
    assert all(f"``{name}``" in base.__doc__ for name in called)


def test_every_method_module_is_discovered_and_registers_its_methods():
    """Issue 46.5: methods register themselves as chapters do: every module of fedlib/methods is imported by
    the package (no hand-kept list), and every registered method's class lives in one of them."""
    from pathlib import Path

    import fedlib.methods as methods

    sources = sorted(p.stem for p in Path(methods.__file__).parent.glob("*.py") if p.stem not in ("__init__", "base"))
    assert list(methods.MODULES) == sources
    homes = {cls.__module__.rsplit(".", 1)[-1] for cls in methods.METHODS.values()}
    assert homes <= set(sources) and {"fedavg", "celm", "logit", "robust", "shapley"} <= homes


def test_a_run_switches_on_its_observers():
    """Issue 46.5: the engine's extras are observers a run switches on: hostile clients only where the split
    declares upload-changing roles, reference values only with ``reference_values``; FLCE's similarity and
    the poisoning monitor always, in the order their hooks run."""
    from types import SimpleNamespace

    from fedlib.observers import Adversaries, Monitor, ReferenceValues, UpdateSimilarity, observers_for

    def kinds(roles, reference=False):
        prepared = SimpleNamespace(config=SimpleNamespace(reference_values=reference, rounds=3),
                                   partition=SimpleNamespace(roles=roles))
        return [type(o) for o in observers_for(prepared, SimpleNamespace(parameter_uploads=True))]

    assert kinds(["benign", "maverick", "label_flip"]) == [UpdateSimilarity, Monitor]
    assert kinds(["benign", "sign_flip"]) == [Adversaries, UpdateSimilarity, Monitor]
    assert kinds(["benign", "free_rider"], reference=True) == [Adversaries, UpdateSimilarity, ReferenceValues, Monitor]
