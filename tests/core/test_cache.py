"""The JSON result store: atomic writes, checksums, corruption detection."""

import json

import pytest

from fedlib.cache import ResultCache, _digest


def test_roundtrip_and_corruption_is_detected(tmp_path):
    cache = ResultCache(tmp_path)
    payload = {"accuracy": 0.875, "history": [1, 2, 3], "nested": {"x": [0.5]}}
    path = cache.put("abc", payload)
    assert cache.get("abc") == payload and "abc" in cache
    entry = json.loads(path.read_text())
    entry["payload"]["accuracy"] = 0.99  # tampered: checksum no longer matches
    path.write_text(json.dumps(entry))
    with pytest.warns(RuntimeWarning, match="checksum mismatch.*set aside as abc.json.invalid-1"):
        assert cache.get("abc") is None and not path.exists()
    assert json.loads((tmp_path / "abc.json.invalid-1").read_text()) == entry  # kept, not deleted
    path.write_text('{"sha256": "0", "payload": {"trunc')  # half-written file
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert cache.get("abc") is None
    assert cache.get("never") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abc.json.invalid-1", "abc.json.invalid-2"]


def test_a_protected_store_is_never_changed_by_reading(tmp_path):
    store = ResultCache(tmp_path, protect=True, compress=False)
    path = store.put("k", {"x": 1})
    path.write_text(path.read_text().replace('"x": 1', '"x": 2'))
    before = path.read_bytes()
    with pytest.warns(RuntimeWarning, match="never moved by reading"):
        assert store.get("k") is None
    assert store.get("k") is None  # reported once, still skipped
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["k.json"]
    store.put("k", {"x": 3})  # a writer keeps the invalid entry aside instead of overwriting it
    assert store.get("k") == {"x": 3} and (tmp_path / "k.json.invalid-1").read_bytes() == before


def test_a_check_sets_aside_entries_that_do_not_answer(tmp_path):
    cache = ResultCache(tmp_path)
    cache.put("k", {"config": "other"})
    with pytest.warns(RuntimeWarning, match="wrong config"):
        assert cache.get("k", check=lambda p: None if p["config"] == "mine" else "wrong config") is None
    assert (tmp_path / "k.json.invalid-1").is_file()
    cache.put("k", {"no": "config"})
    with pytest.warns(RuntimeWarning, match="invalid content \\(KeyError"):  # a crashing check is a problem
        assert cache.get("k", check=lambda p: p["config"]) is None


def test_no_temporary_files_left_behind(tmp_path):
    cache = ResultCache(tmp_path)
    for i in range(3):
        cache.put(f"k{i}", {"i": i})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k0.json", "k1.json", "k2.json"]


def test_the_committed_store_writes_the_compact_form_reads_every_form_and_a_writer_replaces_the_older_one(tmp_path):
    import gzip
    import zlib
    from importlib.resources import files

    from fedlib.cache import ZD_MAGIC, key_of, load_entry

    plain = ResultCache(tmp_path, compress=False)
    plain.put("old", {"x": 1})
    (tmp_path / "gz.json.gz").write_bytes(gzip.compress(json.dumps({"sha256": _digest({"x": 3}),
                                                                    "payload": {"x": 3}}).encode()))
    store = ResultCache(tmp_path, protect=True)  # compressed by default
    assert store.compress and store.get("old") == {"x": 1} and store.path("old").name == "old.json"
    assert store.get("gz") == {"x": 3} and store.path("gz").name == "gz.json.gz"  # the earlier gzip form
    path = store.put("new", {"x": 2})
    assert path.name == "new.json.zd" and load_entry(path)["payload"] == {"x": 2}
    # the container by hand: its magic, then raw deflate against the packaged dictionary
    blob = path.read_bytes()
    assert blob.startswith(ZD_MAGIC)
    inflater = zlib.decompressobj(wbits=-15, zdict=files("fedlib").joinpath("record_dictionary_1.txt").read_bytes())
    assert json.loads(inflater.decompress(blob[len(ZD_MAGIC):]))["payload"] == {"x": 2}
    assert [p.name for p in store.entry_paths()] == ["gz.json.gz", "new.json.zd", "old.json"]
    assert [key_of(p) for p in store.entry_paths()] == ["gz", "new", "old"]
    store.put("old", {"x": 1})  # rewritten compact: the plain file goes, and so does a gzip one
    store.put("gz", {"x": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gz.json.zd", "new.json.zd", "old.json.zd"]
    assert store.get("old") == {"x": 1} and store.get("gz") == {"x": 3}


def test_a_dictionary_that_is_not_the_recorded_one_is_refused(monkeypatch):
    import fedlib.cache as cache

    monkeypatch.setattr(cache, "_DICTIONARIES", {})
    monkeypatch.setitem(cache.DICTIONARY_SHA256, cache.ZD_MAGIC, "0" * 64)
    with pytest.raises(ValueError, match="not the dictionary its entries were written with"):
        cache.zd_compress(b"{}")


@pytest.mark.parametrize("damage", ["truncated", "not an entry", "unknown magic", "trailing bytes", "a bomb"])
def test_a_damaged_or_oversized_compressed_entry_is_unreadable_and_left_in_place(tmp_path, damage, monkeypatch):
    import fedlib.cache as cache

    store = ResultCache(tmp_path, protect=True)
    path = store.put("k", {"x": 1})
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:30])
    elif damage == "not an entry":
        path.write_bytes(b"{}")
    elif damage == "unknown magic":
        path.write_bytes(b"fedlib.entry/zd-9\n" + path.read_bytes()[len(cache.ZD_MAGIC):])
    elif damage == "trailing bytes":
        path.write_bytes(path.read_bytes() + b"\0")
    else:
        path.write_bytes(cache.zd_compress(b" " * 4096))
        monkeypatch.setattr(cache, "MAX_ENTRY_BYTES", 1024)
        monkeypatch.setattr(cache.zd_decompress, "__defaults__", (1024,))
    before = path.read_bytes()
    payload, problem = store.read("k")
    assert payload is None and problem.startswith("unreadable (") and path.read_bytes() == before


def test_a_scan_lists_the_entries_a_reader_opens_and_leaves_out_the_rest_unopened(tmp_path):
    import os

    store = ResultCache(tmp_path, protect=True)
    store.put("both", {"x": 1})
    (tmp_path / "both.json").write_text("{}")  # the compact form is the one read
    ResultCache(tmp_path, compress=False).put("plain", {"x": 2})
    (tmp_path / ".hidden.json").write_text("{}")  # temporaries and claims are not entries
    (tmp_path / "notes.txt").write_text("not an entry")
    os.mkfifo(tmp_path / "pipe.json.gz")
    scan = store.scan()
    assert [(key, path.name) for key, path in scan.entries] == [("both", "both.json.zd"), ("plain", "plain.json")]
    assert scan.left_out == ["pipe.json.gz (a FIFO, not a regular file)"]
    assert [store.path(key) for key, _ in scan.entries] == [path for _, path in scan.entries]
    for key, path in scan.entries:  # what a scan lists reads as ResultCache.read reads it
        assert ResultCache.parse(path, path.read_bytes()) == store.read(key)
    assert ResultCache(tmp_path / "absent").scan().entries == []
