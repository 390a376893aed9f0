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
from fedlib.record import reduce_history
from fedlib.screening import screen_updates, stack_received

ROOT = Path(__file__).resolve().parent.parent
BASE = dict(dataset="synthetic", n_clients=6, rounds=2, batch_size=16, seed=1)
SMALL_PARAMS = {"celm": {"lm_steps": 5, "warmup_fraction": 0.5}, "logit_meta": {"meta_labeled": 100, "meta_steps": 20}}
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
        if not METHODS[method].parameter_uploads:  # the logit protocol's client models: never clipped, and
            # the scaled client keeps its own model, which may overflow later and is then dropped too
            assert {"client": nan_client, "reason": "non-finite values"} in h["dropped"]
            assert {d["client"] for d in h["dropped"]} <= {nan_client, huge_client}
            assert h["clipped"] == [] and np.isfinite(h["accuracy"])
            continue
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
    if not METHODS[method].parameter_uploads:
        return
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


# ============================================================================= issue 15
# A hostile-but-fair probe found twelve holes; each has a test below, named by its number.
# BAD_INPUTS lists every bad config input tried (file, override and API paths): each must give
# one ConfigError line naming the field, echoing at most a short piece of the value.

import gzip  # noqa: E402
import io  # noqa: E402
import tarfile  # noqa: E402

from PIL import Image  # noqa: E402

from fedlib.app import book  # noqa: E402
from fedlib.app.kit import stored as kit_stored  # noqa: E402
from fedlib.app.kit.sources import load_profile  # noqa: E402
from fedlib.config import ConfigError, load_config  # noqa: E402
from fedlib.data import load_dataset  # noqa: E402
from fedlib.data_files import DataCorruptError  # noqa: E402

TINY = dict(BASE, rounds=1, n_clients=3, batch_size=32, fraction=0.1, test_samples=100)


def _tiny_mnist(folder: Path, shift: int) -> None:
    """A 40/20-image MNIST-format set (every class present); ``shift`` changes the pixels."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 40), ("t10k", 20)):
        labels = np.arange(count) % 10
        images = (np.repeat(labels[:, None, None] * 20 + shift, 28 * 28).reshape(count, 28, 28)) % 256
        for stem, array in ((f"{split}-images-idx3-ubyte", images), (f"{split}-labels-idx1-ubyte", labels)):
            header = bytes([0, 0, 0x08, array.ndim]) + b"".join(n.to_bytes(4, "big") for n in array.shape)
            (folder / f"{stem}.gz").write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_15_1_the_cache_key_follows_the_data_read(tmp_path):
    """Same config, another data root with other MNIST files: never the first run's numbers."""
    _tiny_mnist(tmp_path / "fake" / "mnist", shift=0)
    _tiny_mnist(tmp_path / "real" / "mnist", shift=7)
    _tiny_mnist(tmp_path / "copy" / "mnist", shift=0)  # the fake files again, elsewhere
    store = ResultCache(tmp_path / "cache")
    cfg = dict(TINY, dataset="mnist", fraction=1.0, test_samples=None)
    fake = fedlib.run(make_config(cfg, data_root=str(tmp_path / "fake")), cache=store, progress=False)
    real = fedlib.run(make_config(cfg, data_root=str(tmp_path / "real")), cache=store, progress=False)
    assert real.meta["dataset_source"] == "mnist idx files (mnist)"  # the dataset, not where it sat
    assert real.meta["data"]["sha256"] != fake.meta["data"]["sha256"]
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2
    copy = make_config(cfg, data_root=str(tmp_path / "copy"))
    assert copy.key() == make_config(cfg, data_root=str(tmp_path / "fake")).key()  # same files: same key
    assert fedlib.run(copy, cache=store, progress=False).final == fake.final


def test_15_2_reading_stored_results_never_deletes_them(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_REPO", str(tmp_path))
    folder = tmp_path / "results" / "runs"
    store = ResultCache(folder)
    cfg = make_config(TINY)
    result = fedlib.run(cfg, cache=False, progress=False)
    path = store.put(cfg.key(), {"config": cfg.to_dict(), "result": result.to_dict()})
    path.write_text(path.read_text().replace('"rounds": 1', '"rounds": 3', 1))  # hand-edited
    (folder / "conflict.json").write_text("<<<<<<< HEAD\n{}\n=======\n")  # merge conflict
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for _ in range(2):
        stored = kit_stored.stored_results("fedavg", [cfg])
        assert not stored.results and len(stored.skipped) == 2
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def _laughs(levels: int = 6) -> str:
    lines = ['a0: &a0 "lol"']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines)


def test_15_3_yaml_aliases_and_self_expanding_values_are_refused(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text("split:\n  name: iid\n  extra:\n" + "\n".join("    " + line for line in _laughs().splitlines())
                    + "\n")
    with pytest.raises(ConfigError, match="alias") as info:
        load_config(path)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300
    shared = ["lol"] * 9
    for _ in range(6):
        shared = [shared] * 9  # 9^7 values if expanded
    with pytest.raises(ConfigError, match="more than 1000 values"):
        make_config(split={"name": "iid", "extra": shared})


def test_15_4_a_cache_entry_must_answer_the_request(tmp_path):
    store = ResultCache(tmp_path)
    cfg, other = make_config(TINY), make_config(TINY, lr=0.3)
    theirs = fedlib.run(other, cache=False, progress=False)
    store.put(cfg.key(), theirs.to_dict())  # another config's numbers, valid checksum
    mine = fedlib.run(cfg, cache=store, progress=False)
    assert mine.config == cfg.to_dict() and mine.history[0]["lr"] == 0.1
    assert (tmp_path / f"{cfg.key()}.json.invalid-1").is_file()  # set aside, not deleted
    for bad in ({"foo": 1}, {**mine.to_dict(), "final": {**mine.final, "accuracy": float("nan")}},
                {**mine.to_dict(), "final": {**mine.final, "accuracy": "0.99"}}):
        store.put(cfg.key(), bad)
        again = fedlib.run(cfg, cache=store, progress=False)
        assert again.final == mine.final  # recomputed, identical
    store.path(cfg.key()).unlink()
    store.path(cfg.key()).mkdir()  # a directory at the entry path
    assert fedlib.run(cfg, cache=store, progress=False).final == mine.final
    assert len(list(tmp_path.glob("*.invalid-*"))) == 5


def test_15_5_screening_with_two_updates_explains_itself_and_never_blames_the_lr(monkeypatch):
    import fedlib.observers as engine  # where the split's hostile clients are played (Adversaries)

    original = engine.apply_roles

    def harsher(flat, clients, roles, global_flat, generator):  # a 1e30-sized poisoned update
        out = original(flat, clients, roles, global_flat, generator)
        huge = torch.from_numpy(np.asarray(roles)[clients] == "huge_update")
        out[huge] = global_flat + 1e24 * (out[huge] - global_flat)
        return out

    monkeypatch.setattr(engine, "apply_roles", harsher)
    cfg = make_config(TINY, n_clients=2, rounds=2, split={"name": "iid", "huge_updates": 1})
    with warnings_allowed():
        r = fedlib.run(cfg, cache=False, progress=False)
    first = r.history[0]
    assert any("not clipped" in note and ">= 3" in note for note in first["screening"])
    huge_client = r.meta["client_roles"].index("huge_update")
    assert any(f"[{huge_client}]" in note for note in first["screening"])
    if r.final["stopped"]:  # the poisoned update is named, the lr is not blamed
        assert f"[{huge_client}]" in r.final["stopped"] and "poisoned" in r.final["stopped"]
        assert "smaller lr" not in r.final["stopped"]
    json.dumps(r.to_dict(), allow_nan=False)  # strict JSON
    flagged = [h for h in r.history if h.get("non_finite")]
    assert all(h[k] is None for h in flagged for k in h["non_finite"] if "." not in k and "[" not in k)


class warnings_allowed:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


def _png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (8, 8), value).save(buffer, format="PNG")
    return buffer.getvalue()


