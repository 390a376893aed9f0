"""Precision as a declared protocol choice and the memory format of convolutions (issue 45).

``RunConfig.precision`` ("float32" | "bfloat16") enters the key only when bfloat16 (every float32 key is the
one it was); a bfloat16 run trains its clients' forward and backward under autocast and keeps parameters,
BatchNorm statistics, aggregation and evaluation in float32; packed bfloat16 runs equal the runs alone within
``fedlib.determinism.BFLOAT16``; the channels-last memory format agrees with the contiguous one within ``PLAN``.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

import golden_methods as golden
from fedlib.config import ConfigError, RunConfig, make_config
from fedlib.determinism import BFLOAT16, PLAN
from fedlib.engine import execute
from fedlib.federation import prepare
from fedlib.models import build_model
from fedlib.packing import make_packs, pack_signature
from fedlib.plans import execution_plan
from fedlib.population import (LocalTraining, ParamLayout, evaluate, make_client_batches, memory_format_for, predict,
                               stack_buffers)
from fedlib.training import train_clients

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# A config's keys computed before the precision field existed (commit d858847): float32 keeps them.
BEFORE = dict(dataset="synthetic", model="cnn", n_clients=4, rounds=3, method="fedavg")
BEFORE_CONFIG_KEY, BEFORE_KEY = "8d4a14e165f8b792c65d", "28d4ee5b8f97d0f036c0"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


# -- the key ------------------------------------------------------------------------------------------


def test_float32_keeps_every_earlier_key_and_bfloat16_has_its_own():
    plain = RunConfig.make(BEFORE)
    explicit = RunConfig.make({**BEFORE, "precision": "float32"})
    low = RunConfig.make({**BEFORE, "precision": "bfloat16"})
    assert plain.config_key() == explicit.config_key() == BEFORE_CONFIG_KEY
    assert plain.key() == explicit.key() == BEFORE_KEY
    assert "precision" not in plain.resolved() and "precision" not in explicit.resolved()
    assert low.resolved()["precision"] == "bfloat16"
    assert low.config_key() != BEFORE_CONFIG_KEY and low.key() != BEFORE_KEY


def test_a_bad_precision_fails_in_one_line():
    with pytest.raises(ConfigError) as err:
        RunConfig.make({**BEFORE, "precision": "float16"})
    message = str(err.value)
    assert "\n" not in message and "precision" in message and "bfloat16" in message
    with pytest.raises(ValueError, match=r"^precision: must be one of float32, bfloat16 \(got 'fp16'\)$"):
        _train(build_model("mlp", (1, 4, 4), 3), *_data((1, 4, 4), 3), LocalTraining(batch_size=4, precision="fp16"))
    with pytest.raises(ValueError, match="FEDLIB_MEMORY_FORMAT"):
        memory_format_for(LocalTraining(memory_format="nhwc"), "cpu", build_model("mlp", (1, 4, 4), 3), (1, 4, 4))


def test_runs_of_another_precision_never_pack_together():
    a = RunConfig.make(BEFORE)
    b = RunConfig.make({**BEFORE, "precision": "bfloat16"})
    assert pack_signature(a) != pack_signature(b)
    assert make_packs([a, b, a.model_copy(update={"seed": 1})]) == [[0, 2], [1]]


# -- a run in bfloat16 --------------------------------------------------------------------------------


def _data(shape, n_classes, sizes=(40, 25, 33), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(sizes), *shape, generator=g)
    y = torch.randint(0, n_classes, (len(x),), generator=g)
    return x, y, np.split(np.arange(len(x)), np.cumsum(sizes)[:-1])


def _train(model, x, y, indices, cfg):
    layout = ParamLayout(model)
    batches = make_client_batches(indices, cfg.batch_size, cfg.epochs, torch.Generator().manual_seed(1))
    return train_clients(model, layout.flat_of(model), stack_buffers(layout.buffers_of(model), 1), x, y, batches, cfg)


def test_a_bfloat16_run_trains_differs_from_float32_and_records_its_precision():
    config = make_config(golden.FEDERATION, model="mlp", rounds=4, fraction=1.0, local_epochs=3, lr=0.1,
                         split={"name": "iid"}, test_samples=500)
    runs = {}
    for precision in ("float32", "bfloat16"):
        p = prepare(config.model_copy(update={"precision": precision}))
        p.keep_model = True
        runs[precision] = execute(p, progress=False)
    low, high = runs["bfloat16"], runs["float32"]
    accuracy = [h["accuracy"] for h in low.history]
    assert accuracy[-1] > accuracy[0] + 0.3 and accuracy[-1] > 0.8, accuracy  # it learns the synthetic task
    assert low.meta["precision"] == "bfloat16" and high.meta["precision"] == "float32"
    assert low.meta["config_key"] != high.meta["config_key"]
    assert low.model[0].dtype == torch.float32  # the global model stays float32
    difference = _rel(low.model[0], high.model[0])
    assert 1e-5 < difference < 0.1, difference  # bfloat16's rounding, not another training


def test_bfloat16_runs_the_forward_in_bfloat16_and_keeps_everything_else_float32():
    """Inside local training the convolutions and linear layers compute in bfloat16; the trained parameters,
    BatchNorm running statistics, their aggregation, the evaluation and the predictions are float32."""
    from fedlib.population import aggregate

    torch.manual_seed(0)
    model = build_model("resnet20", (3, 8, 8), 4)
    x, y, indices = _data((3, 8, 8), 4)
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append((type(m).__name__, o.dtype)))
             for m in (model.stem, model.stem_bn, model.head)]
    flat, bufs = _train(model, x, y, indices, LocalTraining(batch_size=16, lr=0.05, momentum=0.9, precision="bfloat16",
                                                            workers=1))
    assert {"Conv2d": torch.bfloat16, "MaskedBatchNorm": torch.bfloat16, "Linear": torch.bfloat16} == dict(seen)
    assert flat.dtype == torch.float32
    assert {v.dtype for k, v in bufs.items() if k.endswith(("running_mean", "running_var"))} == {torch.float32}
    assert all(torch.isfinite(v).all() for v in bufs.values())
    new, new_bufs = aggregate(flat, torch.tensor([0.5, 0.3, 0.2]), bufs)
    assert new.dtype == torch.float32 and new_bufs["stem_bn.running_mean"].dtype == torch.float32
    seen.clear()
    ev = evaluate(model, new.unsqueeze(0), {k: v.unsqueeze(0) for k, v in new_bufs.items()}, x, y, 4)
    assert ev.loss.dtype == torch.float32 and {d for _, d in seen} == {torch.float32}
    assert predict(model, flat, bufs, x).dtype == torch.float32
    for h in hooks:
        h.remove()


def test_the_captured_step_runs_bfloat16_as_the_eager_step(monkeypatch):
    """The static-tensor step that CUDA graphs capture, run eagerly on a CPU ("static"), in bfloat16: the
    eager step's numbers."""
    import fedlib.plans as plans
    import fedlib.training as training

    torch.manual_seed(0)
    model = build_model("resnet20", (3, 8, 8), 4)
    x, y, indices = _data((3, 8, 8), 4)
    cfg = LocalTraining(batch_size=16, lr=0.05, momentum=0.9, precision="bfloat16", workers=1)
    eager = _train(model, x, y, indices, replace(cfg, compile="off", order="vectorized"))
    monkeypatch.setattr(plans, "step_backend", lambda *_: "static")
    training._CAPTURED.clear()
    replayed = _train(model, x, y, indices, cfg)
    assert any(key[-2] == "bfloat16" for key in training._CAPTURED)
    assert _rel(replayed[0], eager[0]) <= PLAN.parameters
    float32 = _train(model, x, y, indices, replace(cfg, precision="float32"))
    assert _rel(replayed[0], float32[0]) > PLAN.parameters  # it did run in bfloat16


