"""Reliability: hostile clients. NaN, outsized and sign-flipped updates are screened, clipped, reported and
warned about; a diverging run stops with a message; the leaderboard's poisoning table (issues 15, 33, 43)."""

import json

import numpy as np
import pytest
import torch
from reliability_common import BASE, TINY, warnings_allowed

import fedlib
from fedlib.app.kit.sources import load_profile
from fedlib.config import make_config
from fedlib.methods import METHODS
from fedlib.screening import screen_updates, stack_received

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


POISONED = {"dataset": "synthetic", "n_clients": 5, "rounds": 4, "batch_size": 16, "lr": 0.1, "local_epochs": 3, "seed": 3}


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