def _image_tar(path: Path, compress: bool) -> list[tuple[str, bytes]]:
    members = [(f"{split}/{cls}/{i}.png", _png(40 * i + (100 if cls == "b" else 0)))
               for split in ("train", "test") for cls in ("a", "b") for i in range(4)]
    with tarfile.open(path, "w:gz" if compress else "w") as archive:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return members


def test_15_6_truncated_archives_and_bad_gzip_crc_are_detected(tmp_path):
    whole = tmp_path / "whole.tar"
    _image_tar(whole, compress=False)
    assert len(load_dataset(f"imagefolder:{whole}", cache_dir=tmp_path / "c").y_test) == 8
    cut = tmp_path / "cut.tar"  # cut at a member boundary: the test set keeps 2 images of class a
    with tarfile.open(whole) as archive:
        tenth = [m for m in archive.getmembers()][10]
    cut.write_bytes(whole.read_bytes()[:tenth.offset])
    with pytest.raises(DataCorruptError, match="truncated|no image of class"):
        load_dataset(f"imagefolder:{cut}", cache_dir=tmp_path / "c")
    gz = tmp_path / "data.tar.gz"
    _image_tar(gz, compress=True)
    damaged = bytearray(gz.read_bytes())
    damaged[-8] ^= 0xFF  # the gzip trailer's CRC32
    bad = tmp_path / "crc.tar.gz"
    bad.write_bytes(bytes(damaged))
    with pytest.raises(DataCorruptError, match="CRC"):
        load_dataset(f"imagefolder:{bad}", cache_dir=tmp_path / "c")


def test_15_7_client_chunk_is_part_of_the_key(tmp_path):
    store = ResultCache(tmp_path)
    whole = fedlib.run(make_config(TINY), cache=store, progress=False)
    chunked = fedlib.run(make_config(TINY, client_chunk=1), cache=store, progress=False)
    assert chunked.config["client_chunk"] == 1 and whole.config["client_chunk"] is None
    assert make_config(TINY).key() != make_config(TINY, client_chunk=1).key()


BAD_INPUTS = [  # (config data, field named in the one-line error)
    ({"model": "resnet9000"}, "model"),
    ({"split": {"name": "dirichlet", "alpha": "abc"}}, "split.alpha"),
    ({"seed": 1e23}, "seed"),
    ({"rounds": 1e30}, "rounds"),
    ({"dataset": "imagefolder:"}, "dataset"),
    ({"batch_size": 1e10}, "batch_size"),
    ({"lr": float("inf")}, "lr"),
    ({"lr": float("nan")}, "lr"),
    ({"rounds": True}, "rounds"),
    ({"n_clients": False}, "n_clients"),
    ({"split": {"name": "iid", "nan_updates": -1}}, "split.nan_updates"),
    ({"split": {"name": "iid", "huge_updates": -2}}, "split.huge_updates"),
    ({"split": {"name": "iid", "huge_updates": 1.5}}, "split.huge_updates"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**40}, "seed"),
    ({"n_clients": 10**9}, "n_clients"),
    ({"local_epochs": 10**6}, "local_epochs"),
    ({"lr_milestones": [True]}, "lr_milestones"),
    ({"lr_milestones": list(range(1, 5000))}, "lr_milestones"),
    ({"device": "x" * 50_000_000}, "device"),
    ({"data_root": "y" * 50_000_000}, "data_root"),
    ({"method": {"name": "fedprox", "mu": float("inf")}}, "mu"),
    ({"split": {"name": "dirichlet", "alpha": float("nan")}}, "alpha"),
    ({"split": {"name": "iid", "extra": list(range(5000))}}, "extra"),
    ({"test_samples": 10**12}, "test_samples"),
]


@pytest.mark.parametrize("data,field", BAD_INPUTS, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD_INPUTS)])
def test_15_8_and_9_bad_values_give_one_short_line_naming_the_field(data, field):
    with pytest.raises(ConfigError) as info:
        make_config(data)
    message = str(info.value)
    assert "\n" not in message and field in message and len(message) < 400


@pytest.mark.parametrize("value", ["file.yaml", Path("file.yaml"), ["rounds", 2], 5, b"rounds: 2"])
def test_15_8_the_api_takes_configs_only_and_says_so_in_one_line(value):
    with pytest.raises(ConfigError, match="expected a RunConfig or a mapping") as info:
        fedlib.run(value, cache=False, progress=False)
    assert "\n" not in str(info.value)


BAD_FILES = [  # (file content, text in the error)
    (b"rounds: 3\nlr: \xff\xfe\n", "not UTF-8"),
    (b"", "empty config file"),
    (b"# only a comment\n", "empty config file"),
    (b"lr_milestones: [" + b"1, " * 150_000 + b"1]\n", "too large"),
    (b"rounds: &r 3\nlocal_epochs: *r\n", "alias"),
    (b"split: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply|too large|malformed"),
    (b"rounds: [3\n", "malformed YAML"),
    (b"- rounds\n", "expected a mapping"),
    (b"seed: 1.0e+23\n", "seed"),
    (b"rounds: 1.0e+30\n", "rounds"),
    (b"batch_size: 1.0e+10\n", "batch_size"),
    (b"split: {name: dirichlet, alpha: abc}\n", "split.alpha"),
    (b"dataset: 'imagefolder:'\n", "dataset"),
    (b"model: nope\n", "model"),
    (b"lr: .inf\n", "lr"),
    (b"rounds: true\n", "rounds"),
]


