"""Reliability: the run cache and the store of runs. A corrupted, foreign or damaged entry is set aside and
recomputed, never deleted; an unwritable cache still returns the run; special files are refused unopened;
two queues claim each run once; migration's dry run and failures write nothing (issues 15, 33)."""

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from reliability_common import BASE, ROOT, TINY, _one_line_err

import fedlib
from fedlib.__main__ import main as cli
from fedlib.app import queue as fedlib_queue
from fedlib.app.kit import stored as kit_stored
from fedlib.cache import ResultCache
from fedlib.config import make_config


def test_a_corrupted_cache_entry_is_recomputed(tmp_path):
    store = ResultCache(tmp_path)
    cfg = make_config(BASE, rounds=1)
    first = fedlib.run(cfg, cache=store, progress=False)
    path = store.path(cfg.key())
    path.write_text(path.read_text().replace('"rounds": 1', '"rounds": 9', 1))
    again = fedlib.run(cfg, cache=store, progress=False)
    assert again.final == first.final and store.get(cfg.key()) is not None


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
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path / "repo")
    return tmp_path / "out" / "runs"


def _damage(kind: str, runs: Path, key: str, tiny_results) -> None:
    from fedlib.store import store_run

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