def test_packed_bfloat16_runs_equal_the_runs_alone_within_the_bfloat16_tolerance(monkeypatch):
    """Merged (the MLP; LeNet-5 with MERGE_ON_CPU="always", the GPUs' path): bfloat16 rounds the activations of
    rows batched differently at another point, so a packed run agrees with its run alone within BFLOAT16."""
    import fedlib.packing as packing
    from fedlib.packing import execute_packed

    monkeypatch.setattr(packing, "MERGE_ON_CPU", "always")
    for model in ("mlp", "lenet5"):
        base = make_config(golden.FEDERATION, model=model, precision="bfloat16")
        configs = [base.model_copy(update={"seed": s}) for s in (7, 8, 9)]

        def prepared():
            return [setattr(p, "keep_model", True) or p for p in map(prepare, configs)]

        alone = [execute(p, progress=False) for p in prepared()]
        packed = execute_packed(prepared())
        for a, b in zip(alone, packed):
            assert [h["selected"] for h in a.history] == [h["selected"] for h in b.history]
            np.testing.assert_allclose([h["weights"] for h in b.history], [h["weights"] for h in a.history],
                                       atol=BFLOAT16.weights)
            for ha, hb in zip(a.history, b.history):
                assert abs(ha["accuracy"] - hb["accuracy"]) <= BFLOAT16.accuracy, (model, ha["round"])
                assert abs(ha["loss"] - hb["loss"]) <= BFLOAT16.loss, (model, ha["round"])
            assert _rel(b.model[0], a.model[0]) <= BFLOAT16.parameters, (model, _rel(b.model[0], a.model[0]))


