"""The store of runs tolerates any file (issue 43, point 4): a symbolic link (looping, dangling, to a
folder, out of the store), a FIFO, a folder, a name that is not UTF-8, a config in an older layout, a
re-signed entry naming an unknown or another method. Each is left out of the ONE listing
(``fedlib.results.list_store``) with one line, never moved; the book, the queue's index, the cost model
and the migration read that listing; a page built from a damaged store is executed again once the store
is repaired; the queue's claims leave nothing behind and an invalid one expires."""

import hashlib
import json
import os
import socket
import stat
import threading
import time

import pytest

from fedlib.app import book, queue
from fedlib.app.kit import stored as kit_stored
from fedlib.app.migrate import migrate_results
from fedlib.cache import ResultCache, load_entry, scan_folder, shown_name, zd_compress
from fedlib.config import RunConfig
from fedlib.store import list_store, stored_payload

DATA = {"source": "synthetic", "files": [], "sha256": "d" * 64}


def config(**overrides) -> RunConfig:
    return RunConfig.make({"dataset": "synthetic", "model": "mlp", "n_clients": 2, "rounds": 1,
                           "method": {"name": "fedavg"}, "seed": 0, **overrides})


def store(runs, cfg, accuracy=0.8):
    """A valid stored run of ``cfg`` on DATA under its key; returns (key, path)."""
    meta = {"resolved": cfg.resolved(), "rule_versions": cfg.rule_versions(), "data": DATA}
    result = {"config": cfg.to_dict(), "history": [], "meta": meta,
              "final": {"accuracy": accuracy, "balanced_accuracy": accuracy, "f1": None, "rounds_completed": 0}}
    key = cfg.key(DATA)
    return key, ResultCache(runs, protect=True).put(key, stored_payload(cfg.to_dict(), result))


def resign(path, edit):
    """Edit an entry's payload and write it back with a valid checksum (as a hand edit that re-signs)."""
    entry = load_entry(path)
    edit(entry["payload"])
    blob = json.dumps(entry["payload"], sort_keys=True, separators=(",", ":"), allow_nan=True)
    entry["sha256"] = hashlib.sha256(blob.encode()).hexdigest()
    path.write_bytes(zd_compress(json.dumps(entry).encode()))


def snapshot(folder):
    """Every name of ``folder`` (bytes) with its kind, size and content digest (regular files only)."""
    out = {}
    for name in os.listdir(os.fsencode(folder)):
        info = os.lstat(os.path.join(os.fsencode(folder), name))
        digest = None
        if stat.S_ISREG(info.st_mode):
            with open(os.path.join(os.fsencode(folder), name), "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
        out[name] = (stat.S_IFMT(info.st_mode), info.st_size if digest else None, digest)
    return out


@pytest.fixture()
def runs(tmp_path, monkeypatch):
    """A store with two valid runs (seeds 0 and 1), read by the book and the queue from there."""
    folder = tmp_path / "results" / "runs"
    store(folder, config(seed=0))
    store(folder, config(seed=1), 0.7)
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path / "results")  # the build's, the pages' store
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(RunConfig, "data_fingerprint", lambda self: dict(DATA))
    return folder


def in_time(function, seconds=20.0):
    """``function()`` in a thread; fails when it has not returned within ``seconds`` (a FIFO opened blocks)."""
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", function()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "reading the store blocked"
    return box["value"]


def everything_reads(runs):
    """Every reader of the store, on it: the listing, the book's page, the queue's index, cost model and
    stored state; returns (listing, the page's Stored, the index)."""
    listing = list_store(runs)
    page = kit_stored.stored_results("demo", [config(seed=0), config(seed=1)])
    index = queue.StoredIndex.read(runs)
    queue.CostModel.from_results(runs)
    queue.stored_state(queue.QueueItem("demo", "T", "r", "c", 0, config(seed=0), queue.run_round))
    return listing, page, index


def assert_the_valid_runs_still_count(runs, page, index):
    assert sorted(page.results) == sorted([config(seed=0).key(DATA), config(seed=1).key(DATA)])
    assert page.results[config(seed=1).key(DATA)].final["accuracy"] == 0.7
    assert index.run_of(config(seed=0), dict(DATA))[0]["final"]["accuracy"] == 0.8


# ----------------------------------------------------------------------------- files that are not runs


