"""Convolutions as unfold + matmul (fedlib.layers.Conv2d) against torch's convolution, and the
engine's choice of lowering per shape (fedlib.training.conv_lowering_for)."""

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

import fedlib.layers as layers
from fedlib import training
from fedlib.layers import Conv2d, conv2d_as_matmul, conv_lowering, current_conv_lowering
from fedlib.models import build_model
from fedlib.plans import execution_plan
from fedlib.population import LocalTraining, ParamLayout, make_client_batches, stack_buffers
from fedlib.training import conv_lowering_for, time_conv_lowerings, train_clients


def _rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


@pytest.mark.parametrize("stride,padding,bias,kernel", [(1, 0, True, 5), (2, 1, False, 3), (1, 1, True, 3), (2, 0, False, 1)])
def test_matmul_lowering_equals_conv2d_values_and_gradients(stride, padding, bias, kernel):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 11, 9, generator=g, requires_grad=True)
    w = torch.randn(6, 3, kernel, kernel, generator=g, requires_grad=True)
    b = torch.randn(6, generator=g, requires_grad=True) if bias else None
    ours = conv2d_as_matmul(x, w, b, (stride, stride), (padding, padding))
    theirs = F.conv2d(x, w, b, stride=stride, padding=padding)
    assert ours.shape == theirs.shape
    assert _rel(ours, theirs) < 1e-5
    upstream = torch.randn(theirs.shape, generator=g)
    wrt = [x, w] + ([b] if bias else [])
    for a, c in zip(torch.autograd.grad((ours * upstream).sum(), wrt), torch.autograd.grad((theirs * upstream).sum(), wrt)):
        assert _rel(a, c) < 1e-5


def test_vmapped_over_stacked_weights_both_lowerings_agree():
    """The packed case: M models' weights stacked, each model on its own batch."""
    torch.manual_seed(0)
    conv = Conv2d(3, 8, 5)
    m = 6
    weights = {"weight": torch.randn(m, 8, 3, 5, 5), "bias": torch.randn(m, 8)}
    x = torch.randn(m, 2, 3, 12, 12)

    def loss(p, xb):
        return functional_call(conv, p, (xb,)).square().sum()

    step = vmap(grad(loss))
    native = step(weights, x)
    with conv_lowering("matmul"):
        matmul = step(weights, x)
    for k in weights:
        assert _rel(matmul[k], native[k]) < 1e-5
    assert current_conv_lowering() == "native"  # the block restores the default


def test_conv2d_is_torch_conv2d_outside_the_block():
    """Same parameters, initialisation and state dict: stored runs' keys and numbers stay."""
    torch.manual_seed(3)
    ours = Conv2d(3, 16, 5, padding=2)
    torch.manual_seed(3)
    theirs = nn.Conv2d(3, 16, 5, padding=2)
    assert isinstance(ours, nn.Conv2d)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v)
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(ours(x), theirs(x))


def test_unknown_lowering_is_one_line_error(monkeypatch):
    with pytest.raises(ValueError, match=r"conv lowering: must be one of native, matmul \(got 'im2col'\)"):
        with conv_lowering("im2col"):
            pass
    monkeypatch.setenv("FEDLIB_CONV", "fast")
    with pytest.raises(ValueError, match=r"FEDLIB_CONV\): must be one of native, matmul, auto \(got 'fast'\)"):
        execution_plan(LocalTraining(), 4, "cpu")
    monkeypatch.setenv("FEDLIB_CONV", "matmul")
    assert execution_plan(LocalTraining(), 4, "cpu")["conv"] == "matmul"


def _cnn_federation(n_clients=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    sizes = np.random.default_rng(seed).integers(8, 30, size=n_clients)
    x = torch.randn(int(sizes.sum()), 3, 16, 16, generator=g)
    y = torch.randint(0, 10, (len(x),), generator=g)
    indices = np.split(np.arange(len(x)), np.cumsum(sizes)[:-1])
    return x, y, indices


def _train(model, x, y, indices, cfg):
    layout = ParamLayout(model)
    batches = make_client_batches(indices, cfg.batch_size, cfg.epochs, torch.Generator().manual_seed(1))
    return train_clients(model, layout.flat_of(model), stack_buffers(layout.buffers_of(model), 1), x, y, batches, cfg)


@pytest.fixture
def matmul_calls(monkeypatch):
    calls = []
    real = layers.conv2d_as_matmul

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(layers, "conv2d_as_matmul", counted)
    return calls


@pytest.mark.parametrize("workers", [1, 2])
def test_training_under_matmul_equals_native(workers, matmul_calls):
    """Every client's trained parameters agree to float summation order; with 2 worker threads the
    lowering reaches the threads that train."""
    torch.manual_seed(0)
    model = build_model("cnn", (3, 16, 16), 10)
    x, y, indices = _cnn_federation()
    cfg = LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.9, compile="off", workers=workers)
    native, _ = _train(model, x, y, indices, replace(cfg, conv="native"))
    assert not matmul_calls
    matmul, _ = _train(model, x, y, indices, replace(cfg, conv="matmul"))
    assert matmul_calls
    assert _rel(matmul, native) < 1e-5
    start = ParamLayout(model).flat_of(model)
    assert (native - start).abs().amax(1).min() > 1e-3  # every client trained


