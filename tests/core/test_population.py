"""The vectorized population engine against the per-client loop oracle."""

import copy
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from fedlib.models import build_model
from fedlib.population import (LocalTraining, ParamLayout, aggregate, evaluate, make_client_batches, padded_indices,
                               predict, stack_buffers)
from fedlib.training import train_clients
from fedlib.testing import train_clients_loop


def _federation(n_clients, shape, n_classes, seed=0, low=5, high=60):
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    sizes = rng.integers(low, high, size=n_clients)
    total = int(sizes.sum())
    x = torch.randn(total, *shape, generator=g)
    y = torch.randint(0, n_classes, (total,), generator=g)
    perm = rng.permutation(total)
    indices = np.split(perm, np.cumsum(sizes)[:-1])
    return x, y, indices


def _both(model, x, y, indices, cfg, seed=1):
    layout = ParamLayout(model)
    batches = make_client_batches(indices, cfg.batch_size, cfg.epochs, torch.Generator().manual_seed(seed))
    start = layout.flat_of(model)
    bufs = stack_buffers(layout.buffers_of(model), 1)
    fast = train_clients(model, start, bufs, x, y, batches, cfg)
    slow = train_clients_loop(model, start, bufs, x, y, batches, cfg)
    return fast, slow, start


@pytest.mark.parametrize(
    "cfg",
    [
        LocalTraining(epochs=2, batch_size=16, lr=0.1),
        LocalTraining(epochs=1, batch_size=16, lr=0.05, prox_mu=1.0),
        LocalTraining(epochs=2, batch_size=16, lr=0.05, momentum=0.9, weight_decay=5e-4, prox_mu=0.1),
    ],
    ids=["sgd", "fedprox", "momentum-wd-prox"],
)
def test_vectorized_equals_loop_for_20_unequal_clients(cfg):
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)
    x, y, indices = _federation(20, (1, 8, 8), 10)
    assert len({len(ix) for ix in indices}) > 5  # really unequal sizes
    (fast, _), (slow, _), start = _both(model, x, y, indices, cfg)
    assert fast.shape == (20, ParamLayout(model).size)
    assert (fast - start).abs().max() > 1e-2  # training moved the parameters
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=0)


def test_vectorized_equals_loop_with_batchnorm():
    torch.manual_seed(0)
    model = build_model("resnet20", (3, 8, 8), 10)
    x, y, indices = _federation(20, (3, 8, 8), 10, low=6, high=30)
    cfg = LocalTraining(epochs=1, batch_size=8, lr=0.05)
    (fast, fast_bufs), (slow, slow_bufs), start = _both(model, x, y, indices, cfg)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=0)
    for name in fast_bufs:
        torch.testing.assert_close(fast_bufs[name].double(), slow_bufs[name].double(), atol=1e-5, rtol=0)
    running = [k for k in fast_bufs if k.endswith("running_mean")]
    assert running and all((fast_bufs[k] != 0).any() for k in running)  # statistics were updated


def test_chunking_gives_identical_results():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)
    x, y, indices = _federation(9, (1, 8, 8), 10)
    layout = ParamLayout(model)
    batches = make_client_batches(indices, 16, 1, torch.Generator().manual_seed(3))
    whole, _ = train_clients(model, layout.flat_of(model), {}, x, y, batches, LocalTraining(batch_size=16))
    chunked, _ = train_clients(model, layout.flat_of(model), {}, x, y, batches,
                               LocalTraining(batch_size=16, chunk_size=4))
    torch.testing.assert_close(whole, chunked, atol=1e-6, rtol=0)  # bmm blocking may differ


def test_client_batches_cover_each_client_once_per_epoch():
    indices = [np.arange(0, 7), np.arange(7, 30), np.array([30])]
    b = make_client_batches(indices, 4, 2, torch.Generator().manual_seed(0))
    assert b.steps == 2 * 6  # ceil(23 / 4) = 6 steps per epoch
    for i, ix in enumerate(indices):
        for epoch in range(2):
            steps = slice(6 * epoch, 6 * (epoch + 1))
            seen = b.index[steps, i][b.mask[steps, i] > 0]
            assert sorted(seen.tolist()) == sorted(ix.tolist())
    table, sizes = padded_indices(indices)
    assert sizes.tolist() == [7, 23, 1] and table.shape == (3, 23)