@pytest.mark.parametrize("content,text", BAD_FILES, ids=[f"file-{i}" for i in range(len(BAD_FILES))])
def test_15_8_and_9_bad_config_files_give_one_line(tmp_path, content, text):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=text) as info:
        load_config(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert time.perf_counter() - t0 < 5


BAD_OVERRIDES = [["rounds=[1"], ["=3"], ["rounds"], ["split.=2"], ["rounds=*a"], ["lr=.inf"], ["rounds=true"],
                 ["model=nope"]]


@pytest.mark.parametrize("tokens", BAD_OVERRIDES, ids=[t[0] for t in BAD_OVERRIDES])
def test_15_8_malformed_overrides_give_one_line_and_status_2(tmp_path, capsys, tokens):
    from fedlib.__main__ import main

    path = tmp_path / "base.yaml"
    path.write_text("dataset: synthetic\nrounds: 1\n")
    assert main(["run", str(path), *tokens]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedlib: ") and "\n" not in err and "Traceback" not in err


def test_15_10_the_npz_dataset_cache_is_checked_against_its_source(tmp_path):
    tree = tmp_path / "tree"
    for split in ("train", "test"):
        for cls, value in (("a", 10), ("b", 200)):
            (tree / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.new("L", (8, 8), value + i).save(tree / split / cls / f"{i}.png")
    name = f"imagefolder:{tree}"
    first = load_dataset(name, cache_dir=tmp_path / "cache")
    (cache_file,) = (tmp_path / "cache").glob("*.npz")
    with np.load(cache_file, allow_pickle=False) as npz:
        fields = {k: npz[k] for k in npz.files}
    fields["y_train"] = 1 - fields["y_train"]  # self-consistent but wrong labels, every other field kept
    with open(cache_file, "wb") as fh:
        np.savez(fh, **fields)
    with warnings_allowed():
        again = load_dataset(name, cache_dir=tmp_path / "cache")
    assert torch.equal(again.y_train, first.y_train) and torch.equal(again.x_train, first.x_train)


ORPHAN = """
import multiprocessing, sys, time
from concurrent.futures import ProcessPoolExecutor
import fedlib
from fedlib.config import make_config
pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
cfg = make_config(dataset="synthetic", n_clients=3, rounds=100000, batch_size=16, eval_every=1000, seed=5)
def report():
    while not pool._processes:
        time.sleep(0.05)
    print(*pool._processes, flush=True)
import threading
threading.Thread(target=report, daemon=True).start()
fedlib.run_many([cfg], executor=pool, cache=False, progress=False)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_15_11_pool_workers_exit_when_the_sweep_is_killed(tmp_path):
    env = {**os.environ, "FEDLIB_CACHE": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in proc.stdout.readline().split()]
    assert workers
    time.sleep(12)  # the worker has imported fedlib and is training
    assert all(_alive(pid) for pid in workers)
    proc.kill()
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.2)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:  # do not leave them behind if the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, "pool workers outlived their parent"


def test_15_12_overrides_may_follow_flags(tmp_path):
    from fedlib.__main__ import main

    path = tmp_path / "base.yaml"
    path.write_text("dataset: synthetic\nn_clients: 3\nrounds: 4\nbatch_size: 32\nfraction: 0.1\n"
                    "split: {name: dirichlet, alpha: 0.5}\n")
    out = tmp_path / "r.json"
    assert main(["run", str(path), "--no-cache", "rounds=1", "--json", str(out), "split.alpha=0.3"]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["rounds"] == 1 and result["config"]["split"] == {"name": "dirichlet", "alpha": 0.3}


# ============================================================================= issue 23
# A cached or stored run never outlives the rule that produced it.


def test_23_a_method_default_or_rule_version_change_changes_the_key(monkeypatch):
    from dataclasses import dataclass

    from fedlib.methods.gradient import ShapFed

    cfg = make_config(TINY, method={"name": "shapfed"})
    key, config_key = cfg.key(), cfg.config_key()
    assert cfg.resolved()["method"] == {"name": "shapfed", **ShapFed.hyperparameters()}
    version = ShapFed.rule_version

    @dataclass
    class ShapFedOtherMu(ShapFed):
        mu: float = 0.25

    monkeypatch.setitem(METHODS, "shapfed", ShapFedOtherMu)
    assert cfg.key() != key and cfg.config_key() != config_key
    monkeypatch.setitem(METHODS, "shapfed", ShapFed)
    assert cfg.key() == key
    monkeypatch.setattr(ShapFed, "rule_version", version + ".1")
    assert cfg.key() != key
    monkeypatch.setattr(fedlib.config, "ENGINE_VERSION", fedlib.config.ENGINE_VERSION + ".1")
    monkeypatch.setattr(ShapFed, "rule_version", version)
    assert cfg.key() != key


def test_23_results_record_what_produced_them():
    r = fedlib.run(make_config(TINY, method={"name": "fedprox"}), cache=False, progress=False)
    meta = r.meta
    assert meta["resolved"]["method"] == {"name": "fedprox", "mu": 0.01}
    assert meta["rule_versions"] == {"engine": fedlib.config.ENGINE_VERSION, "fedprox": "1"}
    assert meta["data"]["source"].startswith("synthetic") and len(meta["data"]["sha256"]) == 64
    assert meta["config_key"] == make_config(TINY, method={"name": "fedprox"}).key()


def test_23_a_stored_run_of_an_older_rule_is_listed_stale_not_current(tmp_path, monkeypatch):
    from fedlib.methods.gradient import ShapFed

    monkeypatch.setenv("FEDLIB_REPO", str(tmp_path))
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))
    cfg = make_config(TINY, method={"name": "shapfed"})
    written = book.store_results("demo", [cfg], progress=False)
    assert list(kit_stored.stored_results("demo", [cfg]).results) == [cfg.key()]
    version = ShapFed.rule_version
    monkeypatch.setattr(ShapFed, "rule_version", version + ".1")
    stored = kit_stored.stored_results("demo", [cfg])
    current, stale = stored.results, stored.stale
    assert current == {} and list(stale) == [written[0].name]
    assert stale[written[0].name]["changed"] == [f"shapfed rule version {version} -> {version}.1"]
    assert f"shapfed rule version {version} -> {version}.1" in kit_stored.stored_results("demo", [cfg]).describe()
    assert fedlib.run(cfg, cache=ResultCache(tmp_path / "cache" / "runs"), progress=False).meta["rule_versions"][
        "shapfed"] == version + ".1"  # the cache does not answer with the old rule's numbers either


def test_a_run_computed_on_another_device_answers_the_chapters_config():
    """The results queue runs a chapter's CPU config on a GPU and stores it under the CPU key: the
    recorded placement (meta.resolved.device) does not make it stale; any other field does."""
    from fedlib.results import result_check

    cfg = make_config(TINY, method={"name": "fedprox"})
    payload = fedlib.run(cfg, cache=False, progress=False).to_dict()
    on_gpu = {**payload, "meta": {**payload["meta"], "resolved": {**payload["meta"]["resolved"], "device": "cuda"}}}
    check = result_check(cfg, cfg.data_fingerprint())
    assert check(payload) is None and check(on_gpu) is None
    other = {**payload["meta"]["resolved"], "device": "cuda", "lr": 0.5}
    assert check({**payload, "meta": {**payload["meta"], "resolved": other}}) == "its config is not the requested one"
    assert kit_stored.what_changed({**payload["meta"], "resolved": other}, cfg, cfg.data_fingerprint()) == [
        f"lr: 0.5 -> {cfg.lr}"]


def test_a_gpu_run_stored_under_the_chapters_key_is_shown_not_stale(tmp_path, monkeypatch):
    """The queue's GPU run keeps its own config_key (device "cuda") but lives under the chapter's
    CPU key: the page shows it as current; a run of another config under that key stays stale."""
    from fedlib.results import store_run

    monkeypatch.setenv("FEDLIB_REPO", str(tmp_path))
    cfg = make_config(TINY, method={"name": "fedprox"})
    on_gpu = make_config(cfg.to_dict(), device="auto")  # another placement, another config_key
    result = fedlib.run(on_gpu, cache=False, progress=False).to_dict()
    assert result["meta"]["config_key"] != cfg.key()
    store_run(cfg.key(), cfg.to_dict(), result)
    stored = kit_stored.stored_results("demo", [cfg])
    assert list(stored.results) == [cfg.key()] and not stored.stale
    other = make_config(cfg.to_dict(), lr=0.5)
    store_run(other.key(), other.to_dict(), fedlib.run(other, cache=False, progress=False).to_dict())
    assert list(kit_stored.stored_results("demo", [cfg]).results) == [cfg.key()]  # the other config is not ours


def test_23_migration_rekeys_provably_identical_runs_and_leaves_the_rest_stale(tmp_path, monkeypatch):
    from dataclasses import dataclass

    from fedlib.app.migrate import migrate_results
    from fedlib.methods.fairness import QFedAvg

    monkeypatch.setenv("FEDLIB_REPO", str(tmp_path))
    runs = tmp_path / "results" / "runs"
    same = make_config(TINY, method={"name": "fedprox"})
    changed = make_config(TINY, method={"name": "qfedavg"})
    results = {c.method.name: fedlib.run(c, cache=False, progress=False) for c in (same, changed)}
    old_same = ResultCache(runs).put("a" * 20, {"config": same.to_dict(), "result": results["fedprox"].to_dict()})
    old_changed = ResultCache(runs).put(changed.key(), {"config": changed.to_dict(),
                                                        "result": results["qfedavg"].to_dict()})
    history_text = json.dumps(reduce_history(json.loads(old_same.read_text())["payload"]["result"]["history"]),
                              indent=1)  # the history as the compact record keeps it (fedlib.record)

    @dataclass
    class QFedAvgOtherQ(QFedAvg):  # q-FedAvg's default changed since the stored run
        q: float = 0.25

    monkeypatch.setitem(METHODS, "qfedavg", QFedAvgOtherQ)
    assert migrate_results(tmp_path / "results", dry_run=True)["rekeyed"] == [("a" * 20, same.key())]
    assert old_same.exists()
    report = migrate_results(tmp_path / "results", today="2026-11-26")
    assert report["rekeyed"] == [("a" * 20, same.key())]
    assert [name for name, _ in report["stale"]] == [old_changed.name] and "method.q" in report["stale"][0][1]
    new = ResultCache(runs).get(same.key())
    assert new is not None and not old_same.exists() and old_changed.exists()
    assert json.dumps(new["result"]["history"], indent=1) == history_text and new["config"] == same.to_dict()
    assert new["result"]["meta"]["rekeyed"] == f"re-keyed from {'a' * 20} on 2026-11-26: records the current variant"
    stored = kit_stored.stored_results("demo", [same, changed])
    assert list(stored.results) == [same.key()] and list(stored.stale) == [old_changed.name]
    assert migrate_results(tmp_path / "results")["current"] == [same.key()]  # idempotent


def test_the_stored_runs_of_the_repository_are_current_or_listed_stale():
    from fedlib.app.migrate import migrate_results

    report = migrate_results(ROOT / "results", dry_run=True)
    assert not report["rekeyed"], "run: python -m fedlib migrate-results"
    stored = [*(ROOT / "results").glob("*/*.json"), *(ROOT / "results").glob("*/*.json.gz")]
    assert len(report["current"]) + len(report["stale"]) == len(stored)


def test_23_a_run_whose_clipping_never_acted_is_adopted_as_the_unclipped_run(tmp_path, monkeypatch):
    """Paper profiles run with clipping off; a stored clipped run whose history shows no clip is
    the same computation, so it is stored under the unclipped config (history byte-identical),
    while a run that did clip is not adopted."""
    from fedlib.app.migrate import adopt_unclipped

    monkeypatch.setenv("FEDLIB_REPO", str(tmp_path))
    root = tmp_path / "results"
    clipped = make_config(TINY, method={"name": "fedavg"}, update_clip=10.0)
    unclipped = make_config(TINY, method={"name": "fedavg"}, update_clip=None)
    result = fedlib.run(clipped, cache=False, progress=False)
    assert not any(h["clipped"] for h in result.history)
    source = ResultCache(root / "other", protect=True).put(clipped.key(), {"config": clipped.to_dict(),
                                                                           "result": result.to_dict()})
    acted = make_config(TINY, method={"name": "fedprox"}, update_clip=10.0)
    forged = result.to_dict()
    forged["history"] = [{**forged["history"][0], "clipped": [1]}, *forged["history"][1:]]
    forged["config"] = acted.to_dict()
    ResultCache(root / "other", protect=True).put(acted.key(), {"config": acted.to_dict(), "result": forged})
    wanted = [unclipped, make_config(TINY, method={"name": "fedprox"}, update_clip=None)]
    adopted = adopt_unclipped("demo", wanted, root, today="2026-11-26")
    assert [(src, key) for src, key, _ in adopted] == [(f"other/{source.name}", unclipped.key())]
    new = ResultCache(root / "runs").get(unclipped.key())
    assert new["config"]["update_clip"] is None and source.exists()  # the clipped run stays
    assert json.dumps(new["result"]["history"]) == json.dumps(reduce_history(result.to_dict()["history"]))
    assert "no update was ever clipped" in new["result"]["meta"]["rekeyed"]
    assert kit_stored.stored_results("demo", wanted).results.keys() == {unclipped.key()}
    assert adopt_unclipped("demo", wanted, root) == []  # idempotent


def test_15_1_the_fedscm_pipeline_cache_key_follows_the_data_read(monkeypatch):
    """The FedSCM pipeline's cache is keyed like the run cache: other files, another key."""
    import fedlib.data
    from fedlib.config import ScmConfig

    cfg = ScmConfig.make({"dataset": "synthetic", "n_clients": 12})
    key = cfg.key()
    real = fedlib.data.data_fingerprint
    monkeypatch.setattr(fedlib.data, "data_fingerprint",
                        lambda name, root=None: {**real(name, root), "sha256": "0" * 64})
    assert cfg.key() != key
    monkeypatch.setattr(fedlib.data, "data_fingerprint", real)
    assert cfg.key() == key


def test_16_a_cache_entry_and_a_stored_copy_are_the_same_json(tmp_path, monkeypatch):
    """fedlib.run's cache entry is a stored run: copied into results/runs/ the chapters read it,
    and the store answers fedlib.run as a cache; a bare result (the old cache format) still reads."""
    import shutil

    monkeypatch.setenv("FEDLIB_REPO", str(tmp_path))
    cfg = make_config(TINY)
    cache = ResultCache(tmp_path / "cache")
    first = fedlib.run(cfg, cache=cache, progress=False)
    entry = json.loads(cache.path(cfg.key()).read_text())["payload"]
    assert set(entry) >= {"config", "result", "commit", "device", "date", "wall_time"}
    assert entry["config"] == cfg.to_dict() and entry["result"]["final"] == first.final
    (tmp_path / "results" / "runs").mkdir(parents=True)
    shutil.copy(cache.path(cfg.key()), tmp_path / "results" / "runs")
    assert list(kit_stored.stored_results("demo", [cfg]).results) == [cfg.key()]
    again = fedlib.run(cfg, cache=ResultCache(tmp_path / "results" / "runs", protect=True), progress=False)
    assert again.to_dict() == first.to_dict()
    old = ResultCache(tmp_path / "old")
    old.put(cfg.key(), first.to_dict())  # the cache's format before one store
    assert fedlib.run(cfg, cache=old, progress=False).to_dict() == first.to_dict()


# --- store, config, queue (issue 33)

import errno  # noqa: E402
import stat as stat_module  # noqa: E402
import threading  # noqa: E402

from fedlib.__main__ import main as cli  # noqa: E402
from fedlib.app import queue as fedlib_queue  # noqa: E402


def _one_line_err(capsys, prefix: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(prefix) and "\n" not in err and "Traceback" not in err, err
    return err


def _unwritable(kind: str, monkeypatch, tmp_path: Path) -> tuple[ResultCache, str]:
    """A cache that cannot be written, and the cause its one line must name."""
    import fedlib.cache

    if kind == "a file in the way":  # FEDLIB_CACHE pointing at a file
        (tmp_path / "afile").write_text("not a folder")
        return ResultCache(tmp_path / "afile" / "runs"), "Not a directory"
    causes = {"full disk": (errno.ENOSPC, "No space left on device"),
              "read-only": (errno.EROFS, "Read-only file system"),
              "another user's folder": (errno.EACCES, "Permission denied")}
    code, text = causes[kind]

    def refuse(*args, dir=None, **kwargs):
        raise (PermissionError if code == errno.EACCES else OSError)(code, text, str(dir))

    monkeypatch.setattr(fedlib.cache.tempfile, "mkstemp", refuse)
    return ResultCache(tmp_path / "cache"), text


@pytest.mark.parametrize("kind", ["a file in the way", "full disk", "read-only", "another user's folder"])
def test_33_1_a_finished_run_is_returned_when_the_cache_cannot_be_written(kind, tmp_path, monkeypatch):
    from fedlib.cache import CacheWriteWarning

    store, cause = _unwritable(kind, monkeypatch, tmp_path)
    with pytest.warns(CacheWriteWarning) as caught:
        result = fedlib.run(make_config(TINY), cache=store, progress=False)
    assert result.final["rounds_completed"] == 1 and 0 <= result.final["accuracy"] <= 1
    message = str(caught[0].message)
    assert "\n" not in message and cause in message and str(store.root) in message
    assert not list(tmp_path.rglob("*.json"))  # nothing half-written


def test_33_1_the_cli_writes_json_first_and_reports_the_cache_in_one_line(tmp_path, monkeypatch, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("dataset: synthetic\nn_clients: 3\nrounds: 1\nbatch_size: 32\nfraction: 0.1\n"
                      "test_samples: 100\nseed: 1\n")
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "afile"))
    out = tmp_path / "result.json"
    assert cli(["run", str(config), "--json", str(out)]) == 0
    captured = capsys.readouterr()
    lines = [line.rsplit("\r", 1)[-1] for line in captured.err.splitlines()]  # after the progress bar
    errors = [line for line in lines if line.startswith("fedlib")]
    assert len(errors) == 1 and errors[0].startswith("fedlib: could not cache the result")
    assert str(tmp_path / "afile") in errors[0] and "Not a directory" in errors[0] and "Traceback" not in captured.err
    assert json.loads(out.read_text())["final"]["rounds_completed"] == 1 and "final:" in captured.out
    (tmp_path / "adir").mkdir()  # a --json target that cannot be written: one line, the numbers still shown
    assert cli(["run", str(config), "--json", str(tmp_path / "adir"), "--no-cache"]) == 1
    captured = capsys.readouterr()
    assert "could not write --json" in captured.err and "Traceback" not in captured.err and "final:" in captured.out


@pytest.fixture(scope="module")
def tiny_results():
    """A run of TINY and one of another config (seed 2): JSON-ready results."""
    mine, other = make_config(TINY), make_config(TINY, seed=2)
    return {"mine": (mine, fedlib.run(mine, cache=False, progress=False).to_dict()),
            "other": (other, fedlib.run(other, cache=False, progress=False).to_dict())}


def _queue_store(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "out"))
    monkeypatch.setattr(kit_stored, "repo_results", lambda: tmp_path / "repo")
    return tmp_path / "out" / "runs"


def _damage(kind: str, runs: Path, key: str, tiny_results) -> None:
    from fedlib.results import store_run

    path = ResultCache(runs, protect=True).path(key)
    good = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "another run's content":
        other, result = tiny_results["other"]
        path.unlink()
        store_run(key, other.to_dict(), result, runs.parent)
    elif kind == "wrong schema":
        path.unlink()
        ResultCache(runs, protect=True).put(key, {"config": TINY, "result": {"x": 1}})
    elif kind == "score out of range":
        mine, result = tiny_results["mine"]
        path.unlink()
        store_run(key, mine.to_dict(), {**result, "final": {**result["final"], "accuracy": 1.5}}, runs.parent)


DAMAGED = ["truncated", "empty", "another run's content", "wrong schema", "score out of range"]


@pytest.mark.parametrize("kind", DAMAGED)
def test_33_2_the_queue_judges_a_stored_run_by_content_and_sets_a_damaged_one_aside(kind, tmp_path, monkeypatch,
                                                                                     tiny_results):
    runs = _queue_store(tmp_path, monkeypatch)
    config, result = tiny_results["mine"]
    item = fedlib_queue.QueueItem("demo", "Table 1", "row", "col", config.seed, config, fedlib_queue.run_round)
    fedlib_queue.store_payload(item, result, "paper")
    assert fedlib_queue.plan(items=[item], cost_model=fedlib_queue.CostModel())[0].stored
    _damage(kind, runs, item.key, tiny_results)
    path = ResultCache(runs, protect=True).path(item.key)
    damaged = path.read_bytes()
    entry = fedlib_queue.plan(items=[item], cost_model=fedlib_queue.CostModel())[0]
    assert not entry.stored and entry.damaged and item.key in entry.damaged  # pending again
    assert "damaged file" in fedlib_queue.format_list([entry])
    assert path.read_bytes() == damaged  # reading moved nothing
    fedlib_queue.store_payload(item, result, "paper")  # the rerun: the damaged file is set aside, not deleted
    assert path.with_name(f"{path.name}.invalid-1").read_bytes() == damaged
    assert fedlib_queue.is_stored(item)


def _in_thread(function, timeout: float = 20.0):
    """(finished, value): ``function()`` in a daemon thread, given ``timeout`` seconds."""
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", function()), daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), box.get("value")


def test_33_6_special_and_huge_files_under_runs_are_refused_unopened(tmp_path, monkeypatch, tiny_results):
    from fedlib.cache import MAX_ENTRY_BYTES

    runs = _queue_store(tmp_path, monkeypatch)
    config, result = tiny_results["mine"]
    elsewhere = ResultCache(tmp_path / "elsewhere").put("x", {"config": config.to_dict(), "result": result})
    runs.mkdir(parents=True)
    os.mkfifo(runs / "fifo.json")
    (runs / "link.json").symlink_to(elsewhere)  # a valid entry, but a link
    with open(runs / "huge.json", "wb") as fh:  # sparse: no disk used
        fh.truncate(MAX_ENTRY_BYTES + 1)
    store = ResultCache(runs, protect=True)

    def look():
        model = fedlib_queue.CostModel.from_results(runs)
        return model, {k: store.read(k) for k in ("fifo", "link", "huge")}

    finished, value = _in_thread(look)
    if not finished:  # an old reader blocked on the FIFO: release it before failing
        fd = os.open(runs / "fifo.json", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    assert finished, "a FIFO under results/runs/ blocked the reader"
    model, read = value
    assert model.samples == []
    assert read["fifo"][0] is None and "FIFO" in read["fifo"][1]
    assert read["link"][0] is None and "symbolic link" in read["link"][1]
    assert read["huge"][0] is None and "too large" in read["huge"][1]
    (runs / "zero.json").symlink_to("/dev/zero")  # would read forever
    finished, value = _in_thread(look)
    assert finished and store.read("zero")[0] is None and "symbolic link" in store.read("zero")[1]
    linked = fedlib_queue.QueueItem("demo", "T", "r", "c", 0, config, fedlib_queue.run_round)
    (runs / f"{config.key()}.json").symlink_to(elsewhere)
    stored, problem = fedlib_queue.stored_state(linked)
    assert not stored and "symbolic link" in problem


def test_33_6_no_symlink_or_special_file_is_committed_under_results_runs():
    listing = subprocess.run(["git", "ls-files", "-s", "results/runs"], cwd=ROOT, capture_output=True, text=True)
    assert listing.returncode == 0 and listing.stdout.strip()
    assert [line for line in listing.stdout.splitlines() if not line.startswith("100644 ")] == []


_STORE_AND_LOG = """
import json, sys, time
from fedlib.cache import ResultCache
config, key, runs, log = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
with open(log, "a") as fh:
    fh.write(key + "\\n")
time.sleep(0.3)
ResultCache(runs, protect=True).put(key, {"config": config, "result": {"meta": {}}})
"""


def test_33_4_two_queues_on_one_store_claim_each_run(tmp_path, monkeypatch):
    import socket

    runs = _queue_store(tmp_path, monkeypatch)
    log = tmp_path / "started.txt"
    items = [fedlib_queue.QueueItem("demo", "T", f"r{i}", "c", 0, _FakeConfig(f"k{i}"), lambda c: {}) for i in range(4)]

    def command(entry, profile, device):
        return [sys.executable, "-c", _STORE_AND_LOG, json.dumps(entry.item.config.to_dict()), entry.item.key,
                str(runs), str(log)]

    def one_queue():
        entries = [fedlib_queue.Entry(i, 1.0, "test", False, None) for i in items]
        return fedlib_queue.run_queue(entries, workers=2, log=lambda _: None, command=command, poll=0.05)

    threads = [threading.Thread(target=one_queue) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    started = log.read_text().split()
    assert sorted(started) == [f"k{i}" for i in range(4)]  # each run once, not once per queue
    assert all(fedlib_queue.is_stored(i) for i in items) and not list(runs.glob(".*.claim"))
    # a live owner's claim holds; a dead owner's is taken over
    live = {"pid": os.getppid(), "host": socket.gethostname(), "since": 0}
    (runs / ".held.claim").write_text(json.dumps(live))
    assert fedlib_queue.claim("held", runs.parent) == (False, live)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (runs / ".gone.claim").write_text(json.dumps({**live, "pid": dead.pid}))
    assert fedlib_queue.claim("gone", runs.parent) == (True, None)
    assert json.loads((runs / ".gone.claim").read_text())["pid"] == os.getpid()
    fedlib_queue.release("gone", runs.parent)
    assert not (runs / ".gone.claim").exists() and (runs / ".held.claim").exists()
    (runs / ".cut.claim").write_text("")  # a writer died between creating and filling its claim
    assert fedlib_queue.claim("cut", runs.parent)[0] is False  # held while it may be being written
    os.utime(runs / ".cut.claim", (time.time() - 120, time.time() - 120))
    assert fedlib_queue.claim("cut", runs.parent) == (True, None)


class _FakeConfig:
    dataset, model, rounds, local_epochs, n_clients, fraction, seed = "fmnist", "mlp", 1, 1, 5, 1.0, 0

    def __init__(self, name):
        self.name = name

    def key(self):
        return self.name

    def to_dict(self):
        return {"name": self.name}


_DATA_PATHS = """
import io, json, os, sys
from contextlib import redirect_stderr
from fedlib.__main__ import main
out = []
for path in sys.argv[2:]:
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["run", sys.argv[1], f"dataset=imagefolder:{path}"])
    out.append([code, err.getvalue()])
print(json.dumps(out))
"""


def test_33_7_fifos_devices_and_dev_paths_are_refused_in_one_line(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("n_clients: 3\nrounds: 1\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    paths = [tmp_path / "fifo", "/dev/zero", tmp_path / "zero", "/dev/null"]
    env = {**os.environ, "FEDLIB_CACHE": str(tmp_path / "cache")}
    try:  # a reader that opens them blocks (FIFO) or reads forever (/dev/zero): a time limit
        done = subprocess.run([sys.executable, "-c", _DATA_PATHS, str(config), *map(str, paths)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a special data path blocked or read forever")
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for path, (code, err) in zip(paths, results):
        assert code == 2 and err.startswith("fedlib: ") and err.count("\n") == 1, (path, err)
        assert str(path) in err and "refused" in err


def test_33_7_a_permission_error_is_one_line_naming_the_path(tmp_path, monkeypatch):
    import fedlib.data_files
    from fedlib.data_files import DataNotFoundError

    _image_tar(tmp_path / "tree.tar", compress=False)
    secret = tmp_path / "tree.tar"

    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(fedlib.data_files, "_file_sha256", denied)
    with pytest.raises(DataNotFoundError) as info:
        load_dataset(f"imagefolder:{secret}", cache_dir=tmp_path / "c")
    assert "\n" not in str(info.value) and str(secret) in str(info.value) and "permission denied" in str(info.value)


def _deep(levels: int):
    value = 1
    for _ in range(levels):
        value = [value]
    return value


EXTREME_CONFIGS = [  # (config data, text of the one-line error)
    ({"lr": 1e308}, "lr"),
    ({"weight_decay": 1e308}, "weight_decay"),
    ({"lr": 1e7}, "lr"),
    ({"x" * 1_000_000: 1}, "unknown key"),
    ({"split": {"name": "iid", "a": _deep(900)}}, "nested"),
    ({"rounds": np.bool_(True)}, "numpy boolean"),
    ({"lr_milestones": [np.bool_(True)]}, "numpy boolean"),
]


@pytest.mark.parametrize("data,text", EXTREME_CONFIGS, ids=[f"extreme-{i}" for i in range(len(EXTREME_CONFIGS))])
def test_33_8_config_extremes_give_one_short_config_error(data, text):
    with pytest.raises(ConfigError) as info:
        make_config(data)
    message = str(info.value)
    assert type(info.value) is ConfigError and "\n" not in message and text in message and len(message) < 400


def test_33_8_fedscm_rates_are_bounded_and_minus_zero_is_zero():
    from fedlib.config import ScmConfig

    with pytest.raises(ConfigError, match="lr"):
        ScmConfig.make({"lr": 1e308})
    assert make_config(TINY, momentum=-0.0).key() == make_config(TINY, momentum=0.0).key()
    plain = make_config(TINY, split={"name": "iid", "covariate_shift": 0.0})
    assert make_config(TINY, split={"name": "iid", "covariate_shift": -0.0}).key() == plain.key()
    assert make_config(TINY, momentum=-0.0).to_dict()["momentum"] == 0.0
    assert str(make_config(TINY, momentum=-0.0).momentum) == "0.0"


@pytest.mark.parametrize("cache", ["no", 1, None, "False"])
def test_33_8_cache_takes_only_booleans_or_a_store(cache):
    from fedlib.config import ScmConfig
    from fedlib.scm_pipeline import run_pipeline

    with pytest.raises(ConfigError, match="cache: must be True, False or a fedlib.cache.ResultCache"):
        fedlib.run(make_config(TINY), cache=cache, progress=False)
    with pytest.raises(ConfigError, match="cache: must be True, False or a fedlib.cache.ResultCache"):
        run_pipeline(ScmConfig.make({"dataset": "synthetic", "n_clients": 12}), cache=cache)


BAD_PARAMETERS = [  # (papermill values over the quick profile, text of the one line)
    ({"roundz": 1}, "unknown parameter 'roundz'"),
    ({"profile": "nosuch"}, "unknown profile 'nosuch'; known: evidence, paper, quick, smoke"),
    ({"seeds": 5}, "parameter seeds: Input should be a valid list (got 5)"),
    ({"seeds": []}, "parameter seeds: List should have at least 1 item after validation, not 0 (got [])"),
    ({"seeds": ["a"]}, "parameter seeds.0: Input should be a valid integer (got 'a')"),
    ({"rounds": "10"}, "parameter rounds: Input should be a valid integer (got '10')"),
    ({"rounds": 10.0}, "parameter rounds: Input should be a valid integer (got 10.0)"),
    ({"cffl_study": {"split": "PLS"}}, "missing parameter 'cffl_study.fraction'"),
]


@pytest.mark.parametrize("values,text", BAD_PARAMETERS, ids=[f"param-{i}" for i in range(len(BAD_PARAMETERS))])
def test_33_9_chapters_check_their_papermill_parameters(values, text):
    from fedlib.app.chapters.base import ChapterParameterError, check_parameters

    namespace = {**load_profile("celm", "quick"), "profile": "quick", **values}
    with pytest.raises(ChapterParameterError) as info:
        check_parameters("celm", namespace)
    assert str(info.value).startswith(f"celm: {text}") and "\n" not in str(info.value)


def test_33_9_imported_constants_are_not_parameters():
    """A chapter's own constants imported into the notebook (``from ... import TABLE4_FORMAT``) pass;
    the same value under a lower-case name is an unknown parameter."""
    from fedlib.app.chapters.base import ChapterParameterError, check_parameters

    namespace = {**load_profile("flce", "smoke"), "profile": "smoke", "TABLE4_FORMAT": {"a": "{:.2f}"}}
    check_parameters("flce", namespace)
    namespace["table4_format"] = namespace.pop("TABLE4_FORMAT")
    with pytest.raises(ChapterParameterError, match="flce: unknown parameter 'table4_format'"):
        check_parameters("flce", namespace)


def test_33_9_every_chapter_checks_first_and_its_own_profiles_pass():
    from fedlib.app.chapters.base import (
        check_parameters,
        notebook_defaults,
        profiles_of,
    )

    chapters = sorted(p.name for p in (ROOT / "params").iterdir() if p.is_dir())
    for chapter in chapters:
        cells = json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text())["cells"]
        tagged = next(i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", []))
        first = next(c for c in cells[tagged + 1:] if c["cell_type"] == "code")
        assert f"check_parameters({chapter!r}, globals())" in "".join(first["source"]), chapter
        for profile in profiles_of(chapter):  # no false alarm on any profile or the notebook's own defaults
            check_parameters(chapter, {**notebook_defaults(chapter), **load_profile(chapter, profile),
                                       "profile": profile})
        check_parameters(chapter, notebook_defaults(chapter))


BAD_FLAGS = [  # (flags, flag named in the one line)
    (["--budget", "-5"], "--budget"),
    (["--budget", "nan"], "--budget"),
    (["--budget", "inf"], "--budget"),
    (["--limit", "-8"], "--limit"),
    (["--limit", "0"], "--limit"),
    (["--first", "nosuch"], "--first"),
    (["--first", "fedavg:No such table"], "--first"),
    (["--table", "No such table"], "--table"),
    (["--dataset", "nosuch"], "--dataset"),
    (["--device", "tpu"], "--device"),
    (["--seed", "-1"], "--seed"),
]


@pytest.mark.parametrize("flags,flag", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_33_10_queue_flags_are_validated_in_one_line(flags, flag, capsys):
    assert cli(["results", "--list", "--summary", "--only", "fedavg", *flags]) == 2
    assert flag in _one_line_err(capsys, "fedlib results: ")


def test_33_11_migrate_dry_run_touches_nothing_and_readers_keep_temporaries(tmp_path, capsys, tiny_results):
    runs = tmp_path / "results" / "runs"
    config, result = tiny_results["mine"]
    ResultCache(runs, protect=True).put("a" * 20, {"config": config.to_dict(), "result": result})  # re-keyable
    tmp = runs / f".{config.key()}.json.abc123.tmp"  # a killed writer's, two hours old
    tmp.write_text("{")
    os.utime(tmp, (time.time() - 7200, time.time() - 7200))

    def snapshot():
        return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in runs.iterdir()}

    before = snapshot()
    assert cli(["migrate-results", "--dry-run", "--root", str(tmp_path / "results")]) == 0
    assert "re-keyed 1" in capsys.readouterr().out and snapshot() == before
    assert ResultCache(runs).get("a" * 20) is not None  # an ordinary cache's reader
    assert ResultCache(runs, protect=True).read("a" * 20)[1] is None and snapshot() == before


def test_33_11_migrate_fails_on_a_missing_root_and_a_read_only_store(tmp_path, capsys, monkeypatch, tiny_results):
    import fedlib.cache

    assert cli(["migrate-results", "--root", str(tmp_path / "nope")]) == 2
    assert "no stored runs" in _one_line_err(capsys, "fedlib migrate-results: ")
    runs = tmp_path / "results" / "runs"
    config, result = tiny_results["mine"]
    old = ResultCache(runs, protect=True).put("a" * 20, {"config": config.to_dict(), "result": result})

    def read_only(path, text):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(fedlib.cache, "atomic_write_text", read_only)
    assert cli(["migrate-results", "--root", str(tmp_path / "results")]) == 1
    assert "Read-only file system" in _one_line_err(capsys, "fedlib migrate-results: ") and old.exists()


def test_33_12_client_chunk_enters_every_key_it_changes_and_no_stored_key_moves():
    from fedlib.config import ScmConfig

    scm = ScmConfig.make({"dataset": "synthetic", "n_clients": 12})
    assert ScmConfig.make({"dataset": "synthetic", "n_clients": 12, "client_chunk": 3}).key() != scm.key()
    assert ScmConfig.make({"dataset": "synthetic", "n_clients": 12, "predict_chunk": 3}).key() == scm.key()
    assert "client_chunk" not in scm.resolved()  # unset: the key of runs stored before it entered
    assert make_config(TINY, client_chunk=1).key() != make_config(TINY).key()


# --- poisoning and explorer (issue 33)

POISONED = dict(dataset="synthetic", n_clients=5, rounds=4, batch_size=16, lr=0.1, local_epochs=3, seed=3)


def _quiet_run(cfg):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fedlib.run(cfg, cache=False, progress=False)
    return result, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("method", ["fedavg", "celm", "fedmedian"])
def test_33_3_sign_flippers_are_measured_reported_and_warned(method):
    """2 of 5 clients (40 %) send 2 w_g - w every round: each round's record shows them against the
    median update, the run warns and names them in final["poisoning_warning"]; the clean run does not."""
    params = SMALL_PARAMS.get(method, {})
    r, warned = _quiet_run(make_config(POISONED, split={"name": "iid", "sign_flips": 2},
                                       method={"name": method, **params}))
    flippers = [i for i, role in enumerate(r.meta["client_roles"]) if role == "sign_flip"]
    assert len(flippers) == 2 and r.final["stopped"] is None
    caught = []
    for h in r.history:
        d = h["disagreement"]
        cosine = dict(zip(h["aggregated"], d["cosine"]))
        assert all(cosine[c] > 0.3 for c in cosine if c not in flippers) and len(d["norm_ratio"]) == 5
        assert set(d["anomalous"]) <= set(flippers)  # a benign client is never anomalous
        if d["anomalous"] == flippers:  # issue 43: against the core of the majority (fedlib.screening rule B)
            core = dict(zip(h["aggregated"], d["core_cosine"]))
            assert all(core[c] < -0.1 for c in flippers)
            caught.append(h["round"])
    assert caught[:3] == [0, 1, 2]  # (near convergence the flipped updates shrink to noise)
    found = r.final["poisoning_warning"]
    assert found["clients"] == flippers and found["rounds"] == caught and found["contested"]
    assert any("possible poisoning" in w and str(flippers[:10]) in w for w in warned), warned
    json.dumps(r.to_dict(), allow_nan=False)
    clean, warned = _quiet_run(make_config(POISONED, split={"name": "iid"}, method={"name": method, **params}))
    assert clean.final["poisoning_warning"] is None and not any("poisoning" in w for w in warned)
    assert all(h["disagreement"]["anomalous"] == [] for h in clean.history)


def test_33_3_a_collapse_after_an_unclipped_outsized_update_is_reported():
    """A sampled run (2 clients a round, too few to clip) aggregates a 1e6-scaled update in its last
    round and ends at 10 % with stopped: null: the collapse is reported with the round and the client."""
    cfg = make_config(dataset="synthetic", n_clients=6, clients_per_round=2, rounds=5, batch_size=16, seed=5,
                      split={"name": "iid", "huge_updates": 1})
    r, warned = _quiet_run(cfg)
    huge = r.meta["client_roles"].index("huge_update")
    assert r.final["stopped"] is None and huge in r.history[-1]["aggregated"]
    assert r.history[-1]["disagreement"]["anomalous"] == [huge]
    found = r.final["poisoning_warning"]
    assert found is not None and found["clients"] == [huge]
    collapse = found["collapses"][-1]
    assert collapse["round"] == 4 and collapse["accuracy"] == pytest.approx(r.final["accuracy"])
    assert collapse["best"] - collapse["accuracy"] >= 0.2
    assert any(f"after anomalous updates of client(s) [{huge}]" in w for w in warned), warned


def test_33_3_disagreement_statistics_by_hand():
    """Cosine to the coordinate-wise median update and norm ratio to the median norm, on 5 updates."""
    g = torch.zeros(2)
    flat = torch.tensor([[1.0, 0.0], [2.0, 0.0], [1.0, 1.0], [-1.0, 0.0], [30.0, 0.0]])
    s = screen_updates(np.arange(5), flat, {}, g, clip_factor=10.0)
    d = s.disagreement
    # median update (1, 0); norms 1, 2, √2, 1, 30 -> median norm √2
    assert d["cosine"] == pytest.approx([1.0, 1.0, 2 ** -0.5, -1.0, 1.0], abs=1e-6)
    assert d["norm_ratio"] == pytest.approx([2 ** -0.5, 2 ** 0.5, 1.0, 2 ** -0.5, 30 / 2 ** 0.5], rel=1e-6)
    assert d["anomalous"] == []  # one against the median, one outsized: single odd clients (issue 43)
    assert s.clipped == [4]  # the statistics are of the updates as sent, before clipping


BAD_SIGN_FLIPS = [(-1, "split.sign_flips: split 'iid' needs an integer in [0, 100000] or null (got -1)"),
                  (11, "sign_flips must be in [0, 9]"),  # more than the benign clients: when the split is made
                  (1.5, "split.sign_flips: split 'iid' needs an integer in [0, 100000] or null (got 1.5)"),
                  (True, "split.sign_flips: split 'iid' needs an integer in [0, 100000] or null (got True)"),
                  ("2", "split.sign_flips: split 'iid' needs an integer in [0, 100000] or null (got '2')")]


@pytest.mark.parametrize("value, text", BAD_SIGN_FLIPS)
def test_33_3_a_bad_sign_flip_count_is_one_line(value, text):
    with pytest.raises(ValueError) as err:
        fedlib.run(make_config(TINY, n_clients=9, split={"name": "iid", "sign_flips": value}), cache=False,
                   progress=False)
    assert text in str(err.value) and "\n" not in str(err.value)


FAKE_VOILA = r"""
import os, socket, subprocess, sys, time
wanted = int(sys.argv[1])
busy = socket.socket(); busy.bind(("127.0.0.1", 0)); busy.listen()  # 'the asked port was taken'
port = busy.getsockname()[1]
kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[2], "w").write(f"{os.getpid()} {kernel.pid}")
print(f"[Voila] The port {wanted} is already in use, trying another port.")
print("[Voila] Voilà is running at:")
print(f"http://127.0.0.1:{port}/?token=...", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_33_5_a_signal_stops_the_explorer_its_server_and_kernels(tmp_path, sig):
    """``fedlib explore`` under SIGTERM or SIGINT stops the server and its kernel (a stand-in server
    that takes another port than asked, starts a 'kernel' and ignores nothing); the URL it printed
    has the port the server took and a token."""
    fake, pids = tmp_path / "fake_voila.py", tmp_path / "pids"
    fake.write_text(FAKE_VOILA)
    code = (f"import sys; from fedlib.app import explore; "
            f"sys.exit(explore.serve(8866, command=[sys.executable, {str(fake)!r}, '8866', {str(pids)!r}]))")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "The live explorer is at http://127.0.0.1:" in line, (line, process.stderr.read())
        server, kernel = map(int, pids.read_text().split())
        port = re.search(r":(\d+)/", line).group(1)
        assert port != "8866" and "(port 8866 was taken)" in line
        assert re.search(r"\?token=[\w-]{40,}", line)
        assert _alive(server) and _alive(kernel)
        process.send_signal(sig)
        assert process.wait(timeout=30) == 0
        assert "stopping Voilà and its kernels" in process.stderr.read()
        deadline = time.monotonic() + 10
        while (_alive(server) or _alive(kernel)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server) and not _alive(kernel)
    finally:
        if process.poll() is None:
            process.kill()


def test_33_5_voila_is_configured_for_localhost_a_token_a_host_check_and_culling(tmp_path):
    """The command line and the private config file, read back by Voilà's own parser."""
    voila_app = pytest.importorskip("voila.app")
    from fedlib.app import explore

    token = explore.new_token()
    folder = explore.write_config(token)
    try:
        assert (folder / "voila.json").stat().st_mode & 0o077 == 0  # private
        command = explore.voila_command(9999, folder)
        assert token not in " ".join(command)  # not visible in ps
        assert "--Voila.ip=127.0.0.1" in command and "--port=9999" in command and "--no-browser" in command
        app = voila_app.Voila()
        app.parse_command_line(command[1:])
        assert app.config_file_paths == [str(folder)]  # not the working folder's voila.json
        app.load_config_file("voila", path=app.config_file_paths)
        assert app.token == token and len(token) >= 40 and app.ip == "127.0.0.1" and app.open_browser is False
        assert app.tornado_settings == {"allow_remote_access": False, "local_hostnames": ["localhost"],
                                        "headers": {"Referrer-Policy": "no-referrer"}}
        kernels = app.config.MappingKernelManager
        assert kernels.cull_idle_timeout == explore.CULL_IDLE_S > 0 and kernels.cull_interval > 0
        assert kernels.cull_connected is False and kernels.cull_busy is False
    finally:
        import shutil

        shutil.rmtree(folder)


def test_33_5_voila_refuses_foreign_hosts_and_pages_without_the_token(tmp_path):
    """The real server: a DNS-rebinding Host gets 403, a page without the token goes to the login,
    and the URL has the port Voilà moved to when the asked one was taken."""
    import http.client
    import socket
    from urllib.parse import urlsplit

    from fedlib.app import explore

    try:
        explore.voila_command(0)
    except FileNotFoundError:
        pytest.skip("voila is not installed")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    asked = busy.getsockname()[1]
    log = open(tmp_path / "voila.log", "w")
    process, url = explore.start(asked, stdout=log)
    try:
        taken = urlsplit(url).port
        assert taken != asked and re.search(r"\?token=[\w-]{40,}$", url)

        def status(path, host):
            connection = http.client.HTTPConnection("127.0.0.1", taken, timeout=20)
            connection.request("GET", path, headers={"Host": host})
            return connection.getresponse().status

        assert status("/", "rebinding.example") == 403
        assert status("/", f"rebinding.example:{taken}") == 403
        assert status("/", f"127.0.0.1:{taken}") == 302  # to /login: no token, no kernel
        assert status("/", f"localhost:{taken}") == 302
    finally:
        assert explore.stop(process) == 0
        log.close()
        busy.close()


def test_33_3_the_leaderboard_has_a_poisoning_table_of_every_method_and_the_robust_rules():
    from fedlib.app.chapters import leaderboard as lb
    from fedlib.results import RunResult

    for profile in ("smoke", "quick", "paper"):
        params = load_profile("leaderboard", profile)
        p = params["poisoning"]
        assert p["sign_flips"] / p["n_clients"] == pytest.approx(0.4)  # 40 % sign-flippers
        cfgs = lb.poisoning_configs(params)
        attacked = [c for c in cfgs if c.split.params.get("sign_flips") == p["sign_flips"]]
        assert len(attacked) == (len(params["methods"]) + 4) * len(params["seeds"]) and len(cfgs) - len(attacked) == \
            len(params["seeds"])  # plus clean FedAvg per seed
        names = {c.method.name for c in attacked}
        assert names >= {lb.ENTRIES[m][0] for m in params["methods"]} | {"fedmedian", "fedtrimmedavg", "krum"}
        assert all(c.split.name == "iid" and c.n_clients == p["n_clients"] and not c.reference_values for c in cfgs)
    robust = {json.dumps({"name": c.method.name, **c.method.params}, sort_keys=True) for c in attacked
              if c.method.name in ("fedmedian", "fedtrimmedavg", "krum")}  # paper profile: f = 4 of n = 10
    assert robust == {json.dumps(m, sort_keys=True) for m in [
        {"name": "fedmedian"}, {"name": "fedtrimmedavg", "beta": 0.4}, {"name": "krum", "num_malicious_clients": 4},
        {"name": "krum", "num_malicious_clients": 4, "num_clients_to_keep": 6}]}
    roles = ["benign", "benign", "benign", "sign_flip", "sign_flip"]
    cos = [0.9, 0.9, 0.9, -0.5, -0.5]  # issue 43: the table judges the stored statistics with today's rule
    history = [{"round": t, "aggregated": list(range(5)), "accuracy": 0.25,
                "disagreement": {"cosine": cos, "core_cosine": cos, "norm_ratio": [1.0] * 5, "unchanged": [],
                                 "identical": [], "anomalous": []}} for t in range(3)]
    warned = RunResult(config={}, history=history, meta={"client_roles": roles, "client_sizes": [10] * 5},
                       final={"accuracy": 0.25, "poisoning_warning": None})
    assert lb.poisoning_metrics(warned) == {"accuracy": 25.0, "warned": True, "flippers_named": 1.0, "benign_named": 0}
    quiet = RunResult(config={}, history=[], meta={"client_roles": roles},
                      final={"accuracy": 0.5, "poisoning_warning": {"clients": [1, 3]}})  # an earlier rule's warning
    assert lb.poisoning_metrics(quiet)["warned"] is False and lb.poisoning_metrics(quiet)["flippers_named"] == 0.0