# -- the memory format --------------------------------------------------------------------------------


def test_the_memory_format_rule():
    wide, lenet, mlp = build_model("cnn_wide", (3, 32, 32), 10), build_model("lenet5", (1, 28, 28), 10), \
        build_model("mlp", (1, 28, 28), 10)
    auto = LocalTraining()
    assert memory_format_for(auto, "cpu", wide, (3, 32, 32)) == "channels_last"
    assert memory_format_for(auto, "cpu", build_model("resnet20", (3, 32, 32), 10), (3, 32, 32)) == "channels_last"
    assert memory_format_for(auto, "cpu", lenet, (1, 28, 28)) == "contiguous"  # narrow convolutions
    assert memory_format_for(auto, "cpu", mlp, (1, 28, 28)) == "contiguous"
    assert memory_format_for(auto, "cuda", wide, (3, 32, 32)) == "contiguous"
    assert memory_format_for(LocalTraining(memory_format="contiguous"), "cpu", wide, (3, 32, 32)) == "contiguous"
    plan = execution_plan(LocalTraining(batch_size=128), 5, "cpu", wide, torch.zeros(3, 32, 32), 10.0)
    assert plan["order"] == "clients" and plan["memory_format"] == "channels_last" and plan["precision"] == "float32"
    plan = execution_plan(LocalTraining(batch_size=128, order="vectorized"), 5, "cpu", wide, torch.zeros(3, 32, 32))
    assert plan["memory_format"] == "contiguous"  # vmap's grouped convolution stays contiguous