@pytest.mark.parametrize("make, name, line", [
    (lambda r: (os.symlink("zzb.json.gz", r / "zza.json.gz"), os.symlink("zza.json.gz", r / "zzb.json.gz")),
     "zza.json.gz", "zza.json.gz (a symbolic link that loops, not a regular file)"),
    (lambda r: os.symlink("nowhere", r / "zzdangling.json.gz"),
     "zzdangling.json.gz", "zzdangling.json.gz (a dangling symbolic link (to nowhere), not a regular file)"),
    (lambda r: (os.mkdir(r / "sub"), os.symlink("sub", r / "zzdir.json")),  # a link to a folder
     "zzdir.json", "zzdir.json (a symbolic link (to sub), not a regular file)"),
    (lambda r: os.mkdir(r / "zzfolder.json.gz"),
     "zzfolder.json.gz", "zzfolder.json.gz (a directory, not a regular file)"),
    (lambda r: os.mkfifo(r / "zzfifo.json"),
     "zzfifo.json", "zzfifo.json (a FIFO, not a regular file)"),
])
def test_a_file_that_is_not_a_regular_one_is_left_out_in_one_line_and_nothing_else_fails(runs, make, name, line):
    make(runs)
    before = snapshot(runs)
    listing, page, index = in_time(lambda: everything_reads(runs))
    assert line in listing.left_out and line in page.skipped and line in index.skipped
    assert all("\n" not in x for x in listing.left_out)
    assert [r.key for r in listing.runs] == sorted([config(seed=0).key(DATA), config(seed=1).key(DATA)])
    assert_the_valid_runs_still_count(runs, page, index)
    assert snapshot(runs) == before  # nothing moved, renamed or deleted
    assert os.path.lexists(runs / name)


def test_a_link_to_a_valid_run_outside_the_store_is_left_out_and_the_key_it_names_is_not_current(runs, tmp_path):
    key, path = store(tmp_path / "elsewhere", config(seed=2), 0.9)
    (runs / f"{key}.json.gz").symlink_to(path)
    listing, page, index = in_time(lambda: everything_reads(runs))
    target = shown_name(str(path), 60)  # a long target: its first 57 characters and "..."
    assert listing.left_out == [f"{key}.json.gz (a symbolic link to outside the store ({target}), not a regular file)"]
    assert kit_stored.stored_results("demo", [config(seed=2)]).results == {}
    assert index.run_of(config(seed=2), dict(DATA)) is None
    stored, problem = queue.stored_state(queue.QueueItem("demo", "T", "r", "c", 2, config(seed=2), queue.run_round))
    assert not stored and "symbolic link" in problem
    assert_the_valid_runs_still_count(runs, page, index)


def test_a_fifo_named_like_a_wanted_key_never_blocks_and_is_not_read(runs):
    wanted = config(seed=3)
    os.mkfifo(runs / f"{wanted.key(DATA)}.json.gz")
    listing, page, index = in_time(lambda: everything_reads(runs))
    assert listing.left_out == [f"{wanted.key(DATA)}.json.gz (a FIFO, not a regular file)"]
    assert in_time(lambda: kit_stored.stored_results("demo", [wanted])).results == {}
    assert_the_valid_runs_still_count(runs, page, index)


@pytest.mark.parametrize("raw, shown", [
    (b"zz\xff\xfe.json.gz", "zz\\xff\\xfe.json.gz"),
    (b"ab\xffcd.json", "ab\\xffcd.json"),  # invalid UTF-8 in the middle
])
def test_a_name_that_is_not_utf8_is_left_out_in_one_printable_line(runs, raw, shown):
    with open(os.path.join(os.fsencode(runs), raw), "wb") as fh:
        fh.write(b"not an entry")
    listing, page, index = everything_reads(runs)
    assert listing.left_out == [f"{shown} (its name is not valid UTF-8)"]
    listing.left_out[0].encode("utf-8")  # printable on any terminal: no surrogates
    assert_the_valid_runs_still_count(runs, page, index)
    assert os.path.exists(os.path.join(os.fsencode(runs), raw))


def test_names_are_shown_on_one_printable_line():
    assert shown_name(os.fsdecode(b"a\xffb")) == "a\\xffb"
    assert shown_name("two\nlines.json") == "two\\nlines.json"
    assert shown_name("x" * 300, 20) == "x" * 17 + "..."


def test_a_name_that_is_not_a_key_is_left_out(runs):
    (runs / "two\nlines.json").write_text("{}")
    (runs / "with space.json.gz").write_bytes(b"")
    assert scan_folder(runs).left_out == [
        "two\\nlines.json (its name is not a key: letters, digits, '.', '_', '-')",
        "with space.json.gz (its name is not a key: letters, digits, '.', '_', '-')"]


