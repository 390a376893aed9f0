"""A method's numbers on a fixed tiny federation change only together with its rule_version.

Golden values live in ``tests/golden_methods.json``; regenerate one method after bumping its
``rule_version`` with ``python tests/golden_methods.py --regenerate <name>`` (see that file)."""

import pytest

import golden_methods as golden
from fedlib.config import ENGINE_VERSION
from fedlib.methods import METHODS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
STORED = golden.load()


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_output_changes_only_with_its_rule_version(name):
    regen = f"python tests/golden_methods.py --regenerate {name}"
    assert name in STORED, f"{name}: no golden value yet; run {regen}"
    stored = STORED[name]
    assert stored["rule_version"] == METHODS[name].rule_version, (
        f"{name}: rule_version is {METHODS[name].rule_version!r} but the golden value is of "
        f"{stored['rule_version']!r}; run {regen}")
    assert stored["engine_version"] == ENGINE_VERSION, (
        f"{name}: ENGINE_VERSION is {ENGINE_VERSION!r}, the golden value is of {stored['engine_version']!r}; "
        "run python tests/golden_methods.py --regenerate-changed")
    diff = golden.differences(stored["values"], golden.values_of(name))
    assert not diff, (f"{name}: output changed without a rule_version change ({len(diff)} values, first: "
                      f"{diff[0]}); if the rule changed on purpose, bump {METHODS[name].__name__}.rule_version "
                      f"(or fedlib.config.ENGINE_VERSION if the engine changed) and run {regen}")


def test_a_silent_rule_change_is_caught(monkeypatch):
    """The check can fail: FedAvg weights tilted by 1% (a rule change that keeps the hyper-parameters)."""
    fedavg = METHODS["fedavg"]
    original = fedavg.weigh

    def tilted(self, state, updates):
        w = original(self, state, updates)
        w = w.clone()
        w[0] *= 1.01
        return w / w.sum()

    monkeypatch.setattr(fedavg, "weigh", tilted)
    diff = golden.differences(STORED["fedavg"]["values"], golden.values_of("fedavg"))
    assert any("weights" in d for d in diff)
    assert golden.differences(STORED["fedavg"]["values"], STORED["fedavg"]["values"]) == []