def test_environment_switch(monkeypatch):
    wide = build_model("cnn_wide", (3, 32, 32), 10)
    monkeypatch.setenv("FEDLIB_MEMORY_FORMAT", "contiguous")
    assert memory_format_for(LocalTraining(), "cpu", wide, (3, 32, 32)) == "contiguous"
    assert memory_format_for(LocalTraining(memory_format="channels_last"), "cpu", wide, (3, 32, 32)) == "channels_last"
    monkeypatch.setenv("FEDLIB_MEMORY_FORMAT", "channels_last")
    assert memory_format_for(LocalTraining(), "cpu", build_model("mlp", (1, 4, 4), 3), (1, 4, 4)) == "channels_last"


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_channels_last_agrees_with_contiguous_within_the_plan_tolerance(precision, monkeypatch):
    """Clients trained one at a time (the CPU order of a convolutional model), channels-last vs contiguous:
    within PLAN (float32) or, in bfloat16, within BFLOAT16 (the activations round to bfloat16 after sums in
    another order); the evaluation of one model too."""
    torch.manual_seed(0)
    model = build_model("cnn", (3, 16, 16), 5)
    x, y, indices = _data((3, 16, 16), 5)
    cfg = LocalTraining(batch_size=16, lr=0.05, momentum=0.9, order="clients", workers=1, precision=precision)
    formats = []  # the training steps' convolution outputs (not the no-grad forward that counts FLOPs)

    def record(_module, _inputs, out):
        if torch.is_grad_enabled():
            formats.append(out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous())

    hook = model.conv2.register_forward_hook(record)
    last = _train(model, x, y, indices, replace(cfg, memory_format="channels_last"))
    assert formats and all(formats)  # the convolutions ran channels-last
    formats.clear()
    plain = _train(model, x, y, indices, replace(cfg, memory_format="contiguous"))
    assert formats and not any(formats)
    hook.remove()
    start = ParamLayout(model).flat_of(model)
    assert _rel(plain[0], start.expand_as(plain[0])) > 1e-3  # it trained
    tolerance = PLAN if precision == "float32" else BFLOAT16
    assert _rel(last[0], plain[0]) <= tolerance.parameters, _rel(last[0], plain[0])
    auto = _train(model, x, y, indices, cfg)  # "auto" is channels-last for this model on a CPU
    assert torch.equal(auto[0], last[0])
    vectorized = _train(model, x, y, indices, replace(cfg, order="vectorized"))  # vmap: contiguous
    assert _rel(vectorized[0], plain[0]) <= tolerance.parameters, _rel(vectorized[0], plain[0])
    evaluations = {}
    for fmt in ("channels_last", "contiguous"):
        monkeypatch.setenv("FEDLIB_MEMORY_FORMAT", fmt)
        evaluations[fmt] = evaluate(model, plain[0][:1], {k: v[:1] for k, v in plain[1].items()}, x, y, 5)
    a, b = evaluations["channels_last"], evaluations["contiguous"]
    assert abs(float(a.loss[0] - b.loss[0])) <= PLAN.loss
    assert abs(float(a.accuracy[0] - b.accuracy[0])) <= 1.0 / len(y)  # a tie between two logits at most


def test_the_performance_pages_precision_table_and_sentence_by_hand():
    """Issue 45.5: the stored precision record as the performance page shows it: one row per model, workload and
    variant, the ratio with its min-max, no empty cell; the sentence names each model's fastest round variant."""
    from fedlib.app.chapters.performance import precision_table, precision_text

    def variant(seconds, ratio, low, high, diff):
        return {"seconds": seconds, "per_core_hour": 3600 / seconds[0], "ratio_to_float32_contiguous": ratio,
                "ratio_min_max": [low, high], "parameter_difference": diff}

    record = {"device": "cpu (x86_64, 2 cores, 1 threads)", "rows": [
        {"model": "cnn_wide",
         "step": {"unit": "3 steps of one client", "per_core_hour_of": "steps", "variants": {
             "float32 contiguous": variant([0.6], 1.0, 1.0, 1.0, 0.0),
             "bfloat16 channels-last": variant([0.3], 2.0, 1.8, 2.2, 0.07)}},
         "round": {"unit": "5 clients x 2 steps + evaluation", "per_core_hour_of": "rounds", "variants": {
             "float32 contiguous": variant([2.0], 1.0, 1.0, 1.0, 0.0),
             "float32 channels-last": variant([1.5], 1.33, 1.2, 1.4, 4e-6),
             "bfloat16 channels-last": variant([1.0], 2.0, 1.9, 2.1, 0.07)}}},
        {"model": "mlp", "step": {"unit": "3 steps of one client", "per_core_hour_of": "steps", "variants": {
            "float32 contiguous": variant([0.1], 1.0, 1.0, 1.0, 0.0),
            "bfloat16 contiguous": variant([0.09], 1.11, 0.8, 1.5, 0.05)}}}]}
    table = precision_table(record)
    assert len(table) == 7 and not table.isna().any().any()
    row = table.loc[("cnn_wide", "rounds: 5 clients x 2 steps + evaluation", "bfloat16 channels-last")]
    assert row["per core-hour"] == 3600 and row["× float32 contiguous"] == "2.00 (1.90–2.10)"
    assert precision_text(record) == ("cpu (x86_64, 2 cores, 1 threads), a round's fastest variant against float32 "
                                      "contiguous: cnn_wide 2.00× (bfloat16 channels-last), mlp 1.11× "
                                      "(bfloat16 contiguous)")