# ----------------------------------------------------------------------------- entries this version reads or not


def test_a_config_that_writes_method_as_a_plain_name_is_a_valid_run_the_queue_can_cost(runs):
    key = config(seed=0).key(DATA)
    resign(runs / f"{key}.json.zd", lambda p: p["config"].update(method="fedavg"))
    listing, page, index = everything_reads(runs)
    assert listing.left_out == [] and key in page.results
    assert queue.method_name({"method": "fedavg"}) == "fedavg"
    assert queue.method_name({"method": {"name": "gtg_shapley"}}) == "gtg_shapley"
    assert queue.method_name({"method": {"lr": 1}}) == "?"
    model = queue.CostModel()
    model.read_entry({"config": {**config().to_dict(), "method": "fedavg"}, "wall_time": 30.0, "device": "cpu"})
    assert [s[0][3] for s in model.samples] == ["fedavg"]
    assert queue.work({**config().to_dict(), "method": "logit_simple", "server_val": 10}) > 0


def test_a_config_this_version_cannot_read_is_left_out_in_one_line(runs):
    key = config(seed=1).key(DATA)
    resign(runs / f"{key}.json.zd", lambda p: p["config"].update(split="a layout of long ago", rounds=-3))
    listing, page, index = everything_reads(runs)
    (line,) = listing.left_out
    assert line.startswith(f"{key}.json.zd (its config is not one this version reads: ") and "\n" not in line
    assert list(page.results) == [config(seed=0).key(DATA)] and page.skipped == [line]


def test_a_re_signed_run_naming_an_unknown_method_is_left_out_not_shown_as_current(runs):
    key = config(seed=0).key(DATA)
    resign(runs / f"{key}.json.zd", lambda p: p["config"].update(method={"name": "nosuch"}))
    listing, page, index = everything_reads(runs)
    assert listing.left_out == [f"{key}.json.zd (its config is not one this version reads: method: unknown "
                                f"method 'nosuch'; known: " + listing.left_out[0].split("known: ")[1]]
    assert key not in page.results and index.run_of(config(seed=0), dict(DATA)) is None
    assert list(page.results) == [config(seed=1).key(DATA)]


def test_a_re_signed_run_naming_another_known_method_is_not_current(runs):
    key = config(seed=0).key(DATA)
    resign(runs / f"{key}.json.zd", lambda p: p["config"].update(method={"name": "fedprox"}))
    listing, page, index = everything_reads(runs)
    assert listing.left_out == [] and not next(r for r in listing.runs if r.key == key).agrees()
    assert key not in page.results and index.run_of(config(seed=0), dict(DATA)) is None
    assert page.results[config(seed=1).key(DATA)].final["accuracy"] == 0.7


def test_the_listing_is_read_again_when_an_entry_changes_in_place(runs):
    key = config(seed=1).key(DATA)
    first = list_store(runs)
    assert list_store(runs) is first  # nothing changed: the same listing
    path = runs / f"{key}.json.zd"
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0xFF  # one byte, same size
    path.write_bytes(bytes(blob))
    second = list_store(runs)
    assert second is not first and second.signature != first.signature
    assert [r.key for r in second.runs] == [config(seed=0).key(DATA)] and second.left_out[0].startswith(key)


def test_the_migration_reports_what_the_store_leaves_out_and_moves_nothing(runs):
    os.symlink("nowhere", runs / "zzdangling.json.gz")
    os.mkfifo(runs / "zzfifo.json")
    before = snapshot(runs)
    report = in_time(lambda: migrate_results(runs.parent, dry_run=False))
    assert report["stale"] == [("zzdangling.json.gz", "a dangling symbolic link (to nowhere), not a regular file"),
                               ("zzfifo.json", "a FIFO, not a regular file")]
    assert sorted(report["current"]) == sorted([config(seed=0).key(DATA), config(seed=1).key(DATA)])
    assert snapshot(runs) == before


# ----------------------------------------------------------------------------- a page of a damaged store


