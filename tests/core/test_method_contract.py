"""Issue 31 point 3, the method contract: a round's data travels in ``RoundState`` (FedFV, the logit
protocol, every method's diagnostics), the server's hook is ``weigh`` (``population.aggregate`` is
the matmul), CELM's retained heads are the engine's per-client state, and methods register
themselves under their names."""

import inspect
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib.config import make_config
from fedlib.engine import execute
from fedlib.federation import prepare
from fedlib.methods import (METHODS, ClientData, ClientUpdates, Federation, Method, RoundState, build_method,
                            register)
from fedlib.methods.logit import gmm_log_likelihood, meta_aggregate, train_meta_model, uwa_aggregate
from fedlib.run import run

import golden_methods as golden

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _state(global_flat, round_index=0, updates=None):
    return RoundState(round=round_index, rng=np.random.default_rng(0), global_flat=global_flat, global_buffers={},
                      lr=0.1, updates=updates)


# ----------------------------------------------------------------------------- FedFV


def test_fedfv_server_step_reads_the_rounds_uploads_from_the_state():
    """A FedFV that never saw ``weigh`` steps from ``state.updates`` alone. By hand (α = 0, τ = 0):
    g_1 = (1, 0), g_2 = (-1, 1), losses 0.1 < 0.2; g_2' = g_2 + g_1 = (0, 1) (projected on g_1),
    g_1' = g_1 + g_2 / 2 = (0.5, 0.5) (on g_2); mean (0.25, 0.75), rescaled to ||mean g|| = 0.5."""
    method = build_method("fedfv", {"alpha": 0.0, "tau": 0})
    method.setup(Federation(model=torch.nn.Linear(2, 2), n_clients=2, n_classes=2, rounds=1, clients_per_round=2,
                            client_sizes=np.full(2, 5), device=torch.device("cpu")))
    global_flat = torch.zeros(2, dtype=torch.float64)
    flat = global_flat - torch.tensor([[1.0, 0.0], [-1.0, 1.0]], dtype=torch.float64)  # w_k = w - g_k
    updates = ClientUpdates(np.arange(2), flat, {}, np.full(2, 5), extras={"loss": torch.tensor([0.1, 0.2])})
    state = _state(global_flat, updates=updates)
    new, _ = method.server_update(state, torch.full((2,), 0.5), flat.mean(0), {})
    direction = torch.tensor([0.25, 0.75], dtype=torch.float64) * 0.5 / np.sqrt(0.625)
    torch.testing.assert_close(new, -direction)
    weights = method.weigh(state, updates)  # uniform, and nothing of the round kept on the method
    assert weights.tolist() == [0.5, 0.5]
    assert set(vars(method)) == {"alpha", "tau", "fed", "history"}  # history: FedFV's past directions (server state)
    torch.testing.assert_close(method.history[0], direction)


# ----------------------------------------------------------------------------- the logit protocol

N, C, PER_CLIENT, N_PUBLIC, N_TEST = 3, 3, 10, 12, 9


