"""Reliability: run keys and stored runs. A key follows the data read, the method's defaults, the rule
versions and the client chunk; a run records what produced it; a stored run of an older rule is listed
stale or provably re-keyed (issues 15, 16, 23, 33)."""

import gzip
import json
from pathlib import Path

import numpy as np
from reliability_common import BASE, ROOT, TINY

import fedlib
from fedlib.app import book
from fedlib.app.kit import stored as kit_stored
from fedlib.cache import FORMS, ResultCache
from fedlib.config import make_config
from fedlib.methods import METHODS
from fedlib.record import reduce_history


def test_results_record_versions_and_device():
    r = fedlib.run(make_config(BASE, rounds=1), cache=False, progress=False)
    for key in ("fedlib_version", "torch", "torchvision", "numpy", "python", "device", "config_key"):
        assert r.meta[key]


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


def test_15_7_client_chunk_is_part_of_the_key(tmp_path):
    store = ResultCache(tmp_path)
    whole = fedlib.run(make_config(TINY), cache=store, progress=False)
    chunked = fedlib.run(make_config(TINY, client_chunk=1), cache=store, progress=False)
    assert chunked.config["client_chunk"] == 1 and whole.config["client_chunk"] is None
    assert make_config(TINY).key() != make_config(TINY, client_chunk=1).key()


# A cached or stored run never outlives the rule that produced it (issue 23).
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
    from fedlib.store import store_run

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
    stored = [p for form in FORMS for p in (ROOT / "results").glob(f"*/*{form}")]
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
    import fedlib.config
    from fedlib.config import ScmConfig

    cfg = ScmConfig.make({"dataset": "synthetic", "n_clients": 12})
    key = cfg.key()
    real = fedlib.config.data_fingerprint  # fedlib.data's, as the config imports it
    monkeypatch.setattr(fedlib.config, "data_fingerprint",
                        lambda name, root=None: {**real(name, root), "sha256": "0" * 64})
    assert cfg.key() != key
    monkeypatch.setattr(fedlib.config, "data_fingerprint", real)
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


def test_33_12_client_chunk_enters_every_key_it_changes_and_no_stored_key_moves():
    from fedlib.config import ScmConfig

    scm = ScmConfig.make({"dataset": "synthetic", "n_clients": 12})
    assert ScmConfig.make({"dataset": "synthetic", "n_clients": 12, "client_chunk": 3}).key() != scm.key()
    assert ScmConfig.make({"dataset": "synthetic", "n_clients": 12, "predict_chunk": 3}).key() == scm.key()
    assert "client_chunk" not in scm.resolved()  # unset: the key of runs stored before it entered
    assert make_config(TINY, client_chunk=1).key() != make_config(TINY).key()
