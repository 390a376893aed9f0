"""The per-client order of a CPU round (LocalTraining.order="clients"): each client trained alone by plain
autograd gives the vectorized plan's and the loop oracle's numbers; its schedule and rule, by hand."""

from dataclasses import replace

import pytest
import torch

from fedlib.models import build_model
from fedlib.plans import (CLIENT_ORDER_MIN_FLOPS, CLIENT_ORDER_MIN_STEPS, client_order, client_schedule, execution_plan,
                          step_flops)
from fedlib.population import LocalTraining, ParamLayout, make_client_batches, stack_buffers
from fedlib.training import train_clients
from fedlib.testing import train_clients_loop

from test_cpu_plan import CONFIG_IDS, CONFIGS, SIZES, TinyBN, _federation, extra_loss_federation


def _train(model, x, y, indices, cfg, augment=False, loop=False):
    layout = ParamLayout(model)
    batches = make_client_batches(indices, cfg.batch_size, cfg.epochs, torch.Generator().manual_seed(1), augment=augment)
    fn = train_clients_loop if loop else train_clients
    return fn(model, layout.flat_of(model), stack_buffers(layout.buffers_of(model), 1), x, y, batches, cfg)


def _close(a, b, rel=1e-6):
    scale = b[0].abs().max()
    assert float((a[0] - b[0]).abs().max() / scale) < rel
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        assert torch.allclose(a[1][k].float(), b[1][k].float(), rtol=1e-5, atol=1e-6), k


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
def test_client_order_equals_the_vectorized_plan_and_the_loop(cfg, workers):
    """BatchNorm statistics, momentum, prox anchors and per-client learning rates, on unequal clients."""
    torch.manual_seed(0)
    model = TinyBN()
    x, y, indices = _federation(SIZES, (12,), 3)
    cfg = replace(cfg, workers=workers, compile="off")
    alone = _train(model, x, y, indices, replace(cfg, order="clients"))
    _close(alone, _train(model, x, y, indices, replace(cfg, order="vectorized")))
    start = ParamLayout(model).flat_of(model)
    assert float((alone[0] - start).abs().max()) > 1e-2  # it trained
    mlp = build_model("mlp", (1, 3, 4), 3)  # the loop oracle (torch's BatchNorm refuses a batch of one sample)
    _close(_train(mlp, x, y, indices, replace(cfg, order="clients")), _train(mlp, x, y, indices, cfg, loop=True))


def test_client_order_with_a_convolution_an_extra_loss_and_augmentation():
    """Per-client context and crop codes follow their client; the extra loss acts."""
    model, x, y, indices, scale, cfg = extra_loss_federation()
    alone = _train(model, x, y, indices, replace(cfg, order="clients"), augment=True)
    _close(alone, _train(model, x, y, indices, replace(cfg, order="vectorized"), augment=True))
    moved = _train(model, x, y, indices, replace(cfg, order="clients", client_context=scale * 100), augment=True)
    assert float((moved[0] - alone[0]).abs().max()) > 1e-4


def test_a_model_with_an_unused_parameter_gets_a_zero_gradient():
    """torch.func.grad gives zeros for a parameter the loss does not use; so does the client's plain step."""
    torch.manual_seed(0)
    model = TinyBN()
    model.unused = torch.nn.Linear(2, 2)
    x, y, indices = _federation([10, 7], (12,), 3)
    cfg = LocalTraining(epochs=1, batch_size=4, lr=0.1, workers=1)
    alone = _train(model, x, y, indices, replace(cfg, order="clients"))
    _close(alone, _train(model, x, y, indices, replace(cfg, order="vectorized")))


def test_schedule_by_hand():
    steps = torch.tensor([9, 1, 5, 1, 8, 2, 3])
    # longest first: 0 (9), 4 (8), 2 (5), 6 (3), 5 (2), 1 (1), 3 (1); 7 mod 2 = 1 client left for the tail: 3.
    # The other six in a snake 0 1 1 0 0 1: worker 0 gets 0, 6, 5 (14 steps), worker 1 gets 4, 2, 1 (14 steps).
    assert client_schedule(steps, 2) == ([[0, 6, 5], [4, 2, 1]], [3])
    assert client_schedule(steps, 1) == ([[0, 4, 2, 6, 5, 1, 3]], [])
    assert client_schedule(torch.tensor([4, 4, 4, 4, 4]), 2) == ([[0, 3], [1, 2]], [4])  # 2 + 2, then 1 on both
    assert client_schedule(torch.tensor([3, 7]), 2) == ([[1], [0]], [])


def test_step_flops_by_hand():
    mlp = build_model("mlp", (1, 4, 3), 3)  # 12-256-128-64-3: 2 FLOPs per multiply-add
    assert step_flops(mlp, torch.zeros(1, 4, 3), 8) == 8 * 2 * (12 * 256 + 256 * 128 + 128 * 64 + 64 * 3)