def test_aggregate_is_weighted_average_and_handles_subsets():
    flat = torch.arange(12.0).view(3, 4)
    w = torch.tensor([0.5, 0.25, 0.25])
    torch.testing.assert_close(aggregate(flat, w), 0.5 * flat[0] + 0.25 * flat[1] + 0.25 * flat[2])
    subsets = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0]])
    out, bufs = aggregate(flat, subsets, {"bn.running_mean": flat.clone(), "n": torch.tensor([1, 5, 3])})
    torch.testing.assert_close(out, torch.stack([flat[0], (flat[0] + flat[1]) / 2]))
    assert bufs["n"].tolist() == [5, 5]


def test_evaluate_matches_per_model_forward():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 5)
    layout = ParamLayout(model)
    flats = torch.stack([layout.flat_of(build_model("mlp", (1, 8, 8), 5)) for _ in range(3)])
    x = torch.randn(300, 1, 8, 8)
    y = torch.randint(0, 5, (300,))
    ev = evaluate(model, flats, {}, x, y, 5, batch_size=64, model_chunk=2)
    logits = predict(model, flats, {}, x, batch_size=64)
    for m in range(3):
        layout.load_into(model, flats[m])
        with torch.no_grad():
            ref = model(x)
        torch.testing.assert_close(logits[m], ref, atol=1e-5, rtol=1e-5)
        pred = ref.argmax(1)
        assert ev.accuracy[m].item() == pytest.approx((pred == y).float().mean().item())
        per_class = [(pred[y == c] == c).float().mean().item() for c in range(5)]
        np.testing.assert_allclose(ev.per_class_accuracy[m].numpy(), per_class, atol=1e-6)
        assert ev.balanced_accuracy[m].item() == pytest.approx(np.mean(per_class), abs=1e-6)
        assert ev.confusion[m].sum().item() == 300
        expected_loss = torch.nn.functional.cross_entropy(ref, y).item()
        assert ev.loss[m].item() == pytest.approx(expected_loss, rel=1e-5)


# -- the captured step and CPU worker groups (fedlib.plans.step_backend / cpu_workers) --------


@pytest.mark.parametrize(
    "cfg",
    [
        LocalTraining(epochs=2, batch_size=16, lr=0.1),
        LocalTraining(epochs=2, batch_size=16, lr=0.05, momentum=0.9, weight_decay=5e-4, prox_mu=0.1),
    ],
    ids=["sgd", "momentum-wd-prox"],
)
def test_static_replayed_step_equals_eager_bitwise(cfg, monkeypatch, one_thread):
    """The static-buffer step that CUDA graphs and inductor capture, run eagerly on CPU: the same
    kernels on the same values (lr enters as (on * lr) * g with on in {0, 1}: exact), so the
    parameters and BatchNorm statistics must be bit-identical to the eager engine's."""
    import fedlib.plans as plans
    import fedlib.training as training

    for name, shape, n_clients, low, high in (("mlp", (1, 8, 8), 7, 5, 60), ("resnet20", (3, 8, 8), 4, 6, 30)):
        torch.manual_seed(0)
        model = build_model(name, shape, 10)
        x, y, indices = _federation(n_clients, shape, 10, low=low, high=high)
        layout = ParamLayout(model)
        batches = make_client_batches(indices, cfg.batch_size, cfg.epochs, torch.Generator().manual_seed(1))
        start, bufs = layout.flat_of(model), stack_buffers(layout.buffers_of(model), 1)
        eager = train_clients(model, start, bufs, x, y, batches, replace(cfg, compile="off", workers=1, order="vectorized"))
        monkeypatch.setattr(plans, "step_backend", lambda *_: "static")
        training._CAPTURED.clear()
        for per_client_start in (False, True):  # a shared [P] start and a per-client [N, P] start
            s = start.expand(n_clients, -1).clone() if per_client_start else start
            replayed = train_clients(model, s, bufs, x, y, batches, replace(cfg, workers=1))
            ref = eager if not per_client_start else train_clients(
                model, start.expand(n_clients, -1).clone(), bufs, x, y, batches,
                replace(cfg, compile="off", workers=1, order="vectorized"))
            assert torch.equal(replayed[0], ref[0]), name
            for k in ref[1]:
                assert torch.equal(replayed[1][k], ref[1][k]), (name, k)
        sizes = [key[2] for key in training._CAPTURED]  # each size captured once, replayed for both calls
        assert len(sizes) == len(set(sizes)) and n_clients in sizes and len(sizes) <= training.REPLAY_BUCKETS
        monkeypatch.undo()
        assert (eager[0] - start).abs().max() > 1e-2