def _logit_method(name, **params):
    """``name`` set up on 3 clients of 10 samples (2 of each in its validation split), 12 public samples."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N * PER_CLIENT, 4, generator=g), torch.arange(N * PER_CLIENT) % C
    indices = [np.arange(i * PER_CLIENT, (i + 1) * PER_CLIENT) for i in range(N)]
    fed = Federation(model=torch.nn.Linear(4, C), n_clients=N, n_classes=C, rounds=4, clients_per_round=N,
                     client_sizes=np.full(N, PER_CLIENT), device=torch.device("cpu"),
                     x_val=torch.randn(N_PUBLIC, 4, generator=g), y_val=torch.arange(N_PUBLIC) % C,
                     client_data=lambda c: ClientData(x, y, [indices[i] for i in c], torch.Generator()), seed=3)
    method = build_method(name, {"val_fraction": 0.2, **params})
    method.setup(fed)
    return method


def _logit_round(method, round_index=0):
    """A round where clients 0 and 2 upload logits (client 1 is absent)."""
    g = torch.Generator().manual_seed(10 + round_index)
    present = np.array([0, 2])
    width = method.val_table.shape[1]
    updates = ClientUpdates(present, torch.zeros(2, 5), {}, np.full(2, PER_CLIENT), extras={
        "public": 3 * torch.randn(2, N_PUBLIC, C, generator=g), "validation": 3 * torch.randn(2, width, C, generator=g)})
    return _state(torch.zeros(5), round_index, updates)


def _test_set(seed=20):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(2, N_TEST, C, generator=g)  # the two present clients' test logits
    return SimpleNamespace(predict=lambda flat, buffers: logits, y=torch.arange(N_TEST) % C), logits


def _on_every_client(rows):
    full = torch.zeros(N, *rows.shape[1:])
    full[[0, 2]] = rows
    return full


ROUND_ATTRIBUTES = {"present", "validation", "gmm", "meta", "round", "history_extras"}  # on self before issue 31


def test_simple_averaging_reads_the_present_clients_from_the_round_data():
    method = build_method("logit_simple")  # no setup: the rule needs only the state
    state = _state(torch.zeros(1))
    state.round_data["present"] = torch.tensor([True, False, True])
    logits = torch.tensor([[[1.0, 2.0]], [[50.0, 50.0]], [[3.0, 6.0]]])
    torch.testing.assert_close(method.aggregate_logits(state, logits, "test"), torch.tensor([[2.0, 4.0]]))


def test_uwa_evaluate_reuses_the_gmm_aggregate_put_in_the_round_data():
    method = _logit_method("logit_uwa", gmm_iters=3)
    state = _logit_round(method)
    method.weigh(state, state.updates)
    data = state.round_data
    assert data["present"].tolist() == [True, False, True]
    torch.testing.assert_close(data["validation"], _on_every_client(state.updates.extras["validation"]))
    assert method.diagnostics(state)["mean_entropy"] == data["weight_summary"]["mean_entropy"]
    assert not ROUND_ATTRIBUTES & set(vars(method))
    test, logits = _test_set()
    full = _on_every_client(logits)
    expected, _ = uwa_aggregate(full, gmm_log_likelihood(data["gmm"], full), data["present"], method.uwa_tau)
    evaluation = method.evaluate(state, None, None, test)
    torch.testing.assert_close(evaluation.loss, F.cross_entropy(expected, test.y).view(1))
    assert float(evaluation.accuracy[0]) == float((expected.argmax(-1) == test.y).float().mean())


def test_the_meta_model_is_trained_with_the_round_of_the_state_and_reused_by_evaluate():
    method = _logit_method("logit_meta", meta_labeled=10, meta_steps=5)
    state = _logit_round(method, round_index=2)
    method.weigh(state, state.updates)
    present, public = state.round_data["present"], _on_every_client(state.updates.extras["public"])
    reference = train_meta_model(public[:, :10], method.fed.y_val[:10], C, hidden=method.meta_hidden, steps=5,
                                 lr=method.meta_lr, drop=method.meta_drop, present=present, seed=3 * 1000 + 2)
    torch.testing.assert_close(meta_aggregate(state.round_data["meta_model"], public, present),
                               meta_aggregate(reference, public, present))
    torch.testing.assert_close(method.targets, torch.softmax(meta_aggregate(reference, public, present), -1))
    assert not ROUND_ATTRIBUTES & set(vars(method))
    test, logits = _test_set()
    expected = meta_aggregate(reference, _on_every_client(logits), present)
    torch.testing.assert_close(method.evaluate(state, None, None, test).loss, F.cross_entropy(expected, test.y).view(1))


# ----------------------------------------------------------------------------- CELM


def test_celm_heads_are_the_client_state_of_the_run():
    """5 clients, 2 a round, T_w = 2: after 2 rounds the run's client state holds, for each client
    that trained, the head of its last upload; none for the others; after warm-up it stays."""
    config = make_config(dataset="synthetic", fraction=0.15, test_samples=60, model="mlp", n_clients=5,
                         clients_per_round=2, rounds=4, batch_size=32, lr=0.05, seed=7,
                         method={"name": "celm", "warmup_fraction": 0.5, "lm_steps": 3})
    p = prepare(config)
    method, seen = p.method, []
    update_client_state = method.update_client_state

    def recorded(state, weights, global_flat, global_buffers):
        new = update_client_state(state, weights, global_flat, global_buffers)
        seen.append((state.updates.clients.copy(), state.updates.flat.clone(), new))
        return new

    method.update_client_state = recorded
    execute(p, progress=False)
    assert len(seen) == 4
    heads = seen[1][2].tensors  # after round 2 (the last warm-up round)
    last_upload = {}
    for clients, flat, _ in seen[:2]:
        for row, client in enumerate(clients):
            last_upload[int(client)] = flat[row, method._head_index]
    assert heads["has_head"].tolist() == [c in last_upload for c in range(5)]
    for client in range(5):
        expected = last_upload.get(client, torch.zeros(len(method._head_index)))
        assert torch.equal(heads["head"][client], expected), client
    assert seen[3][2] is seen[1][2]  # after warm-up no head moves
    assert not {"_heads", "_has_head"} & set(vars(method))


def test_celm_without_head_retention_keeps_no_client_state():
    method = build_method("celm", {"head_retention": False})
    assert method.init_client_state(None, torch.zeros(3), {}) is None


# ----------------------------------------------------------------------------- registration


@pytest.fixture
def halves():
    @dataclass
    class Halves(Method):
        name = "_halves_test"

        def weigh(self, state, updates):
            return torch.full((len(updates.clients),), 1.0 / len(updates.clients))

    yield Halves
    METHODS.pop("_halves_test", None)  # other tests iterate over the library's methods


def test_a_method_registers_itself_under_its_name(halves):
    assert register(halves) is halves and METHODS["_halves_test"] is halves
    assert isinstance(build_method("_halves_test"), halves)
    result = run(make_config(dataset="synthetic", fraction=0.15, test_samples=60, model="mlp", n_clients=4, rounds=1,
                             batch_size=32, seed=7, method="_halves_test"), cache=False, progress=False)
    assert result.history[0]["weights"] == [0.25] * 4


def test_a_taken_name_is_a_one_line_error(halves):
    register(halves)

    class Other(Method):
        name = "_halves_test"

    with pytest.raises(ValueError) as info:
        register(Other)
    taken = f"{halves.__module__}.{halves.__qualname__}"
    assert str(info.value) == (f"method '_halves_test': the name is taken by {taken}; choose another name for "
                               f"{Other.__module__}.{Other.__qualname__}")
    assert METHODS["_halves_test"] is halves

    class MyFedAvg(Method):
        name = "fedavg"

    with pytest.raises(ValueError, match=r"^method 'fedavg': the name is taken by fedlib\.methods\.fedavg\.FedAvg; "):
        register(MyFedAvg)
    assert METHODS["fedavg"].__module__ == "fedlib.methods.fedavg"


def test_a_method_without_a_name_is_refused_and_a_redefined_class_replaces_itself():
    class Nameless(Method):
        pass

    with pytest.raises(ValueError, match=r"^method class Nameless: set its name before registering it$"):
        register(Nameless)

    def define():  # the same class defined twice, as by a notebook cell run again
        class Again(Method):
            name = "_again_test"
        return register(Again)

    try:
        first, second = define(), define()
        assert first is not second and METHODS["_again_test"] is second
    finally:
        METHODS.pop("_again_test", None)


# ----------------------------------------------------------------------------- the server hook, the round's diagnostics


def test_the_server_hook_is_weigh_and_diagnostics_take_the_rounds_state():
    """No method keeps the old name ``aggregate`` (nor an alias of it), and ``diagnostics`` takes the
    round's state, in every registered method."""
    for name, cls in {"Method": Method, **METHODS}.items():
        assert not hasattr(cls, "aggregate"), f"{name}: defines aggregate (the hook is weigh)"
        assert list(inspect.signature(cls.diagnostics).parameters) == ["self", "state"], name