def test_the_rule_and_its_error(monkeypatch):
    monkeypatch.delenv("FEDLIB_CPU_ORDER", raising=False)
    cfg, big, small = LocalTraining(), CLIENT_ORDER_MIN_FLOPS, CLIENT_ORDER_MIN_FLOPS / 2
    mlp, cnn = build_model("mlp", (1, 8, 8), 10), build_model("cnn", (3, 16, 16), 10)
    assert client_order(cfg, "cpu", cnn, 1.0, big) == "clients"  # convolutions: at any number of steps
    assert client_order(cfg, "cpu", cnn, 100.0, small) == "vectorized"  # a small step costs more alone
    assert client_order(cfg, "cpu", mlp, CLIENT_ORDER_MIN_STEPS, big) == "clients"
    assert client_order(cfg, "cpu", mlp, CLIENT_ORDER_MIN_STEPS - 1, big) == "vectorized"
    assert client_order(cfg, "cpu", mlp, CLIENT_ORDER_MIN_STEPS) == "vectorized"  # no step size known
    assert client_order(cfg, "cuda", cnn, 100.0, big) == "vectorized"
    assert client_order(replace(cfg, compile="on"), "cpu", cnn, 100.0, big) == "vectorized"  # captured steps
    assert client_order(replace(cfg, order="vectorized"), "cpu", cnn, 100.0, big) == "vectorized"
    assert client_order(replace(cfg, order="clients"), "cpu", mlp, 1.0, small) == "clients"
    assert step_flops(cnn, torch.zeros(3, 16, 16), cfg.batch_size) >= big  # batch 128
    assert execution_plan(cfg, 5, "cpu", cnn, torch.zeros(3, 16, 16), 10.0)["order"] == "clients"
    assert execution_plan(cfg, 5, "cpu", cnn)["order"] == "vectorized"  # without a sample: no step size known
    monkeypatch.setenv("FEDLIB_CPU_ORDER", "vectorized")
    assert client_order(cfg, "cpu", cnn, 100.0, big) == "vectorized"
    monkeypatch.setenv("FEDLIB_CPU_ORDER", "loop")
    with pytest.raises(ValueError, match=r"^LocalTraining.order \(or FEDLIB_CPU_ORDER\): must be one of auto, "
                                         r"vectorized, clients \(got 'loop'\)$"):
        client_order(cfg, "cpu", mlp, 1.0, big)


@pytest.mark.parametrize("min_flops, expected", [(0.0, "clients"), (float("inf"), "vectorized")])
def test_the_engine_takes_the_rule(monkeypatch, min_flops, expected):
    """Under auto a conv model's round goes client by client when its step is large enough: the numbers are
    the forced order's, bit for bit."""
    import fedlib.plans as plans

    monkeypatch.delenv("FEDLIB_CPU_ORDER", raising=False)
    monkeypatch.setattr(plans, "CLIENT_ORDER_MIN_FLOPS", min_flops)
    torch.manual_seed(0)
    model = build_model("cnn", (3, 16, 16), 4)
    x, y, indices = _federation([12, 5, 9], (3, 16, 16), 4)
    cfg = LocalTraining(epochs=1, batch_size=4, lr=0.05, workers=2)
    auto, forced = _train(model, x, y, indices, cfg), _train(model, x, y, indices, replace(cfg, order=expected))
    assert torch.equal(auto[0], forced[0])
    assert execution_plan(cfg, 3, "cpu", model, x[0], 2.0)["order"] == expected  # the plan benchmarks report


def test_the_page_sentence_and_table_by_hand():
    from fedlib.app.chapters.performance import cpu_order_table, cpu_order_text

    def row(model, n, vec, cli, loop, order):
        return {"model": model, "split": "iid", "N": n, "seconds": {"vectorized": vec, "clients": cli, "loop": loop},
                "vectorized_over_clients": round(vec / cli, 3), "loop_over_clients": round(loop / cli, 3),
                "plan": {"order": order}}

    record = {"device": "cpu (x86_64, 2 cores, 2 threads)",
              "rows": [row("mlp", 5, 0.6, 0.5, 0.55, "clients"),  # right: loop / engine 1.10
                       row("mlp", 100, 0.4, 0.5, 0.6, "vectorized"),  # right: 1.50
                       row("lenet5", 20, 3.0, 2.0, 2.4, "vectorized")]}  # wrong: 0.80
    assert cpu_order_text(record) == ("cpu (x86_64, 2 cores, 2 threads): the engine's plan ran 0.80-1.50x the loop's "
                                      "speed over 3 shapes; the rule took the faster plan in 2 of 3 "
                                      "(not at lenet5 N = 20 (iid))")
    table = cpu_order_table(record)
    assert list(table["rule takes"]) == ["clients", "vectorized", "vectorized"]
    assert table.loc[("mlp", "iid", 100), "loop / clients"] == 1.2