@pytest.mark.parametrize(
    "cfg",
    [
        LocalTraining(epochs=2, batch_size=8, lr=0.1),
        LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=5e-4, prox_mu=0.1),
        LocalTraining(epochs=1, batch_size=8, lr=torch.tensor([0.1, 0.05, 0.2, 0.1, 0.02, 0.1, 0.3, 0.1]),
                      momentum=0.5),
    ],
    ids=["sgd", "momentum-wd-prox", "per-client-lr"],
)
def test_compacted_replay_equals_the_masked_replay_bitwise(cfg, monkeypatch, one_thread):
    """Captured steps that replay only the clients with samples (padded to a quarter of the chunk) give
    the masked replay's and the eager step's parameters, momentum and BatchNorm statistics bit for bit,
    through the gaps a small client leaves between epochs, from a shared or a per-client start."""
    import fedlib.plans as plans
    import fedlib.training as training

    monkeypatch.setattr(plans, "step_backend", lambda *_: "static")
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)
    x, y, indices = _federation(8, (1, 8, 8), 10, low=4, high=70)
    layout = ParamLayout(model)
    batches = make_client_batches(indices, cfg.batch_size, cfg.epochs, torch.Generator().manual_seed(1))
    start, bufs = layout.flat_of(model), stack_buffers(layout.buffers_of(model), 1)
    for s in (start, start.expand(8, -1) + 0.01 * torch.randn(8, layout.size)):
        training._CAPTURED.clear()
        masked = train_clients(model, s.clone(), bufs, x, y, batches, replace(cfg, workers=1, balance=False))
        assert {key[2] for key in training._CAPTURED} == {8}
        training._CAPTURED.clear()
        compacted = train_clients(model, s.clone(), bufs, x, y, batches, replace(cfg, workers=1, balance=True))
        assert min(key[2] for key in training._CAPTURED) < 8  # smaller sizes were replayed
        eager = train_clients(model, s.clone(), bufs, x, y, batches, replace(cfg, compile="off", workers=1))
        assert torch.equal(compacted[0], masked[0]) and torch.equal(compacted[0], eager[0])
        assert (compacted[0] - s).abs().max() > 1e-2


def test_compacted_replay_equals_the_masked_replay_with_batchnorm(monkeypatch, one_thread):
    """ResNet-20 (BatchNorm): statistics of clients left out stay put; a convolution over fewer clients
    may sum in another order, so parameters agree to float precision."""
    import fedlib.plans as plans

    monkeypatch.setattr(plans, "step_backend", lambda *_: "static")
    torch.manual_seed(0)
    model = build_model("resnet20", (3, 8, 8), 10)
    x, y, indices = _federation(4, (3, 8, 8), 10, low=6, high=40)
    layout = ParamLayout(model)
    batches = make_client_batches(indices, 8, 1, torch.Generator().manual_seed(1))
    start, bufs = layout.flat_of(model), stack_buffers(layout.buffers_of(model), 1)
    cfg = LocalTraining(batch_size=8, lr=0.05, momentum=0.9, workers=1)
    masked = train_clients(model, start, bufs, x, y, batches, replace(cfg, balance=False))
    compacted = train_clients(model, start, bufs, x, y, batches, replace(cfg, balance=True))
    torch.testing.assert_close(compacted[0], masked[0], rtol=0, atol=1e-6)
    for k in masked[1]:
        torch.testing.assert_close(compacted[1][k], masked[1][k], rtol=0, atol=1e-6)


