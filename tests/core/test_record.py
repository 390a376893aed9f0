"""The compact stored record (issue 45.7): a run's history as numeric columns, lossless by construction,
at the stated precision, checksummed, earlier records still read, and the committed store within its budget."""

import gzip
import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlib import record
from fedlib.cache import ResultCache, _digest, key_of, load_entry
from fedlib.store import Store

ROOT = Path(__file__).resolve().parents[2]
# The budget (issue 45.7): 3,000 runs (full coverage) in at most 30 MiB, so that a GPU call's working tree (the
# tracked files besides the store, and the largest dataset it carries, CIFAR-10's 19 MiB) stays under the
# 64 MiB such a call may take.
RUNS_AT_FULL_COVERAGE, STORE_BUDGET_MIB = 3000, 30
# a real stored run (CELM, 10 rounds) as the earlier store wrote it: gzip, history columns-1
COLUMNS_1 = ROOT / "tests" / "fixtures" / "columns1_record.json.gz"


def _history(rounds=12, clients=5, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    confusion_totals = rng.integers(80, 120, size=classes)
    rows = []
    for r in range(rounds):
        correct = torch.tensor(rng.integers(0, confusion_totals + 1))
        per_class = (correct / torch.tensor(confusion_totals)).tolist()  # float32 ratios, as the engine's
        row = {"round": r, "lr": 0.1 if r < 6 else 0.01, "accuracy": float(torch.tensor(r) / torch.tensor(13)),
               "loss": float(np.float32(rng.random())), "per_class_accuracy": per_class,
               "weights": rng.dirichlet(np.ones(clients)).tolist(),  # float64
               "selected": sorted(rng.choice(clients, 3, replace=False).tolist()), "dropped": [],
               "clipped": [1] if r == 3 else [], "flag": bool(r % 2), "name": "x" * (r % 3),
               "time_train": float(rng.random()), "big": 2**40 + r, "maybe": None if r % 4 else r,
               "disagreement": {"cosine": rng.uniform(-1, 1, clients).tolist(),
                                "norm_ratio": (rng.random(clients) * 5).tolist(), "unchanged": [False] * clients},
               "diagnostics": {"evidence": rng.random((clients, classes)).tolist()}}
        if r % 5 == 0:
            row["scores"] = [math.nan, math.inf, -0.0, 1e-300, -2.5][:clients]
        rows.append(row)
    return rows


def _canonical(value):
    return json.dumps(value, sort_keys=True, allow_nan=True)


def test_columns_give_back_every_kind_of_history_exactly():
    history = _history()
    encoded = record.encode_history(history)
    assert _canonical(record.decode_history(encoded)) == _canonical(history)  # ints stay ints, NaN, -0.0, None
    kinds = {key: column["k"] for key, column in encoded["c"].items()}
    assert kinds["per_class_accuracy"] == "ratio" and kinds["accuracy"] == "ratio"  # correct / total, float32
    assert kinds["weights"] == "float" and encoded["c"]["weights"]["d"] == "<f8"  # float64 kept as float64
    assert kinds["loss"] == "float" and encoded["c"]["loss"]["d"] == "<f4"  # every value a float32: 4 bytes
    assert kinds["selected"] == "int" and kinds["dropped"] == "ragged" and kinds["clipped"] == "ragged"
    assert kinds["scores"] == "some" and kinds["disagreement"] == "dict" and kinds["big"] == "int"
    assert kinds["maybe"] == "json"  # None among ints: kept as JSON


@pytest.mark.parametrize("seed", range(6))
def test_random_histories_round_trip(seed):
    rng = random.Random(seed)
    leaves = [lambda: rng.random(), lambda: rng.randint(-5, 5), lambda: rng.choice([True, False]),
              lambda: [rng.random() for _ in range(rng.randint(0, 3))], lambda: None, lambda: "s",
              lambda: {"a": rng.random()}]
    keys = "abcdef"
    history = [{k: rng.choice(leaves)() for k in keys if rng.random() < 0.8} for _ in range(rng.randint(0, 9))]
    assert _canonical(record.decode_history(record.encode_history(history))) == _canonical(history)


def test_the_stored_precision_is_what_the_docstring_states():
    history = _history()
    reduced = record.reduce_history(history)
    for before, after in zip(history, reduced):
        for key in ("round", "lr", "accuracy", "loss", "per_class_accuracy", "selected", "flag", "big", "maybe"):
            assert after[key] == before[key]  # the metrics the book reads and every integer: exact
        np.testing.assert_allclose(after["weights"], before["weights"], rtol=2**-17, atol=0)
        assert after["weights"] != before["weights"]  # 17 significant bits: really rounded
        np.testing.assert_allclose(after["diagnostics"]["evidence"], before["diagnostics"]["evidence"], rtol=2**-17)
        np.testing.assert_allclose(after["disagreement"]["cosine"], before["disagreement"]["cosine"], rtol=2**-11)
        np.testing.assert_allclose(after["time_train"], before["time_train"], rtol=2**-11)
        assert after["disagreement"]["unchanged"] == before["disagreement"]["unchanged"]
    assert record.significant(1 + 2**-17, 17) == 1.0 and record.significant(1 + 3 * 2**-17, 17) == 1 + 2**-15
    assert record.significant(1 + 2**-16, 17) == 1 + 2**-16 and record.significant(-3.0, 11) == -3.0
    tiny = record.reduce_history([{"disagreement": {"norm_ratio": [7.05e-13]}, "time_eval": 1e6}])[0]
    assert tiny["disagreement"]["norm_ratio"][0] == pytest.approx(7.05e-13, rel=2**-11)  # no float16 underflow
    assert tiny["time_eval"] == pytest.approx(1e6, rel=2**-11) and record.significant(1e300, 17) == 1e300


def test_the_committed_store_writes_compact_records_and_reads_them_back(tmp_path):
    store = ResultCache(tmp_path, protect=True)
    payload = {"config": {"seed": 0}, "result": {"history": _history(), "final": {"accuracy": 0.5}, "meta": {}}}
    path = store.put("k", payload)
    entry = load_entry(path)
    assert path.name == "k.json.zd" and entry["payload"]["result"]["history"]["format"] == record.FORMAT
    assert entry["sha256"] == _digest(entry["payload"])  # the checksum covers the record as written
    back, problem = store.read("k")
    assert problem is None
    assert _canonical(back) == _canonical(record.expand(record.compact(payload)))
    assert back["result"]["history"][3]["clipped"] == [1] and back["result"]["final"] == {"accuracy": 0.5}
    plain = ResultCache(tmp_path / "cache")  # an ordinary cache keeps the exact JSON
    plain.put("k", payload)
    assert _canonical(plain.read("k")[0]) == _canonical(payload)


def test_an_earlier_record_still_reads_and_a_damaged_column_is_refused(tmp_path):
    payload = {"config": {"seed": 0}, "result": {"history": _history(4), "final": {}, "meta": {}}}
    old = tmp_path / "old.json.gz"  # the gzip form before columns: its history a list of rounds
    old.write_bytes(gzip.compress(json.dumps({"sha256": _digest(payload), "payload": payload}).encode()))
    store = ResultCache(tmp_path, protect=True)
    assert _canonical(store.read("old")[0]) == _canonical(payload)
    shutil.copy(COLUMNS_1, tmp_path / "columns1.json.gz")  # a real run in the earlier compact record
    earlier = store.read("columns1")[0]
    assert load_entry(COLUMNS_1)["payload"]["result"]["history"]["format"] == "fedlib.history/columns-1"
    assert len(earlier["result"]["history"]) == 10 and earlier["result"]["history"][9]["round"] == 9
    assert _canonical(record.expand(record.compact(earlier))) == _canonical(earlier)  # nothing lost moving on
    for damage in ("blob", "size", "at", "transform"):
        stored = record.compact(payload)
        history = stored["result"]["history"]
        if damage == "blob":  # damaged, then re-signed: the checksum alone cannot tell
            history["blob"] = history["blob"][:40] + "00000" + history["blob"][45:]
        elif damage == "size":
            history["size"] += 1
        elif damage == "at":
            history["c"]["loss"]["z"]["at"][0] = history["size"]
        else:
            history["c"]["loss"]["z"]["t"] = "?"
        (tmp_path / "bad.json.gz").write_bytes(gzip.compress(json.dumps({"sha256": _digest(stored),
                                                                         "payload": stored}).encode()))
        payload_back, problem = store.read("bad")
        assert payload_back is None and problem.startswith("unreadable history columns"), damage
    stored["result"]["history"]["rounds"] = 9  # a count that does not match the columns
    with pytest.raises(ValueError):
        record.expand(stored)


def test_each_column_keeps_the_row_transform_that_compresses_best_and_reads_back():
    rounds = np.arange(40, dtype=np.float64)
    history = [{"constant": 0.1234567891, "ramp": int(r) * 1000, "noise": float(np.float32(np.sin(r * 7.1)))}
               for r in rounds]
    encoded = record.encode_history(history)
    transforms = {key: encoded["c"][key]["z"]["t"] for key in ("constant", "ramp")}
    assert transforms["ramp"] == "d" and transforms["constant"] != "d"  # a ramp's differences repeat
    assert _canonical(record.decode_history(encoded)) == _canonical(history)
    spans = sorted(tuple(encoded["c"][key]["z"]["at"]) for key in ("constant", "ramp", "noise"))
    assert spans[0][0] == 0 and sum(n for _, n in spans) == encoded["size"] == 40 * (8 + 4 + 4)  # float64, int32, float32


def test_migration_rewrites_real_runs_as_compact_records(tmp_path):
    from fedlib.app.migrate import compress_results

    real = sorted(Store().runs.glob("*.json*"))
    chosen = real[:: max(1, len(real) // 6)][:6] + [COLUMNS_1]
    (tmp_path / "runs").mkdir()
    for path in chosen:
        shutil.copy(path, tmp_path / "runs" / path.name)
    before = {key_of(p): ResultCache(tmp_path / "runs", protect=True).read(key_of(p))[0] for p in chosen}
    rewritten = compress_results(tmp_path)
    assert "columns1_record" in rewritten and set(rewritten) <= set(before)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(f"{key}.json.zd" for key in before)
    store = ResultCache(tmp_path / "runs", protect=True)
    for key, payload in before.items():
        back, problem = store.read(key)
        assert problem is None and _canonical(back) == _canonical(record.expand(record.compact(payload)))
    assert compress_results(tmp_path) == []  # nothing left to rewrite


def test_the_committed_store_fits_its_budget_and_every_record_reads():
    store = Store().cache()
    paths = sorted(Store().runs.glob("*.json*"))
    assert len(paths) > 100
    mean = sum(p.stat().st_size for p in paths) / len(paths)
    projected = mean * RUNS_AT_FULL_COVERAGE / 2**20
    assert projected <= STORE_BUDGET_MIB, (f"{len(paths)} stored runs, {mean / 1024:.1f} KiB each: "
                                           f"{RUNS_AT_FULL_COVERAGE} would take {projected:.1f} MiB")
    for path in paths[:: max(1, len(paths) // 40)]:  # a sample: every record kind reads (the book reads them all)
        payload, problem = store.read(path.name.split(".")[0])
        assert problem is None and isinstance(payload["result"].get("history", payload["result"].get("methods")),
                                              (list, dict))


def test_the_numpy_base85_decoder_equals_the_standard_library():
    """``fedlib.record.b85decode`` (whole groups in numpy) against ``base64.b85decode`` as the oracle: every
    length mod 5, and the refusals (a character outside the alphabet, a group above 2**32 - 1)."""
    import base64

    from fedlib.record import b85decode

    rng = np.random.default_rng(0)
    for n in [*range(0, 23), 1000, 4097]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        text = base64.b85encode(data).decode()
        assert b85decode(text) == base64.b85decode(text) == data
    for bad in ('abc"d', "~~~~~", "|NsC0~"):
        with pytest.raises(ValueError):
            base64.b85decode(bad)
        with pytest.raises(ValueError):
            b85decode(bad)


def test_the_listings_columns_lead_the_blob_and_read_alone():
    history = _history(30)
    encoded = record.encode_history(history)
    assert encoded["keys"] == list(history[0])  # the rows keep their keys' order
    leading = [encoded["c"][k] for k in record.LEADING_COLUMNS if k in encoded["c"]]
    assert max(record._end(c) for c in leading) < encoded["size"] / 4  # at the blob's start
    only = {"round", "accuracy"}
    part = record.decode_history(encoded, only)
    assert part == [{k: row[k] for k in row if k in only} for row in history]
    damaged = {**encoded, "blob": encoded["blob"][:len(encoded["blob"]) // 2]}  # its tail gone
    assert record.decode_history(damaged, only) == part  # the start still reads ...
    with pytest.raises(ValueError):
        record.decode_history(damaged)  # ... the whole does not
