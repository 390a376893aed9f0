"""Issue 43 point 2: the re-computation check of the store (fedlib.app.recompute), against the
determinism contract (fedlib.determinism)."""

import copy
import os
from pathlib import Path

import pytest

import fedlib
from fedlib.app import recompute
from fedlib.cache import ResultCache
from fedlib.config import make_config
from fedlib.determinism import CROSS_MACHINE, PLAN
from fedlib.store import Store, run_of, stored_payload

SYNTH = dict(dataset="synthetic", model="mlp", n_clients=4, rounds=3, batch_size=16, local_epochs=1, lr=0.1, seed=3)


def _history(accuracies, selected=(0, 1)):
    return [{"round": t, "accuracy": a, "loss": 1.0, "weights": [0.5, 0.5], "selected": list(selected)}
            for t, a in enumerate(accuracies)]


def test_compare_by_hand():
    """0.0015 apart is within 0.002 (CROSS_MACHINE.accuracy); 0.01 is not; another selection never is."""
    same = recompute.compare("k", _history([0.5, 0.6]), _history([0.5015, 0.6]))
    assert same.agrees and same.worst["accuracy"] == pytest.approx(0.0015)
    off = recompute.compare("k", _history([0.5, 0.6]), _history([0.5, 0.61]))
    assert not off.agrees and off.departures[0].startswith("round 1: accuracy differs by 0.01")
    picked = recompute.compare("k", _history([0.5]), _history([0.5], selected=(0, 2)))
    assert not picked.agrees and "selected" in picked.departures[0]
    strict = recompute.compare("k", _history([0.5]), _history([0.5015]), tolerance=PLAN)
    assert not strict.agrees  # the same-machine tolerance is far tighter
    assert PLAN.accuracy < CROSS_MACHINE.accuracy


def test_the_first_rounds_of_a_run_are_its_full_runs_first_rounds(tmp_path):
    """Stopped early, the full protocol (no schedule change): round 0 and 1 equal the whole run's."""
    config = make_config(SYNTH, lr_milestones=[2], lr_gamma=0.1)
    whole = fedlib.run(config, cache=False, progress=False)
    first = recompute.fresh_history(config.to_dict(), rounds=2)
    assert len(first) == 2
    assert [h["accuracy"] for h in first] == [h["accuracy"] for h in whole.history[:2]]
    shortened = fedlib.run(make_config(SYNTH, rounds=2, lr_milestones=[], lr_gamma=0.1), cache=False, progress=False)
    assert [h["lr"] for h in first] == [h["lr"] for h in shortened.history]


def _store_with(tmp_path, config, mutate=None, note=None):
    store = ResultCache(tmp_path / "runs", protect=True)
    result = fedlib.run(config, cache=False, progress=False).to_dict()
    result = copy.deepcopy(result)
    if mutate:
        mutate(result)
    if note:
        result["meta"]["rekeyed"] = note
    key = result["meta"]["config_key"]
    store.put(key, stored_payload(config.to_dict(), result))
    return store, key


def test_a_sample_that_recomputes_agrees_and_a_tampered_one_is_reported(tmp_path):
    config = make_config(SYNTH)
    store, key = _store_with(tmp_path, config)
    assert recompute.check_sample([key], 2, store, log=lambda s: None)[0].agrees

    def shift(result):
        result["history"][1]["accuracy"] += 0.05

    bad_store, bad_key = _store_with(tmp_path / "bad", config, mutate=shift)
    lines = []
    found = recompute.check_sample([bad_key], 2, bad_store, log=lines.append)[0]
    assert not found.agrees and "round 1: accuracy differs by 0.05" in lines[0] and "DIFFERS" in lines[0]
    assert recompute.check_sample([bad_key], 1, bad_store, log=lambda s: None)[0].agrees  # round 0 is untouched


def test_a_rekeyed_run_is_recomputed_in_full_and_replaced_keeping_what_it_said(tmp_path):
    """A run whose equivalence was asserted (meta.rekeyed names another loop) and whose numbers do not
    re-compute is replaced by today's run; the earlier final accuracy and the first departure are kept."""
    config = make_config(SYNTH)

    def lower(result):  # a valid run (accuracies in [0, 1]) with other numbers
        for h in result["history"]:
            h["accuracy"] = h["accuracy"] * 0.5
        result["final"]["accuracy"] *= 0.5

    store, key = _store_with(tmp_path, config, mutate=lower,
                             note="re-keyed from abc on 2026-11-26: computed by the logit protocol's own loop")
    plain_store, plain_key = _store_with(tmp_path / "plain", config, note="re-keyed from def: resolved config identical")
    assert recompute.asserted_rekeys(store) == [key] and recompute.asserted_rekeys(plain_store) == []
    old_final = run_of(store.read(key)[0])["final"]["accuracy"]
    comparison = recompute.recompute_in_full(key, store, replace=True, log=lambda s: None)
    assert not comparison.agrees and comparison.final_stored == pytest.approx(old_final)
    now = run_of(store.read(key)[0])
    assert now["final"]["accuracy"] == pytest.approx(2 * old_final, abs=1e-6)
    assert now["meta"]["recomputed"]["replaces_final_accuracy"] == pytest.approx(old_final)
    assert now["meta"]["recomputed"]["first_departure"].startswith("round 0: accuracy differs by")
    assert "own loop" in now["meta"]["recomputed"]["earlier_note"]
    again = recompute.recompute_in_full(key, store, replace=True, log=lambda s: None)
    assert again.agrees  # today's run re-computes on this machine


def test_the_cli_refuses_nothing_to_do_in_one_line(capsys):
    with pytest.raises(SystemExit) as err:
        recompute.main([])
    assert err.value.code == 2 and "nothing to do" in capsys.readouterr().err


def _cheap_stored_runs(n):
    """The first ``n`` stored MLP runs on Fashion-MNIST or MNIST with at most 10 clients, by key."""
    store = Store().cache()
    out = []
    for key, entry, _ in recompute._entries(store):
        c = entry["config"]
        if c["dataset"] in ("fmnist", "mnist") and c.get("model") == "mlp" and c.get("n_clients", 99) <= 10 \
                and (c.get("method") or {}).get("name") in ("fedavg", "fedavg_uniform", "fedprox"):
            out.append(key)
        if len(out) >= n:
            break
    return store, out


@pytest.mark.skipif(not (Path("/usr/share/datasets/fashion-mnist").is_dir() or os.environ.get("FEDLIB_DATA")),
                    reason="needs the Fashion-MNIST / MNIST data root")
def test_stored_runs_recompute_their_first_rounds_within_the_cross_machine_tolerance():
    """The real store: two stored paper-protocol runs, their first two rounds re-computed by today's engine
    on this machine, agree with what another machine stored, within CROSS_MACHINE."""
    store, keys = _cheap_stored_runs(2)
    if len(keys) < 2:
        pytest.skip("no such stored runs, or their data is not here")
    try:
        found = recompute.check_sample(keys, 2, store, log=lambda s: None)
    except FileNotFoundError as err:  # the data root lacks the dataset
        pytest.skip(str(err))
    assert [c.line() for c in found if not c.agrees] == []