def test_replay_rows_pads_the_clients_with_samples_to_a_quarter():
    from fedlib.training import replay_rows

    active = torch.tensor([True, False, True, False, False, False, False, False])
    assert replay_rows(active).tolist() == [0, 2]  # 2 of 8: a quarter
    active[5] = True
    assert replay_rows(active).tolist() == [0, 1, 2, 5]  # 3 of 8: padded with the first idle client
    assert replay_rows(torch.ones(8, dtype=torch.bool)) is None  # all: the full replay
    assert replay_rows(torch.tensor([True] * 7 + [False])) is None  # 7 of 8 rounds up to all
    assert replay_rows(torch.tensor([False, True, False])).tolist() == [1]  # quarters of 3 are 1 client


def test_compacted_replay_setting_is_checked(monkeypatch):
    from fedlib.plans import compacted_replay

    cfg = LocalTraining(compile="on")
    monkeypatch.setenv("FEDLIB_COMPACT", "off")
    assert not compacted_replay(cfg, "cpu") and compacted_replay(replace(cfg, balance=True), "cpu")
    assert not compacted_replay(LocalTraining(compile="off", balance=True), "cpu")  # eager: the CPU plan's
    monkeypatch.setenv("FEDLIB_COMPACT", "yes")
    with pytest.raises(ValueError, match="FEDLIB_COMPACT: must be on or off"):
        compacted_replay(cfg, "cpu")


def test_cpu_worker_groups_equal_one_vectorized_call(one_thread):
    """Two threads, each training a group of clients with one intra-op thread, give the same
    parameters as one call over all clients (chunking differs only by GEMM blocking, <= 1e-6)."""
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)
    x, y, indices = _federation(5, (1, 8, 8), 10)
    layout = ParamLayout(model)
    batches = make_client_batches(indices, 16, 2, torch.Generator().manual_seed(2))
    cfg = LocalTraining(batch_size=16, lr=0.1, momentum=0.5, compile="off")
    one, _ = train_clients(model, layout.flat_of(model), {}, x, y, batches, replace(cfg, workers=1))
    two, _ = train_clients(model, layout.flat_of(model), {}, x, y, batches, replace(cfg, workers=2))
    loop, _ = train_clients_loop(model, layout.flat_of(model), {}, x, y, batches, cfg)
    torch.testing.assert_close(two, one, atol=1e-6, rtol=0)
    torch.testing.assert_close(two, loop, atol=1e-5, rtol=0)
    assert torch.get_num_threads() == 1  # the caller's thread setting is restored
    # two trainings at once in one process (run_many on threads): the same numbers, and the
    # intra-op setting (here 3) comes back when the last one finishes
    from concurrent.futures import ThreadPoolExecutor

    torch.set_num_threads(3)
    try:
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda net: train_clients(net, layout.flat_of(model), {}, x, y, batches,
                                                           replace(cfg, workers=2))[0],
                                 [copy.deepcopy(model) for _ in range(4)]))  # one model per run, as in run()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(1)
    for out in both:
        assert torch.equal(out, two)


def test_step_backend_and_workers_choices(monkeypatch):
    monkeypatch.delenv("FEDLIB_COMPILE", raising=False)
    monkeypatch.delenv("FEDLIB_CPU_WORKERS", raising=False)
    from fedlib.plans import cpu_workers, step_backend

    assert step_backend(LocalTraining(), "cpu") == "eager"  # auto: CPU results stay the eager ones
    assert step_backend(LocalTraining(), "cuda") == "graph"
    assert step_backend(LocalTraining(compile="on"), "cpu") == "inductor"
    assert step_backend(LocalTraining(compile="off"), "cuda") == "eager"
    assert step_backend(LocalTraining(compile="on", extra_loss=lambda *a: 0), "cuda") == "eager"
    monkeypatch.setenv("FEDLIB_COMPILE", "off")
    assert step_backend(LocalTraining(), "cuda") == "eager"
    monkeypatch.setenv("FEDLIB_COMPILE", "fast")
    with pytest.raises(ValueError, match="FEDLIB_COMPILE.*off, auto, on.*'fast'"):
        step_backend(LocalTraining(), "cpu")
    monkeypatch.delenv("FEDLIB_COMPILE")
    assert cpu_workers(LocalTraining(workers=2), 5, "cpu") == 2
    assert cpu_workers(LocalTraining(workers=8), 3, "cpu") == 3  # never more groups than clients
    assert cpu_workers(LocalTraining(workers=2), 5, "cuda") == 1
    assert cpu_workers(LocalTraining(workers=2, compile="on"), 5, "cpu") == 1
    monkeypatch.setenv("FEDLIB_CPU_WORKERS", "1")
    assert cpu_workers(LocalTraining(), 5, "cpu") == 1
    with pytest.raises(ValueError, match="workers.*>= 1"):
        cpu_workers(LocalTraining(workers=0), 5, "cpu")


