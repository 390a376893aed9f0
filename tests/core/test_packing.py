"""Packed runs (fedlib.packing): many runs as one population give each run the numbers it gets alone."""

import numpy as np
import pytest
import torch

import golden_methods as golden
from fedlib.config import make_config
from fedlib.engine import execute
from fedlib.federation import prepare
from fedlib.methods import METHODS
from fedlib.packing import make_packs, pack_signature, train_together
from fedlib.population import LocalTraining, make_client_batches
from fedlib.training import train_clients
from fedlib.run import run_many
from fedlib.engine import TrainRequest
from fedlib.testing import train_clients_loop

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
SPLITS = ({"name": "dirichlet", "alpha": 0.5}, {"name": "iid"})
REL = 1e-5  # parameters after the run, relative to their norm (measured: <= 3e-7 on this CPU)


def _variants(name: str) -> list:
    """2 seeds x 2 splits of ``name`` on the golden federation (tests/golden_methods.py)."""
    base = golden.config_of(name)
    return [base.model_copy(update={"seed": seed, "split": make_config(base.to_dict(), split=split).split})
            for seed in (7, 8) for split in SPLITS]


def _alone_and_packed(configs):
    from fedlib.packing import execute_packed

    def prepared():
        out = []
        for c in configs:
            p = prepare(c)
            p.keep_model = True
            out.append(p)
        return out

    alone = [execute(p, progress=False) for p in prepared()]
    packed = execute_packed(prepared())
    return alone, packed


def _assert_same_run(alone, packed, what):
    assert len(alone.history) == len(packed.history), what
    for a, b in zip(alone.history, packed.history):
        for field in ("selected", "aggregated", "dropped", "clipped"):
            assert a.get(field) == b.get(field), f"{what}: round {a['round']} {field}"
        for field in ("weights", "scores", "similarity", "accuracy", "loss", "per_class_accuracy"):
            if a.get(field) is not None:
                np.testing.assert_allclose(b[field], a[field], rtol=1e-4, atol=1e-5,
                                           err_msg=f"{what}: round {a['round']} {field}")
    assert alone.final.get("stopped") == packed.final.get("stopped"), what
    flat_a, flat_b = alone.model[0], packed.model[0]
    rel = float((flat_a - flat_b).norm() / flat_a.norm().clamp(min=1e-12))
    assert rel <= REL, f"{what}: final parameters differ by {rel:.2e} relative"


@pytest.mark.parametrize("name", sorted(METHODS))
def test_packed_run_equals_the_run_alone_for_every_method(name):
    """2 seeds x 2 splits of the method, packed with the same four of FedAvg (two methods per pack)."""
    configs = _variants(name) + (_variants("fedavg") if name != "fedavg" else _variants("fedprox"))
    alone, packed = _alone_and_packed(configs)
    for i, (a, b) in enumerate(zip(alone, packed)):
        _assert_same_run(a, b, f"{configs[i].method.name} seed {configs[i].seed} {configs[i].split.name}")
        assert b.meta["pack"] == {"size": len(configs), "index": i, "methods": [c.method.name for c in configs]}


def test_round_data_and_client_state_stay_each_runs_own_in_a_pack():
    """Issue 31 point 3: CELM's retained heads (client state, T_w = 2 of 4 rounds, 2 of 4 clients a
    round) and the logit protocol's round data (UWA's GMMs from weigh to evaluate, the
    meta-model), two runs of each method with other seeds in one pack, equal the runs alone."""
    def variant(name, seed, rounds, clients_per_round=None, **params):
        base = golden.config_of(name)
        return make_config(base.to_dict(), seed=seed, rounds=rounds, clients_per_round=clients_per_round,
                           method={**base.method.params, "name": name, **params})

    configs = [variant("celm", 7, 4, 2, warmup_fraction=0.5), variant("celm", 8, 4, 2, warmup_fraction=0.5),
               variant("logit_uwa", 7, 3, public_logits="after_refine"), variant("logit_uwa", 8, 3),
               variant("logit_meta", 7, 3), variant("logit_meta", 9, 3, dropout=0.3)]
    alone, packed = _alone_and_packed(configs)
    for c, a, b in zip(configs, alone, packed):
        _assert_same_run(a, b, f"{c.method.name} seed {c.seed}")
        if c.method.name.startswith("logit"):  # the aggregate on the public set, each run's own
            np.testing.assert_allclose([h["diagnostics"]["public_accuracy"] for h in b.history],
                                       [h["diagnostics"]["public_accuracy"] for h in a.history], atol=1e-6)
    assert alone[0].history[1]["weights"] != alone[1].history[1]["weights"]  # the two CELM runs differ