@pytest.mark.parametrize("damage, repair", [
    (lambda r: os.symlink("nowhere", r / "zzdangling.json.gz"), lambda r: os.unlink(r / "zzdangling.json.gz")),
    (lambda r: os.symlink("zzloop.json.gz", r / "zzloop.json.gz"), lambda r: os.unlink(r / "zzloop.json.gz")),
    (lambda r: open(os.path.join(os.fsencode(r), b"ab\xffcd.json.gz"), "wb").close(),
     lambda r: os.unlink(os.path.join(os.fsencode(r), b"ab\xffcd.json.gz"))),
])
def test_a_page_built_from_a_damaged_store_is_executed_again_once_the_store_is_repaired(runs, tmp_path, damage,
                                                                                        repair):
    stage = tmp_path / "stage"
    clean = book._fingerprint("fedavg", "smoke", stage)
    damage(runs)
    damaged = book._fingerprint("fedavg", "smoke", stage)  # no crash on any name
    assert damaged != clean
    (stage / ".stamps").mkdir(parents=True)
    (stage / "fedavg.ipynb").write_text("{}")
    (stage / ".stamps" / "fedavg.sha256").write_text(damaged)  # the page as built from the damaged store
    assert book.is_current("fedavg", "smoke", stage)
    repair(runs)
    assert not book.is_current("fedavg", "smoke", stage)  # executed again, not "unchanged"
    assert book._fingerprint("fedavg", "smoke", stage) == clean


def test_a_page_built_before_a_re_signed_entry_is_restored_is_executed_again(runs, tmp_path):
    path = runs / f"{config(seed=0).key(DATA)}.json.zd"
    good = path.read_bytes()
    stage = tmp_path / "stage"
    resign(path, lambda p: p["config"].update(method={"name": "nosuch"}))
    damaged = book._fingerprint("fedavg", "smoke", stage)
    path.write_bytes(good)
    assert book._fingerprint("fedavg", "smoke", stage) != damaged


# ----------------------------------------------------------------------------- claims


def old(path, seconds=120):
    os.utime(path, (time.time() - seconds, time.time() - seconds), follow_symlinks=False)


@pytest.mark.parametrize("inside", [False, True])
def test_an_old_directory_claim_is_taken_over_and_nothing_is_left_behind(runs, inside):
    claim_dir = runs / ".k1.claim"
    claim_dir.mkdir()
    if inside:  # a directory claim of an older queue, with its owner file
        (claim_dir / "owner").write_text("4242")
    assert queue.claim("k1", runs.parent)[0] is False  # unreadable and fresh: may be being written
    old(claim_dir)
    assert queue.claim("k1", runs.parent) == (True, None)
    assert json.loads((runs / ".k1.claim").read_text())["pid"] == os.getpid()
    assert sorted(n for n in os.listdir(runs) if n.startswith(".")) == [".k1.claim"]  # no .stale folder
    queue.release("k1", runs.parent)
    assert not any(n.startswith(".") for n in os.listdir(runs))


@pytest.mark.parametrize("pid, why", [
    ("abc", "its pid 'abc' is not a process id"),
    (1.5, "its pid '1.5' is not a process id"),
    (0, "its pid '0' is not a process id"),  # os.kill(0, 0) signals the group: "alive" forever
    (-1, "its pid '-1' is not a process id"),
    (True, "its pid 'True' is not a process id"),
])
def test_a_claim_with_a_pid_that_is_not_a_process_id_expires_in_one_line(runs, pid, why):
    (runs / ".k2.claim").write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "since": time.time()}))
    assert queue.claim_owner("k2", runs.parent)["invalid"] == why
    lines = []
    assert queue.claim("k2", runs.parent, log=lines.append) == (True, None)
    assert lines == [f"claim .k2.claim: {why}; taken over"]
    assert json.loads((runs / ".k2.claim").read_text())["pid"] == os.getpid()
    assert sorted(n for n in os.listdir(runs) if n.startswith(".")) == [".k2.claim"]


def test_a_claim_that_is_not_a_mapping_or_has_no_host_expires(runs):
    (runs / ".k3.claim").write_text("[1, 2]")
    assert queue.claim_owner("k3", runs.parent)["invalid"] == "not a claim (list)"
    assert queue.claim("k3", runs.parent) == (True, None)
    (runs / ".k4.claim").write_text(json.dumps({"pid": os.getppid(), "host": None}))
    assert queue.claim_owner("k4", runs.parent)["invalid"] == "its host 'None' is not a host name"
    assert queue.claim("k4", runs.parent) == (True, None)


def test_a_live_valid_claim_still_holds(runs):
    live = {"pid": os.getppid(), "host": socket.gethostname(), "since": 0}
    (runs / ".k5.claim").write_text(json.dumps(live))
    assert queue.claim("k5", runs.parent) == (False, live)