def test_auto_is_native_on_a_cpu_without_timing(monkeypatch, matmul_calls):
    monkeypatch.delenv("FEDLIB_CONV", raising=False)
    monkeypatch.setattr(training, "time_conv_lowerings", lambda *a, **k: pytest.fail("timed on a CPU"))
    torch.manual_seed(0)
    model = build_model("cnn", (3, 16, 16), 10)
    x, y, indices = _cnn_federation()
    _train(model, x, y, indices, LocalTraining(epochs=1, batch_size=8, compile="off", workers=1))
    assert not matmul_calls


def test_auto_takes_the_faster_lowering_timed_once_per_shape(monkeypatch, matmul_calls):
    """With autotuning, the measured faster lowering trains (faked timings: matmul faster), and a
    second call of the same shape reuses the choice without timing again."""
    timings = []

    def fake(*args, **kwargs):
        timings.append(1)
        return {"native": 0.02, "matmul": 0.01}

    monkeypatch.setattr(training, "time_conv_lowerings", fake)
    real_for = training.conv_lowering_for
    monkeypatch.setattr(training, "conv_lowering_for", lambda *a, **k: real_for(*a, **{**k, "autotune": True}))
    monkeypatch.setattr(training, "CONV_CHOICES", {})
    torch.manual_seed(0)
    model = build_model("cnn", (3, 16, 16), 10)
    x, y, indices = _cnn_federation()
    cfg = LocalTraining(epochs=1, batch_size=8, compile="off", workers=1, conv="auto")
    _train(model, x, y, indices, cfg)
    _train(model, x, y, indices, cfg)
    assert timings == [1] and matmul_calls
    (choice,) = training.CONV_CHOICES.values()
    assert choice == {"lowering": "matmul", "seconds": {"native": 0.02, "matmul": 0.01}}
    # a run's provenance: the choice by shape (6 clients x batch 8) with the step times in ms
    assert training.conv_choices_for(model, "cpu") == {"6 x 8": {"lowering": "matmul",
                                                                   "step_ms": {"native": 20.0, "matmul": 10.0}}}
    assert training.conv_choices_for(build_model("lenet5", (3, 32, 32), 10), "cpu") == {}


def test_mlp_never_times_lowerings(monkeypatch):
    monkeypatch.setattr(training, "time_conv_lowerings", lambda *a, **k: pytest.fail("an MLP has no convolution"))
    model = build_model("mlp", (1, 8, 8), 10)
    layout = ParamLayout(model)
    x, y = torch.randn(20, 1, 8, 8), torch.randint(0, 10, (20,))
    assert conv_lowering_for(model, layout, x, y, 2, 4, {}, LocalTraining(conv="auto"), autotune=True) == "native"


def test_timing_runs_each_lowering_on_scratch_tensors():
    """The real timing path (captured step run eagerly on its static tensors on a CPU): one entry
    per lowering, each the best of its repeats under a clock that counts the lowering's cost."""
    torch.manual_seed(0)
    model = build_model("cnn", (3, 16, 16), 10)
    layout = ParamLayout(model)
    before = layout.flat_of(model).clone()
    x, y = torch.randn(40, 3, 16, 16), torch.randint(0, 10, (40,))
    ticks = {"t": 0.0}

    def clock():  # each reading advances 1 under matmul, 3 under native
        ticks["t"] += 1.0 if current_conv_lowering() == "matmul" else 3.0
        return ticks["t"]

    seconds = time_conv_lowerings(model, layout, x, y, 3, 4, {}, LocalTraining(momentum=0.9), repeats=2, clock=clock)
    assert seconds == {"native": 3.0, "matmul": 1.0}
    assert torch.equal(layout.flat_of(model), before)


def test_pack_memory_estimate_counts_unfolded_columns():
    """bytes_per_row by hand for the CIFAR-10 CNN: leaf outputs conv1 16x28x28, conv2 32x10x10, fc 120, 84,
    head 10, plus twice each convolution's columns (3*25 x 784 and 16*25 x 100); 121,182 parameters."""
    from fedlib.packing import bytes_per_row

    model = build_model("cnn", (3, 32, 32), 10)
    assert ParamLayout(model).size == 1216 + 12832 + 96120 + 10164 + 850
    elements = 16 * 28 * 28 + 2 * 75 * 784 + 32 * 10 * 10 + 2 * 400 * 100 + 120 + 84 + 10
    assert bytes_per_row(model, (3, 32, 32), 2) == 4 * (6 * 121182 + 2 * elements * 2)