# -- the screen (CELM CIFAR-10 wider CNN, uniform FedAvg Dir(0.05)) -------------------------------------------


def _screen(diffs, base=60.0):
    from types import SimpleNamespace

    from fedlib.app.chapters.precisions import screen

    rows, results = [], {}
    for seed, d in enumerate(diffs):
        for precision, acc in (("float32", base), ("bfloat16", base + d)):
            config = SimpleNamespace(seed=seed, key=lambda s=seed, p=precision: f"{p}-{s}")
            rows.append((precision, config))
            results[f"{precision}-{seed}"] = SimpleNamespace(final={"accuracy": acc / 100},
                                                             meta={"device": "cuda:0 (NVIDIA H200)"})
    return screen(rows, results, "bfloat16", "params/celm/paper.yaml", 1.0)


def test_the_precision_screens_rule_by_hand():
    # the stored screen's differences (points): mean 1/6, sd 0.29502, t(0.975, 2) = 4.302653 -> ±0.73287
    frame, values = _screen([-0.13, 0.46, 0.17])
    assert values["ps_pairs"] == 3 and values["ps_rule"] == "bfloat16"
    assert values["ps_mean"] == pytest.approx(1 / 6, abs=1e-4) and values["ps_std"] == pytest.approx(0.29502, abs=1e-4)
    assert (values["ps_lo"], values["ps_hi"]) == pytest.approx((1 / 6 - 0.73287, 1 / 6 + 0.73287), abs=1e-3)
    assert list(frame["bfloat16 device"]) == ["NVIDIA H200"] * 3 and "as the rule says" in values["ps_protocol"]
    # a mean well inside ±1 but a spread that leaves the interval wider: float32 stays, and the page says the
    # profile's bfloat16 is not the rule's
    _, values = _screen([0.9, -0.6, 0.3])
    assert values["ps_rule"] == "float32" and "not within ±1 point" in values["ps_verdict"]
    assert "but the rule says float32" in values["ps_protocol"]
    _, values = _screen([0.1, 0.2])  # two seeds: indicative, float32 stays
    assert values["ps_rule"] == "float32" and values["ps_verdict"].startswith("indicative (2 paired seeds)")
    assert _screen([])[0] is None


def test_the_stored_screen_backs_the_paper_profiles_precision():
    """On the committed store: three seeds paired, and the paper profile declares what the rule chose."""
    from fedlib.app.chapters.celm import CELM
    from fedlib.app.kit.sources import load_profile

    screen = CELM("evidence", load_profile("celm", "evidence")).precision_screen()
    frame, values = screen.frame.data, screen.values
    assert values["ps_pairs"] == 3 and values["ps_rule"] == values["ps_adopted"] == "bfloat16"
    assert -1 <= values["ps_lo"] <= values["ps_hi"] <= 1 and len(frame) == 3


def test_the_stored_fedms_screen_backs_the_fedms_profiles_precision():
    """On the committed store: FedMS's screen (FedAvg, CIFAR-10 Dir(10)) has three seeds paired and the FedMS
    paper profile declares what the rule chose (float32: the interval is wider than ±1 point)."""
    from fedlib.app.chapters.fedms import FedMS
    from fedlib.app.kit.sources import load_profile

    screen = FedMS("evidence", load_profile("fedms", "evidence")).precision_screen()
    values = screen.values
    assert values["ps_pairs"] == 3 and len(screen.frame.data) == 3
    assert values["ps_rule"] == values["ps_adopted"] == "float32" and "as the rule says" in values["ps_protocol"]
    assert values["ps_lo"] < -1 or values["ps_hi"] > 1
