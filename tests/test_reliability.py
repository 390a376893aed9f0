"""Reliability: hostile updates, divergence, interruptions, safe loading."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import fedlib
from fedlib.cache import ResultCache
from fedlib.config import make_config
from fedlib.methods import METHODS
from fedlib.screening import screen_updates, stack_received

ROOT = Path(__file__).resolve().parent.parent
BASE = dict(dataset="synthetic", n_clients=6, rounds=2, batch_size=16, seed=1)
SMALL_PARAMS = {"celm": {"lm_steps": 5, "warmup_fraction": 0.5}}
REMAINDER_ON_GLOBAL = {"qfedavg"}  # q-FedAvg: w <- sum c_k w_k + (1 - sum c_k) w_global


@pytest.mark.parametrize("method", sorted(METHODS))
def test_hostile_updates_never_corrupt_the_global_model(method):
    split = {"name": "iid", "nan_updates": 1, "huge_updates": 1}
    extra = {"server_val": 200} if METHODS[method].needs_validation else {}
    cfg = make_config(BASE, split=split, method={"name": method, **SMALL_PARAMS.get(method, {})}, **extra)
    r = fedlib.run(cfg, cache=False, progress=False)
    assert r.final["stopped"] is None and len(r.history) == 2
    roles = r.meta["client_roles"]
    nan_client, huge_client = roles.index("nan_update"), roles.index("huge_update")
    for h in r.history:
        assert h["dropped"] == [{"client": nan_client, "reason": "non-finite values"}]
        assert h["clipped"] == [huge_client]
        weights = np.asarray(h["weights"])
        assert np.isfinite(weights).all() and weights.min() >= 0
        if method in REMAINDER_ON_GLOBAL:  # 1 - sum(weights) stays on the previous global model
            assert 0 < weights.sum() <= 1 + 1e-5
        else:
            assert weights.sum() == pytest.approx(1, abs=1e-5)
        if "scores" in h:
            assert np.isfinite(h["scores"]).all()
        assert np.isfinite(h["accuracy"])
    clean = fedlib.run(make_config(cfg.to_dict(), split={"name": "iid"}), cache=False, progress=False)
    assert r.final["accuracy"] >= clean.final["accuracy"] - 0.1  # no worse than without the hostile clients


def test_screening_rules():
    g = torch.zeros(4)
    received = [torch.ones(4), torch.ones(3), torch.tensor([1.0, float("inf"), 0, 0]), torch.ones(4) * 2,
                torch.ones(4) * 1e6, torch.ones(4) * 1.5]
    flat, wrong = stack_received(received, 4)
    s = screen_updates(np.arange(6), flat, {}, g, clip_factor=10.0, wrong_shape=wrong)
    assert s.dropped == [{"client": 1, "reason": "wrong shape"}, {"client": 2, "reason": "non-finite values"}]
    assert s.clipped == [4] and s.keep.tolist() == [True, False, False, True, True, True]
    median = torch.tensor([2.0, 4.0, 2e6, 3.0]).median()  # distances of the kept rows
    assert s.flat[2].norm().item() == pytest.approx(10 * median.item(), rel=1e-5)
    assert torch.equal(s.flat[0], torch.ones(4))  # ordinary updates untouched


def test_divergence_stops_with_a_message_and_keeps_the_history():
    cfg = make_config(BASE, rounds=4, lr=1e5)
    with pytest.warns(RuntimeWarning, match="diverged"):
        r = fedlib.run(cfg, cache=False, progress=False)
    assert "diverged" in r.final["stopped"] and "smaller lr" in r.final["stopped"]
    assert len(r.history) < 4
    assert all(np.isfinite(h["accuracy"]) for h in r.history if "accuracy" in h)
    json.dumps(r.to_dict(), allow_nan=False)  # strict JSON: no NaN in the record
    assert "stopped early" in r.summary()


def test_results_record_versions_and_device():
    r = fedlib.run(make_config(BASE, rounds=1), cache=False, progress=False)
    for key in ("fedlib_version", "torch", "torchvision", "numpy", "python", "device", "config_key"):
        assert r.meta[key]


SWEEP = """
import sys, fedlib
from fedlib.config import make_config
cfgs = [make_config(dataset="synthetic", n_clients=4, rounds=8, batch_size=8, local_epochs=3, seed=s)
        for s in range(4)]
fedlib.run_many(cfgs, progress=False)
"""


def test_killed_sweep_keeps_finished_results_and_resumes(tmp_path):
    env = {**os.environ, "FEDLIB_CACHE": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", SWEEP], env=env, cwd=ROOT)
    runs = tmp_path / "runs"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(runs.glob("*.json"))) < 1:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = sorted(runs.glob("*.json"))
    assert 1 <= len(finished) < 4, "the sweep should have been killed part-way"
    store = ResultCache(runs)
    assert all(store.get(p.stem) is not None for p in finished)  # complete, checksummed entries only
    stamps = {p.name: p.stat().st_mtime_ns for p in finished}
    # resume in-process: finished runs come from the cache, the rest are computed
    cfgs = [make_config(dataset="synthetic", n_clients=4, rounds=8, batch_size=8, local_epochs=3, seed=s)
            for s in range(4)]
    results = fedlib.run_many(cfgs, cache=store, progress=False)
    assert len(results) == 4 and len(list(runs.glob("*.json"))) == 4
    assert all((runs / name).stat().st_mtime_ns == t for name, t in stamps.items())


def test_a_corrupted_cache_entry_is_recomputed(tmp_path):
    store = ResultCache(tmp_path)
    cfg = make_config(BASE, rounds=1)
    first = fedlib.run(cfg, cache=store, progress=False)
    path = store.path(cfg.key())
    path.write_text(path.read_text().replace('"rounds": 1', '"rounds": 9', 1))
    again = fedlib.run(cfg, cache=store, progress=False)
    assert again.final == first.final and store.get(cfg.key()) is not None


def test_nothing_loads_unsafely():
    sources = {p: p.read_text() for p in (ROOT / "fedlib").rglob("*.py")}
    sources.update({p: p.read_text() for p in (ROOT / "benchmarks").rglob("*.py")})
    for path, text in sources.items():
        assert "import pickle" not in text and "cloudpickle" not in text, path
        assert not re.search(r"yaml\.load\(", text), f"{path}: use yaml.safe_load"
        assert not re.search(r"allow_pickle\s*=\s*True", text), path
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, f"{path}: {call}"
        assert not re.search(r"(?<![\w.])(eval|exec)\(", text), f"{path}: eval/exec"
