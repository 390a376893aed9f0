"""End-to-end runs: FedAvg/FedProx, determinism, caching, roles, CLI and bad input."""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import fedlib
from fedlib.cache import ResultCache
from fedlib.config import ConfigError, make_config
from fedlib.data_files import DataNotFoundError

SYNTH = dict(dataset="synthetic", model="mlp", n_clients=6, rounds=3, batch_size=16, local_epochs=3, lr=0.1, seed=3)


def _strip_timing(result):
    data = result.to_dict()
    for h in data["history"]:
        for k in ("time_train", "time_server", "time_eval", "time_round", "time_monitor"):
            h.pop(k, None)
    data.pop("meta")
    return data


def test_fedavg_on_synthetic_learns_and_serializes(tmp_path):
    r = fedlib.run(make_config(SYNTH), cache=ResultCache(tmp_path), progress=False)
    assert len(r.history) == 3
    assert r.final["accuracy"] > 0.5  # 10 classes: chance is 0.1
    for h in r.history:
        assert sum(h["weights"]) == pytest.approx(1.0, abs=1e-6) and h["aggregated"] == h["selected"]
        assert len(h["per_class_accuracy"]) == 10
    assert json.loads(json.dumps(r.to_dict()))["final"]["accuracy"] == r.final["accuracy"]
    assert r.meta["torch"] and r.meta["device"].startswith("cpu")


def test_same_seed_is_bitwise_identical_and_cache_returns_it(tmp_path):
    cfg = make_config(SYNTH, split={"name": "dirichlet", "alpha": 0.5}, clients_per_round=4)
    a = fedlib.run(cfg, cache=False, progress=False)
    b = fedlib.run(cfg, cache=False, progress=False)
    assert _strip_timing(a) == _strip_timing(b)
    store = ResultCache(tmp_path)
    first = fedlib.run(cfg, cache=store, progress=False)
    again = fedlib.run(cfg, cache=store, progress=False)
    assert again.to_dict() == first.to_dict()
    assert _strip_timing(first) == _strip_timing(a)
    other = fedlib.run(cfg.model_copy(update={"seed": 4}), cache=False, progress=False)
    assert _strip_timing(other) != _strip_timing(a)


def test_run_many_matches_run_with_an_executor(tmp_path):
    cfgs = [make_config(SYNTH, rounds=2, seed=s) for s in (0, 1)]
    direct = [fedlib.run(c, cache=False, progress=False) for c in cfgs]
    with ThreadPoolExecutor(max_workers=2) as pool:
        fanned = fedlib.run_many(cfgs, executor=pool, cache=ResultCache(tmp_path))
    assert [_strip_timing(r) for r in fanned] == [_strip_timing(r) for r in direct]


def test_partial_participation_and_uniform_weights():
    r = fedlib.run(make_config(SYNTH, clients_per_round=2, method="fedavg_uniform"), cache=False, progress=False)
    for h in r.history:
        assert len(h["selected"]) == 2
        assert h["weights"] == pytest.approx([0.5, 0.5])
    assert len({tuple(h["selected"]) for h in r.history}) > 1  # selection varies by round


def test_fedavg_weights_follow_sample_counts():
    r = fedlib.run(make_config(SYNTH, split={"name": "dirichlet", "alpha": 0.3}), cache=False, progress=False)
    sizes = np.asarray(r.meta["client_sizes"], dtype=float)
    weights = np.asarray(r.history[0]["weights"])
    np.testing.assert_allclose(weights, sizes / sizes.sum(), atol=1e-6)


def test_fedprox_runs_and_differs_from_fedavg():
    avg = fedlib.run(make_config(SYNTH, rounds=2), cache=False, progress=False)
    prox = fedlib.run(make_config(SYNTH, rounds=2, method={"name": "fedprox", "mu": 0.1}), cache=False,
                      progress=False)
    assert prox.final["accuracy"] > 0.3
    assert prox.final["accuracy"] != avg.final["accuracy"] or prox.history[-1]["loss"] != avg.history[-1]["loss"]


def test_free_riders_send_back_the_received_model():
    from fedlib.run import _execute, prepare

    p = prepare(make_config(SYNTH, rounds=1, split={"name": "iid", "free_riders": 2}))
    assert p.partition.roles[-2:] == ["free_rider", "free_rider"]
    r = _execute(p, progress=False)
    assert r.meta["client_roles"].count("free_rider") == 2


def test_fashion_mnist_fedavg_learns_quickly():
    r = fedlib.run(make_config(dataset="fmnist", fraction=0.2, rounds=3, local_epochs=2, test_samples=2000), cache=False,
                   progress=False)
    assert r.final["accuracy"] > 0.70


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"dataset": "imagenet22k"}, "unknown"),
        ({"n_clients": 3000, "dataset": "synthetic"}, "n_clients"),
        ({"split": {"name": "spiral"}}, "unknown split"),
        ({"split": {"name": "dirichlet", "alpha": 0.5, "beta": 1}}, "split.beta: split 'dirichlet' has no such parameter"),
        ({"split": {"name": "adversarial", "gamma": 1.0}}, "makes 58 clients"),
    ],
)
def test_bad_runs_fail_before_training_with_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        fedlib.run(make_config({**SYNTH, **overrides}) if "dataset" not in overrides or
                   overrides["dataset"] == "synthetic" else {**SYNTH, **overrides}, cache=False, progress=False)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_missing_data_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_DOWNLOAD", "0")
    with pytest.raises(DataNotFoundError) as info:
        fedlib.run(make_config(dataset="mnist", data_root=str(tmp_path)), cache=False, progress=False)
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)


def test_cli_prints_a_summary_and_rejects_bad_yaml(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("dataset: synthetic\nn_clients: 3\nrounds: 2\nbatch_size: 32\n")
    env = {"FEDLIB_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "fedlib", "run", str(cfg), "lr=0.05", "--json",
                          str(tmp_path / "r.json")], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "final: accuracy" in out.stdout
    assert json.loads((tmp_path / "r.json").read_text())["config"]["lr"] == 0.05
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1\n")
    out = subprocess.run([sys.executable, "-m", "fedlib", "run", str(bad)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 2 and "malformed YAML" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_run_many_with_a_process_pool_caches_locally_and_resumes(tmp_path):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    store = ResultCache(tmp_path)
    cfgs = [make_config(SYNTH, rounds=1, seed=s) for s in (0, 1, 2)]
    done = fedlib.run(cfgs[0], cache=store, progress=False)
    mtime = store.path(cfgs[0].key()).stat().st_mtime_ns
    # spawn, not fork: a forked child of a process whose OpenMP pool has run can hang
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = fedlib.run_many(cfgs, executor=pool, cache=store)
    assert results[0].to_dict() == done.to_dict()  # taken from the cache, not resubmitted
    assert store.path(cfgs[0].key()).stat().st_mtime_ns == mtime
    assert all(store.get(c.key()) is not None for c in cfgs)  # the workers' results were cached here
    assert [_strip_timing(r) for r in results[1:]] == [
        _strip_timing(fedlib.run(c, cache=False, progress=False)) for c in cfgs[1:]]