def _two_rounds(name):
    """``name`` on its golden federation for 2 rounds, ``diagnostics`` spied on: (the method after
    the run, the states ``diagnostics`` received, the history)."""
    p = prepare(make_config(golden.config_of(name).to_dict(), rounds=2))
    method, states = p.method, []
    hook = method.diagnostics

    def spy(state):
        states.append(state)
        return hook(state)

    method.diagnostics = spy
    result = execute(p, progress=False)
    del method.diagnostics
    return method, states, result.history


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_rounds_diagnostics_travel_in_its_state_not_on_the_method(name):
    """After two rounds no method holds an attribute ``last`` (the old home of a round's diagnostics,
    with ``_diagnostics`` and ``_round_diagnostics``);
    the engine hands ``diagnostics`` each round's own state; what a round's hooks put in
    ``state.round_data["diagnostics"]`` is that round's record (the same keys; all of them when the
    method keeps the default hook)."""
    method, states, history = _two_rounds(name)
    assert not {"last", "_diagnostics", "_round_diagnostics"} & set(vars(method)), f"{name}: a round's data on self"
    assert [type(s) for s in states] == [RoundState, RoundState] and [s.round for s in states] == [0, 1]
    assert states[0] is not states[1]
    for state, record in zip(states, history):
        kept = set(state.round_data.get("diagnostics") or {})
        recorded = set(record.get("diagnostics") or {})
        assert kept <= recorded, (name, record["round"])
        if type(method).diagnostics is Method.diagnostics:
            assert recorded == kept, (name, record["round"])


def test_a_method_keeping_its_diagnostics_on_itself_is_caught():
    """The check above can fail: a method that writes ``self.last`` in ``weigh``."""

    @dataclass
    class OnSelf(Method):
        name = "_on_self_test"

        def weigh(self, state, updates):
            self.last = {"n": len(updates.clients)}
            return torch.full((len(updates.clients),), 1.0 / len(updates.clients))

        def diagnostics(self, state):
            return self.last

    register(OnSelf)
    try:
        method, states, history = _two_rounds("_on_self_test")
    finally:
        METHODS.pop("_on_self_test", None)
    assert vars(method)["last"] == {"n": 4} and history[1]["diagnostics"] == {"n": 4}
    assert all(not s.round_data for s in states)  # nothing of the round in its state
