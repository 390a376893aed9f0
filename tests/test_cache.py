"""The JSON result store: atomic writes, checksums, corruption detection."""

import json

from fedlib.cache import ResultCache


def test_roundtrip_and_corruption_is_detected(tmp_path):
    cache = ResultCache(tmp_path)
    payload = {"accuracy": 0.875, "history": [1, 2, 3], "nested": {"x": [0.5]}}
    path = cache.put("abc", payload)
    assert cache.get("abc") == payload and "abc" in cache
    entry = json.loads(path.read_text())
    entry["payload"]["accuracy"] = 0.99  # tampered: checksum no longer matches
    path.write_text(json.dumps(entry))
    assert cache.get("abc") is None and not path.exists()
    path.write_text('{"sha256": "0", "payload": {"trunc')  # half-written file
    assert cache.get("abc") is None
    assert cache.get("never") is None


def test_no_temporary_files_left_behind(tmp_path):
    cache = ResultCache(tmp_path)
    for i in range(3):
        cache.put(f"k{i}", {"i": i})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k0.json", "k1.json", "k2.json"]