def test_a_pack_of_one_is_bit_identical():
    config = golden.config_of("cgsv")
    alone, packed = _alone_and_packed([config])
    assert alone[0].history[-1]["weights"] == packed[0].history[-1]["weights"]
    assert torch.equal(alone[0].model[0], packed[0].model[0])


def test_runs_of_other_lengths_and_learning_rates_pack():
    """Shorter runs leave the pack early; a per-row learning rate follows each run's schedule."""
    base = golden.config_of("fedavg")
    configs = [base, base.model_copy(update={"rounds": 1}),
               make_config(base.to_dict(), lr=0.2, lr_milestones=[1], lr_gamma=0.5),
               make_config(base.to_dict(), momentum=0.9)]
    alone, packed = _alone_and_packed(configs)
    for c, a, b in zip(configs, alone, packed):
        _assert_same_run(a, b, f"rounds {c.rounds} lr {c.lr} momentum {c.momentum}")


def test_train_together_equals_the_per_client_loop():
    """Two requests with their own start models, lr, client sizes and step counts, merged in one call,
    against the plain per-client loop (fedlib.testing.train_clients_loop) of each."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    x, y = torch.randn(200, 6), torch.randint(0, 3, (200,))
    flat0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    requests = []
    for k, (sizes, lr) in enumerate((((30, 7, 12), 0.1), ((50, 3), 0.05))):
        rng = np.random.default_rng(k)
        indices = [rng.choice(200, n, replace=False) for n in sizes]
        batches = make_client_batches(indices, 8, 2, torch.Generator().manual_seed(k))
        start = flat0 + 0.01 * k if k == 0 else (flat0 + 0.02 * torch.randn(len(sizes), flat0.numel()))
        training = LocalTraining(batch_size=8, lr=lr, momentum=0.5, prox_mu=0.1, workers=1)
        requests.append(TrainRequest(model, start, {}, x, y, batches, training))
    together = train_together(requests)
    for r, (flat, _) in zip(requests, together):
        expected, _ = train_clients_loop(model, r.start, {}, x, y, r.batches, r.training)
        torch.testing.assert_close(flat, expected, rtol=1e-5, atol=1e-6)
        alone, _ = train_clients(model, r.start, {}, x, y, r.batches, r.training)
        torch.testing.assert_close(flat, alone, rtol=1e-6, atol=1e-7)


def test_make_packs_groups_by_signature_and_bounds_rows():
    base = golden.config_of("fedavg")  # 4 clients per round
    other = base.model_copy(update={"batch_size": 16})
    configs = [base, other, base.model_copy(update={"seed": 1}), base.model_copy(update={"seed": 2}), other]
    assert pack_signature(base) != pack_signature(other)
    assert make_packs(configs) == [[0, 2, 3], [1, 4]]
    assert make_packs(configs, max_rows=8) == [[0, 2], [1, 4], [3]]
    assert make_packs(configs, max_rows=1) == [[0], [1], [2], [3], [4]]  # a run larger than the bound packs alone
    # runs whose training calls never merge (augmentation, momentum, weight decay) form packs apart
    apart = [base.model_copy(update=u) for u in ({"augment": "crop_flip"}, {"momentum": 0.9}, {"weight_decay": 5e-4})]
    assert make_packs([base, *apart, base.model_copy(update={"seed": 1})]) == [[0, 4], [1], [2], [3]]


def test_run_many_packed_stores_each_run_under_its_own_key(tmp_path):
    from fedlib.cache import ResultCache

    store = ResultCache(tmp_path)
    configs = _variants("fedavg")[:3]
    packed = run_many(configs, cache=store, progress=False, pack=True)
    for c, r in zip(configs, packed):
        assert r.meta["config_key"] == c.key()
        assert store.get(c.key()) is not None
    again = run_many(configs, cache=store, progress=False, pack=True)  # all from the cache now
    assert [r.final["accuracy"] for r in again] == [r.final["accuracy"] for r in packed]


@pytest.mark.parametrize("model", ["lenet5", "cnn"])
def test_convolutional_runs_pack_to_float_rounding(model, monkeypatch):
    """Merged as on a GPU, convolutions batch rows differently in a pack (grouped over more clients), so
    parameters may differ by float rounding that training amplifies, as with ``client_chunk``; never the
    selections. (On a CPU they are trained one run at a time by default: the next test.)"""
    import fedlib.packing

    monkeypatch.setattr(fedlib.packing, "MERGE_ON_CPU", "always")
    configs = [make_config(golden.FEDERATION, model=model, seed=seed, method={"name": name})
               for seed in (0, 1) for name in ("fedavg", "moon")]
    alone, packed = _alone_and_packed(configs)
    for c, a, b in zip(configs, alone, packed):
        for ha, hb in zip(a.history, b.history):
            assert ha["aggregated"] == hb["aggregated"]
            np.testing.assert_allclose(hb["weights"], ha["weights"], rtol=1e-6)
        rel = float((a.model[0] - b.model[0]).norm() / a.model[0].norm())
        assert rel < 1e-3, f"{model} {c.method.name} seed {c.seed}: {rel:.2e}"


def test_the_performance_page_reads_a_packed_benchmark_record():
    from fedlib.app.chapters.performance import packed_table, packed_text

    row = dict(separate_runs_per_min=10.0, training_flops=1.0, packed_flops_per_s=1.0)
    record = {"device": "cpu (x86_64, 2 cores, 2 threads)", "rows": [
        {**row, "workload": "w", "pack_size": 1, "packed_runs_per_min": 12.0, "packed_over_separate": 1.2,
         "packed_fraction_of_peak": 0.05, "load_before_after": [0.5, 1.0]},
        {**row, "workload": "w", "pack_size": 5, "packed_runs_per_min": 30.0, "packed_over_separate": 3.0,
         "packed_fraction_of_peak": 0.1, "load_before_after": [1.0, 3.5]}]}
    assert packed_text(record) == ("cpu (x86_64, 2 cores, 2 threads): w: packed / separate 1.20x to 3.00x over pack "
                                   "sizes 1, 5; most runs per device-minute packed: 30.0 at pack size 5 (measured "
                                   "while other work competed: load up to 3.5 on 2 cores; ratios are indicative)")
    record["rows"][1]["load_before_after"] = [1.0, 2.4]
    assert packed_text(record).endswith("at pack size 5")  # no warning at load <= cores + 0.5
    table = packed_table(record)
    assert list(table.loc[("w", 5)]) == [10.0, 30.0, "3.00x", "10.00 %", "1.0 → 2.4"]
    # a record measuring both convolution lowerings: one line of the sentence per lowering
    record["rows"] = [{**r, "conv": conv} for r in record["rows"] for conv in ("native", "matmul")]
    record["rows"][-1]["packed_runs_per_min"] = 60.0
    assert packed_text(record) == ("cpu (x86_64, 2 cores, 2 threads): w [conv native]: packed / separate 1.20x to "
                                   "3.00x over pack sizes 1, 5; most runs per device-minute packed: 30.0 at pack size 5; "
                                   "w [conv matmul]: packed / separate 1.20x to 3.00x over pack sizes 1, 5; most runs "
                                   "per device-minute packed: 60.0 at pack size 5")
    assert packed_table(record).loc[("w [conv matmul]", 5), "packed (runs/min)"] == 60.0
    # measured in turn several times (--repeats): the median ratio, its range and the count
    record["repeats"] = 3
    record["rows"] = [{**record["rows"][0], "repeats": 3, "ratio_range": [0.97, 1.31]}]
    assert packed_table(record).loc[("w [conv native]", 1), "packed / separate"] == "1.20x (0.97–1.31, 3 repeats)"
    assert packed_text(record).endswith("at pack size 1; each ratio is the median of 3 measurements, separate and "
                                        "packed in turn")
    # with and without compacted replays (benchmarks/packed.py --compact on off)
    record["rows"] = [{**r, "conv": "native", "compact": c} for r in record["rows"][:2] for c in ("on", "off")]
    assert list(packed_table(record).index.get_level_values(0).unique()) == ["w [conv native, compact on]",
                                                                            "w [conv native, compact off]"]


def test_the_performance_page_bounds_the_gpu_goal_by_the_timed_steps():
    """Issue 28's GPU goal against a record's timed steps (conv_choices), by hand: CELM Table 1's 75 CIFAR-10
    runs each train 200 rounds x 50,000 samples / 128 = 78,125 client-steps, 5,859,375 in all; at the fastest
    timed rate, 0.3 ms per client (6 ms for 20 clients), that is 1,757.8 s = 29.3 min."""
    from fedlib.app.book import load_profile
    from fedlib.app.chapters.celm import protocol as celm_protocol
    from fedlib.app.chapters.performance import gpu_goal_text, step_rates

    record = {"device": "gpu", "conv_choices": {
        "CNN | 9 | 5 | 128 | (3, 32, 32) | cuda:0": {"lowering": "native", "seconds": {"native": 0.002, "matmul": 0.01}},
        "CNN | 9 | 20 | 128 | (3, 32, 32) | cuda:0": {"lowering": "matmul", "seconds": {"native": 0.009, "matmul": 0.006}},
        "CNN | 9 | 2 | 2 | (3, 32, 32) | cuda:0": {"lowering": "native", "seconds": {"native": 1e-6, "matmul": 1e-6}}}}
    assert step_rates(record)[0] == ("CNN", 2, 2, 5e-7)  # another batch size: not CELM's shape
    # the wider CNN (issue 30)
    adopted = celm_protocol.experiment_configs(load_profile("celm", "paper"), "table1_cifar10")
    table1 = [c.model_copy(update={"model": "cnn"}) for c in adopted]
    assert gpu_goal_text(record, table1) == (
        "gpu: a captured training step of the CNN, 128 images per client, cost 0.400 / 0.300 ms per client with 5 / 20 "
        "clients in the step; CELM Table 1's 75 CIFAR-10 runs are 5.86 M client-steps, so at the fastest of these rates "
        "their training steps alone take 29.3 min, against the goal's 9-minute call")
    assert gpu_goal_text({"device": "cpu", "conv_choices": {}}, table1) is None
    # runs of another model than the one timed: the bound says so
    wide = adopted
    assert {c.model for c in wide} == {"cnn_wide"}
    assert gpu_goal_text(record, wide).endswith("take 29.3 min (timed on the CNN; these runs now train the larger "
                                                "CNNWide, so this is a lower bound), against the goal's 9-minute call")
    record["conv_choices"]["CNNWide | 9 | 5 | 128 | (3, 32, 32) | cuda:0"] = {"seconds": {"native": 0.01}}
    assert "cost 2.000 ms per client with 5 clients" in gpu_goal_text(record, wide)  # its own timing, where stored


def test_the_performance_page_costs_the_gpu_goal_by_the_stored_packs():
    """Stored runs trained in GPU packs at CELM Table 1's CIFAR-10 protocol, by hand: a pack of 2 whose last run
    ended at 40 s is 20 s per run, a pack of 4 at 100 s is 25 s; the 75 runs at 20 s are 25.0 device-minutes.
    Runs of another protocol (100 rounds), run alone or on a CPU do not count."""
    from types import SimpleNamespace

    from fedlib.app.book import load_profile
    from fedlib.app.chapters.celm import protocol as celm_protocol
    from fedlib.app.chapters.performance import gpu_packs_text

    table1 = celm_protocol.experiment_configs(load_profile("celm", "paper"), "table1_cifar10")
    protocol = table1[0].resolved()

    def run(model="cnn", size=2, wall=40.0, date="d1", device="cuda:0 (NVIDIA H100 80GB HBM3)", **change):
        meta = {"resolved": {**protocol, "model": model, **change}, "pack": {"size": size}, "wall_time": wall,
                "date": date, "device": device}
        return SimpleNamespace(key="key", result={"meta": meta}, meta=meta)  # a fedlib.store.StoredRun's fields

    runs = [run(wall=39.0), run(wall=40.0), *[run(size=4, wall=100.0, date="d2") for _ in range(4)],
            run(rounds=100, wall=1.0, date="d3"), run(size=1, wall=1.0, date="d4"),
            run(wall=1.0, date="d5", device="cpu (x86_64, 2 cores)")]
    text = gpu_packs_text(table1, SimpleNamespace(by_signature={"a": runs}))
    assert text == ("NVIDIA H100 80GB HBM3, stored CIFAR-10 runs of this protocol trained in packs: the cnn: 6 stored "
                    "runs of 2 packs of 2 to 4 runs took 20.0-25.0 device-seconds per run. At the cheapest, CELM Table "
                    "1's 75 runs take 25.0 device-minutes, everything included; these runs now train the cnn_wide, "
                    "which no GPU pack has timed yet, so this is a lower bound")
    wide = [run(model="cnn_wide", wall=90.0, date="d6"), run(model="cnn_wide", wall=90.0, date="d6")]
    assert gpu_packs_text(table1, SimpleNamespace(by_signature={"a": runs + wide})).endswith(
        "the cnn_wide: 2 stored runs of 1 pack of 2 runs took 45.0-45.0 device-seconds per run. At the cheapest, "
        "CELM Table 1's 75 runs take 56.2 device-minutes, everything included")  # their own model's packs, once timed
    assert gpu_packs_text(table1, SimpleNamespace(by_signature={"a": runs[6:]})) is None


def test_with_an_executor_a_pack_is_the_unit_a_worker_receives(tmp_path, monkeypatch):
    import sys
    from concurrent.futures import ThreadPoolExecutor

    run_module = sys.modules["fedlib.run"]

    configs = _variants("fedavg")
    sent = []
    original = run_module._run_pack_in_worker
    monkeypatch.setattr(run_module, "_run_pack_in_worker",
                        lambda dicts, max_rows: sent.append(len(dicts)) or original(dicts, max_rows))
    with ThreadPoolExecutor(1) as pool:
        through_pool = run_many(configs, executor=pool, cache=False, progress=False, pack=True)
    assert sent == [4]  # one submission: the whole pack
    here = run_many(configs, cache=False, progress=False, pack=True)
    for a, b in zip(through_pool, here):
        assert [h["weights"] for h in a.history] == [h["weights"] for h in b.history]
        assert [h["accuracy"] for h in a.history] == [h["accuracy"] for h in b.history]


def test_on_a_cpu_convolutional_runs_train_alone_and_give_identical_bits(monkeypatch):
    """The CPU plan (fedlib.packing.MERGE_ON_CPU = "auto"): a conv model's training requests are answered
    one run at a time, so a packed run is the separate run bit for bit; its evaluation is still shared."""
    import fedlib.packing

    merged = []
    original = fedlib.packing.train_together
    monkeypatch.setattr(fedlib.packing, "train_together",
                        lambda requests, pools=None: merged.append(len(requests)) or original(requests, pools))
    configs = [make_config(golden.FEDERATION, model="lenet5", seed=seed, method={"name": "fedavg"}) for seed in (0, 1)]
    alone, packed = _alone_and_packed(configs)
    assert merged and set(merged) == {1}
    for a, b in zip(alone, packed):
        assert torch.equal(a.model[0], b.model[0])


def test_augmented_runs_pack_and_equal_their_runs_alone():
    """crop_flip's codes come from each run's own generator: packed runs augment as they do alone."""
    base = golden.config_of("fedavg").model_copy(update={"augment": "crop_flip", "rounds": 2})
    configs = [base.model_copy(update={"seed": seed}) for seed in (7, 8)]
    alone, packed = _alone_and_packed(configs)
    for i, (a, b) in enumerate(zip(alone, packed)):
        _assert_same_run(a, b, f"augmented seed {configs[i].seed}")
    unaugmented = _alone_and_packed([configs[0].model_copy(update={"augment": None})])[0][0]
    assert unaugmented.history[-1]["accuracy"] != alone[0].history[-1]["accuracy"]


def test_the_packed_benchmark_profiles_a_packed_round_as_the_gpu_call_will(tmp_path):
    """benchmarks/packed.py --top-kernels (run on the GPU next to the plain measurement), rehearsed on the CPU."""
    import importlib.util
    import json
    from pathlib import Path

    from fedlib.data import data_missing

    if data_missing("cifar10"):
        pytest.skip("CIFAR-10 is not on this machine")
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "packed.py"
    spec = importlib.util.spec_from_file_location("packed_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "packed.json"
    assert bench.main(["--device", "cpu", "--sizes", "1", "2", "--rounds", "1", "--fraction", "0.004",
                       "--test-samples", "50", "--top-kernels", "3", "--cudnn-benchmark", "--repeats", "2",
                       "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["cudnn_benchmark"] is True and [r["pack_size"] for r in record["rows"]] == [1, 2]
    for r in record["rows"]:  # two measurements in turn: the median of two is their mean, inside the range
        low, high = r["ratio_range"]
        assert r["repeats"] == 2 and low <= high and low - 1e-3 <= r["separate_s"] / r["packed_s"] <= high + 1e-3
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--repeats", "0"])
    kernels = record["top_kernels"]
    assert len(kernels) == 3 and all(r["ms"] > 0 and 0 < r["share"] <= 1 for r in kernels)
    assert kernels[0]["ms"] >= kernels[-1]["ms"]


def test_a_pack_of_one_runs_as_the_run_alone(monkeypatch):
    """A pack holding one run takes the engine's own path (no pack machinery, no meta.pack): the
    numbers of run() (benchmarks/packed.py measured packs of one 0.85-0.98x of a run alone before)."""
    import sys

    from fedlib.run import run, run_pack

    monkeypatch.setattr(sys.modules["fedlib.run"], "execute_packed", lambda *a, **k: pytest.fail("a pack of one was packed"))
    config = golden.config_of("fedavg")
    (packed,) = run_pack([config])
    alone = run(config, cache=False, progress=False).to_dict()
    assert "pack" not in packed["meta"] and packed["meta"]["config_key"] == alone["meta"]["config_key"]
    assert [h["accuracy"] for h in packed["history"]] == [h["accuracy"] for h in alone["history"]]
    assert packed["final"] == alone["final"]


def test_packed_runs_on_compacted_captured_steps_equal_the_runs_alone(monkeypatch):
    """The GPU plan rehearsed on a CPU: captured steps run eagerly on their static tensors ("static"),
    replaying only the clients with samples. FedAvg and FedProx runs packed this way give each run its
    numbers alone (eager steps)."""
    import fedlib.plans as plans
    import fedlib.training as training
    from fedlib.packing import execute_packed

    configs = _variants("fedavg") + _variants("fedprox")

    def prepared():
        return [setattr(p, "keep_model", True) or p for p in map(prepare, configs)]

    alone = [execute(p, progress=False) for p in prepared()]
    monkeypatch.setattr(plans, "step_backend", lambda *_: "static")
    training._CAPTURED.clear()
    packed = execute_packed(prepared())
    sizes = {key[2] for key in training._CAPTURED}
    assert len(sizes) > 1  # the pack's chunk and smaller compacted sizes were replayed
    for i, (a, b) in enumerate(zip(alone, packed)):
        _assert_same_run(a, b, f"{configs[i].method.name} seed {configs[i].seed} {configs[i].split.name}")