@pytest.mark.skipif(os.environ.get("FEDLIB_TEST_COMPILE") != "1",
                    reason="torch.compile takes ~20-80 s on 2 cores; benchmarks/gpu_check.sh sets FEDLIB_TEST_COMPILE=1")
def test_compiled_step_equals_eager():
    """compile="on": inductor on CPU, a CUDA graph on CUDA. A CUDA graph replays the eager kernels
    (bit-identical); inductor may fuse a*b+c into one rounding, so 1e-5 (the loop oracle's bound)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10).to(device)
    x, y, indices = _federation(6, (1, 8, 8), 10)
    x, y = x.to(device), y.to(device)
    layout = ParamLayout(model)
    batches = make_client_batches(indices, 16, 2, torch.Generator().manual_seed(1))
    batches.index, batches.mask = batches.index.to(device), batches.mask.to(device)
    cfg = LocalTraining(batch_size=16, lr=0.1, momentum=0.9, weight_decay=5e-4, prox_mu=0.1, workers=1)
    eager, _ = train_clients(model, layout.flat_of(model), {}, x, y, batches, replace(cfg, compile="off"))
    for _ in range(2):  # the second call replays the step captured by the first
        fast, _ = train_clients(model, layout.flat_of(model), {}, x, y, batches, replace(cfg, compile="on"))
        if device.type == "cuda":
            assert torch.equal(fast, eager)
        else:
            torch.testing.assert_close(fast, eager, atol=1e-5, rtol=0)
    assert (eager - layout.flat_of(model)).abs().max() > 1e-2


def test_warm_up_runs_once_per_architecture_and_leaves_the_rng_alone(one_thread):
    import fedlib.training as training

    model = build_model("mlp", (1, 5, 5), 3)
    x, y = torch.randn(10, 1, 5, 5), torch.randint(0, 3, (10,))
    training._WARM.discard((type(model), ParamLayout(model).size, "cpu"))
    torch.manual_seed(7)
    before = torch.get_rng_state()
    assert training.warm_up(model, x, y) > 0.0
    assert training.warm_up(model, x, y) == 0.0  # the same architecture: nothing left to warm
    assert torch.equal(torch.get_rng_state(), before)


def test_run_reports_set_up_apart_from_its_rounds(one_thread):
    """The first round no longer carries the one-time costs: they are in meta and the summary."""
    import fedlib
    from fedlib.config import make_config

    r = fedlib.run(make_config(dict(dataset="synthetic", model="mlp", n_clients=3, rounds=2, batch_size=16,
                                    local_epochs=1, lr=0.1, seed=0)), cache=False, progress=False)
    assert r.meta["time_load"] > 0 and r.meta["warmup_s"] >= 0
    assert r.meta["cpu_time"] > 0  # the rounds' process CPU seconds: runs per core-hour from the store
    for h in r.history:  # a round's parts never exceed the round
        assert h["time_train"] + h["time_server"] + h.get("time_eval", 0.0) <= h["time_round"]
    assert "not in wall: data and model" in r.summary()


def test_crop_flip_equals_the_per_image_oracle_and_known_codes():
    from fedlib.population import CROP_CODES, crop_flip
    from fedlib.testing import crop_flip_one

    g = torch.Generator().manual_seed(0)
    xb = torch.randn(3, 5, 2, 6, 7, generator=g)  # [rows, B, C, H, W]
    codes = torch.randint(0, CROP_CODES, (3, 5), generator=g)
    fill = (-1.5, 2.0)
    ours = crop_flip(xb, codes, torch.tensor(fill))
    oracle = torch.stack([torch.stack([crop_flip_one(xb[r, b], int(codes[r, b]), fill) for b in range(5)])
                          for r in range(3)])
    assert torch.equal(ours, oracle)
    img = xb[0, 0]
    centre = 4 * 9 + 4  # dy = dx = 4 (the padding): the image itself; + 81: mirrored
    assert torch.equal(crop_flip(img[None], torch.tensor([centre]), torch.tensor(fill))[0], img)
    assert torch.equal(crop_flip(img[None], torch.tensor([81 + centre]), torch.tensor(fill))[0], img.flip(-1))
    corner = crop_flip(img[None], torch.tensor([0]), torch.tensor(fill))[0]  # shifted 4 down and right
    assert torch.equal(corner[:, 4:, 4:], img[:, :-4, :-4]) and bool((corner[0, :4] == -1.5).all())


def test_augmented_vectorized_training_equals_the_loop_and_changes_nothing_when_off():
    torch.manual_seed(0)
    model = build_model("lenet5", (1, 28, 28), 4)
    x, y, indices = _federation(4, (1, 28, 28), 4, low=5, high=20)
    layout = ParamLayout(model)
    start, bufs = layout.flat_of(model), stack_buffers(layout.buffers_of(model), 1)
    plain = make_client_batches(indices, 8, 1, torch.Generator().manual_seed(1))
    batches = make_client_batches(indices, 8, 1, torch.Generator().manual_seed(1), augment=True)
    assert torch.equal(batches.index[:1], plain.index[:1])  # the codes are drawn after the epoch's order
    cfg = LocalTraining(epochs=1, batch_size=8, lr=0.05, momentum=0.9, augment_fill=(-0.4,), compile="off", workers=1)
    fast, _ = train_clients(model, start, bufs, x, y, batches, cfg)
    slow, _ = train_clients_loop(model, start, bufs, x, y, batches, cfg)
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-5)
    unaugmented, _ = train_clients(model, start, bufs, x, y, plain, replace(cfg, augment_fill=None))
    assert not torch.allclose(fast, unaugmented)
    static, _ = train_clients(model, start, bufs, x, y, batches, replace(cfg, compile="on"))  # the captured step
    torch.testing.assert_close(static, fast, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="augment_fill"):
        train_clients(model, start, bufs, x, y, plain, cfg)


def test_evaluation_holds_at_most_its_memory_budget_of_activations(monkeypatch):
    """A batched evaluation takes as many models per forward as the activation budget allows: by hand, a
    Linear(4, 3) + ReLU + Linear(3, 2) model outputs 3 + 3 + 2 floats (32 bytes) per sample, so 10 samples
    of 7 models with a 2,600-byte budget (x 4 for the workspace) go 2 models at a time; the numbers equal one
    forward of all 7."""
    import fedlib.population as population

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    layout = ParamLayout(model)
    flat = torch.randn(7, layout.size)
    x, y = torch.randn(10, 4), torch.randint(0, 2, (10,))
    assert population.activation_bytes(model, x[0]) == 32
    whole = population.evaluate(model, flat, {}, x, y, 2, model_chunk=7)
    monkeypatch.setattr(population, "EVAL_BUDGET_CPU", 2600)
    assert population.eval_model_chunk(model, x, 2048, 7) == 2  # 2600 // (4 x 32 x 10)
    seen = []
    forward = population._forward_many
    monkeypatch.setattr(population, "_forward_many", lambda m, l, f, *rest: seen.append(f.shape[0]) or forward(m, l, f, *rest))
    parts = population.evaluate(model, flat, {}, x, y, 2)
    assert seen == [2, 2, 2, 1]
    assert torch.equal(parts.confusion, whole.confusion) and torch.allclose(parts.loss, whole.loss, atol=1e-6)
    monkeypatch.setattr(population, "EVAL_BUDGET_CPU", 1)
    assert population.eval_model_chunk(model, x, 2048, 7) == 1  # never below one model
