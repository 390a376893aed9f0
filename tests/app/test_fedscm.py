"""The FedSCM pipeline (Algorithm 2): config validation, the federation and its target,
batched client predictions against the per-client loop, a whole small pipeline with every
baseline, the cache, its record (a ``RunResult``, also from ``fedlib.run``) and the chapter's
experiment lists."""

import json

import fedlib
import fedlib.config
import numpy as np
import pytest
import torch

from fedlib.app.kit import sources
from fedlib.store import Store
from fedlib.cache import ResultCache
from fedlib.app.chapters.fedscm import protocol as chapter  # the chapter's runs and stored results
from fedlib.config import ConfigError, ScmConfig
from fedlib.provenance import repo_root
from fedlib.results import RunResult, pipeline_final
from fedlib.run import run_many, run_pack
from fedlib.store import stored_payload
from fedlib.data import load_dataset
from fedlib.methods import scm
from fedlib.models import build_model
from fedlib.population import LocalTraining, ParamLayout, aggregate
from fedlib.scm_pipeline import (
    build_federation,
    client_probabilities,
    execute,
    method_labels,
    post_train,
    post_training_config,
    run_pipeline,
)
from fedlib.testing import client_probabilities_loop, cohort_training_loop

SHAPE = (1, 8, 8)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def data():
    return load_dataset("synthetic", num_classes=4, image_shape=SHAPE, n_train=1200, n_test=400, seed=0, noise=1.0)


def _config(**overrides):
    base = {"dataset": "synthetic", "model": "mlp", "n_clients": 12, "alpha": 0.5, "server_samples": 60,
            "eval_samples": 80, "local_epochs": 1, "batch_size": 32, "lr": 0.05, "post_rounds": 2, "post_lr": 0.05,
            "gammas": (0.67, 0.8), "solver": "pgd", "random_sizes": (3,), "sdea_clients": 3, "fedavg_per_round": 4,
            "stability_runs": 4, "expertise_repeats": 2, "temperatures": (1.0, 4.0), "adapt_steps": 2,
            "ot_samples": 10, "cf_permutations": 4}
    return ScmConfig.make({**base, **overrides})


@pytest.mark.parametrize("overrides,message", [
    ({"colour": 1}, "unknown key 'colour'"),
    ({"gammas": (1.0,)}, "gammas: each must be in [0, 1)"),
    ({"gammas": (0.95,)}, "selects 20 clients, more than n_clients = 12"),
    ({"methods": ("fedscm", "oracle")}, "unknown method 'oracle'"),
    ({"random_sizes": (13,)}, "must be in [1, n_clients = 12]"),
    ({"shift": "concept"}, "shift:"),
    ({"alpha": 0}, "alpha:"),
])
def test_bad_configs_fail_with_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        _config(**overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_key_ignores_where_and_how_but_not_what():
    a = _config()
    assert a.key() == _config(data_root="/elsewhere", predict_chunk=2).key()
    assert a.key() != _config(client_chunk=3).key()  # chunked training changes the last bits (book/how_fedlib_runs.md)
    assert a.key() != _config(alpha=0.1).key()
    assert method_labels(a)[:2] == ["FedSCM (γ = 0.67)", "FedSCM (γ = 0.8)"]



def test_the_fedscm_config_shares_the_run_configs_validation_key_and_loader(tmp_path):
    """One config base: the same limits and one-line errors, the same key layout, the same YAML loader."""
    for bad, message in (({"seed": True}, "seed: true/false is not a valid value here"),
                         ({"device": "tpu"}, "device: must be 'cpu', 'cuda', 'cuda:N' or 'auto'"),
                         ({"model": "gpt"}, "model: unknown model"), ({"n_clients": 10**6}, "n_clients:"),
                         ({"lr": float("nan")}, "lr:")):
        with pytest.raises(ConfigError, match=message):
            _config(**bad)
    a = _config()
    assert a.rule_versions() == {"engine": fedlib.config.ENGINE_VERSION, "fedscm": fedlib.config.SCM_RULE_VERSION,
                                 "pipeline": str(fedlib.config.PIPELINE_FORMAT)}
    assert a.key() == fedlib.config._hash({"config": a.resolved(), "rules": a.rule_versions(),
                                           "data": a.data_fingerprint()["sha256"] or {"missing": "synthetic"},
                                           "_format": fedlib.config.CACHE_FORMAT})
    path = tmp_path / "scm.yaml"
    path.write_text("dataset: synthetic\nmodel: mlp\nn_clients: 12\ngammas: [0.8]\n")
    assert ScmConfig.load(path, alpha=0.5).gammas == (0.8,) and ScmConfig.load(path, alpha=0.5).alpha == 0.5
    with pytest.raises(ConfigError, match="unknown key 'gammas'"):
        fedlib.config.load_config(path)  # a federated run has no selection thresholds


def test_label_shift_target_is_drawn_like_one_more_client(data):
    fed = build_federation(_config(alpha=0.1), data)
    assert len(fed["indices"]) == 12 and fed["counts"].shape == (12, 4)
    assert (fed["sizes"] >= 2).all()  # the split's minimum size
    p = np.asarray(fed["target_proportions"])
    absent = np.flatnonzero(p == 0)
    assert not np.isin(fed["y_server"].numpy(), absent).any()
    assert not np.isin(fed["y_eval"].numpy(), absent).any()
    assert len(fed["y_server"]) == 60 and len(fed["y_eval"]) == 80


def test_covariate_shift_moves_clients_and_target_images(data):
    fed = build_federation(_config(shift="covariate", sigma=0.05), data)
    flat_pool = data.x_train.reshape(len(data.x_train), -1)
    first = fed["x"][torch.as_tensor(fed["indices"][0][:5])].reshape(5, -1)
    # every client image was mapped, so none equals its original training image exactly
    assert not any(torch.equal(row, orig) for row in first for orig in flat_pool[:50])
    assert fed["x_server"].shape[1:] == data.x_test.shape[1:]
    np.testing.assert_allclose(fed["target_proportions"], np.bincount(data.y_test.numpy()) / len(data.y_test))


@pytest.mark.parametrize("name,shape", [("mlp", SHAPE), ("resnet20", (3, 8, 8))])
def test_batched_predictions_match_the_client_loop(name, shape):
    torch.manual_seed(0)
    models = [build_model(name, shape, 5) for _ in range(4)]
    layout = ParamLayout(models[0])
    flat = torch.stack([layout.flat_of(m) for m in models])
    bufs = {k: torch.stack([layout.buffers_of(m)[k] for m in models]) for k in layout.buffer_names}
    for k, v in bufs.items():  # non-trivial running statistics: eval mode must use them
        if k.endswith("running_var"):
            v.uniform_(0.5, 2.0)
    x = torch.randn(37, *shape, generator=torch.Generator().manual_seed(1))
    batched = client_probabilities(models[0], flat, bufs, x, model_chunk=3, batch_size=16)
    looped = client_probabilities_loop(models[0], flat, bufs, x, batch_size=16)
    torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched.sum(-1), torch.ones(4, 37))


def test_the_whole_pipeline_runs_every_method_and_caches(data, tmp_path):
    cfg = _config()
    store = ResultCache(tmp_path)
    result = run_pipeline(cfg, cache=store, dataset=data)
    json.dumps(result.to_dict())  # JSON-ready
    methods, selections, clients = (result.parts[k] for k in ("methods", "selections", "clients"))
    assert set(methods) == set(method_labels(cfg))
    for g in cfg.gammas:
        sel = selections[f"{g:g}"]
        assert sel["rounding"] == "none" and sel["selected"] == sel["raw_selected"]  # selected = non-zero weight
        assert sel["selected"] == scm.support(torch.tensor(sel["weights"])).tolist()
        assert len(sel["vertex_selected"]) == scm.vertex_counts(g)[2]
        label = f"FedSCM (γ = {g:g})"
        assert methods[label]["clients"] == sel["selected"]
    for label in ("K3DA", "Co-MDA", "FMDA-OT"):
        assert methods[label]["post_trained"]
    assert methods["Co-MDA"]["clients"] == sorted(methods["Co-MDA"]["clients"])
    assert len(methods["Co-MDA"]["clients"]) == cfg.comda_clients
    checks = result.parts["diagnosis"]["checks"]
    assert checks["server/eval overlap (samples)"] == 0 and checks["max |Σ_c h_k(X) − 1|"] < 1e-5
    assert [r["temperature"] for r in result.parts["diagnosis"]["temperatures"]] == list(cfg.temperatures)
    acc = np.asarray(clients["target_accuracy"])
    assert methods["Best Source"]["clients"] == [int(acc.argmax())]
    assert methods["FedAvg"]["clients"] == list(range(12))
    assert not methods["Source Free"]["post_trained"]
    assert len(clients["eta_hat"]) == 12
    assert set(result.parts["stability"]["FedSCM"]) == set(scm.STABILITY_METRICS)
    assert all(0 <= m["accuracy"] <= 1 for m in methods.values())
    assert run_pipeline(cfg, cache=store, dataset=data) == result  # second call: the cache
    entry, problem = store.read(cfg.key())  # the cache entry is a stored run's JSON (config, result, provenance)
    assert problem is None and entry["config"] == cfg.to_dict() and entry["result"] == result.to_dict()
    assert {"commit", "device", "date", "wall_time"} <= set(entry)


def test_source_free_is_fedscm_initial_model(data):
    """With no post-training rounds, FedSCM (first γ) and Source Free are the same model."""
    result = execute(_config(post_rounds=0, methods=("fedscm", "source_free"), stability_runs=0,
                             expertise_repeats=0), data)
    assert result["methods"]["FedSCM (γ = 0.67)"]["accuracy"] == result["methods"]["Source Free"]["accuracy"]


def test_vertex_rounding_is_an_option_of_the_pipeline(data):
    result = execute(_config(post_rounds=0, methods=("fedscm",), stability_runs=0, expertise_repeats=0,
                             rounding="vertex", temperatures=()), data)
    for g in (0.67, 0.8):
        sel = result["selections"][f"{g:g}"]
        assert scm.is_sparse_vertex(sel["weights"], g) and sel["selected"] == sel["vertex_selected"]


def test_chapter_profiles_make_valid_configs():
    for profile in sources.PROFILES:
        params = sources.load_profile("fedscm", profile)
        variants = chapter.diagnosis_configs(params)
        assert variants[0][0] == "as profiled" and len(variants) == 1 + len(params["diagnosis_variants"])
        assert all(c.post_rounds == 0 and c.methods == ("fedscm", "best_source") for _, c in variants)
        cfgs = chapter.configs(params)
        assert len(cfgs) == len(params["alphas"]) * len(params["seeds"]) + len(params["seeds"])
        assert sum(c.stability_runs > 0 for c in cfgs) == 1
    paper = chapter.configs(sources.load_profile("fedscm", "paper"))
    assert all(c.n_clients == 500 and c.model == "vgg11" and c.post_rounds == 1000 for c in paper)


def test_stored_results_round_trip(tmp_path, monkeypatch, data):
    """store_results writes results/fedscm/<key>.json; stored_results reads back matching ones."""
    import shutil

    repo = tmp_path / "repo"
    (repo / "params").mkdir(parents=True)
    shutil.copytree(repo_root() / "params" / "fedscm", repo / "params" / "fedscm")
    monkeypatch.setenv("FEDLIB_REPO", str(repo))
    params = sources.load_profile("fedscm", "smoke")
    cfg = chapter.configs(params)[0]
    store = Store().cache()
    result = execute(ScmConfig.make(cfg.to_dict(), post_rounds=0, stability_runs=0, expertise_repeats=0), data)
    store.put(cfg.key(), {"config": cfg.to_dict(), "result": result})
    got = chapter.stored_results(params)
    assert list(got) == [cfg.key()] and got[cfg.key()].parts["methods"] == result["methods"]


@pytest.mark.parametrize("per_round,steps,mu", [(None, None, 0.01), (2, 2, 0.0)])
def test_post_training_is_an_engine_run_equal_to_the_round_loop(data, per_round, steps, mu):
    """Algorithm 2, steps 3-5 through the engine (method ``cohort``) = the plain round loop over
    the same batches: λ-average start, FedProx, λ renormalised over each round's clients."""
    cfg = _config(post_rounds=3, post_steps=steps, post_epochs=1)
    fed = build_federation(cfg, data)
    torch.manual_seed(0)
    model = build_model("mlp", SHAPE, 4)
    layout = ParamLayout(model)
    flat = layout.flat_of(model) + 0.05 * torch.randn(cfg.n_clients, layout.size,
                                                      generator=torch.Generator().manual_seed(3))
    bufs = {k: v.unsqueeze(0).expand(cfg.n_clients, *v.shape) for k, v in layout.buffers_of(model).items()}
    clients, lam = np.array([0, 2, 5, 7]), np.array([0.4, 0.3, 0.2, 0.1])
    got, _ = post_train(model, data, flat, bufs, clients, lam, fed, cfg, mu, per_round)
    init = aggregate(flat[torch.as_tensor(clients)], torch.as_tensor(lam, dtype=torch.float32),
                     {k: v[torch.as_tensor(clients)] for k, v in bufs.items()})
    training = LocalTraining(epochs=1, batch_size=cfg.batch_size, lr=cfg.post_lr, weight_decay=cfg.weight_decay,
                             prox_mu=mu, max_steps=steps)
    want, _ = cohort_training_loop(model, init, fed["x"], fed["y"], [fed["indices"][c] for c in clients], lam,
                                   cfg.post_rounds, training, cfg.seed, per_round)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert not torch.allclose(got, init[0], atol=1e-3)  # it trained


def test_post_training_config_is_an_ordinary_run_config():
    cfg = _config(post_rounds=4, post_steps=3, fedavg_per_round=2)
    run = post_training_config(cfg, np.array([2.0, 1.0, 1.0]), 0.01, per_round=2)
    assert (run.n_clients, run.clients_per_round, run.rounds, run.lr, run.momentum, run.update_clip) == \
        (3, 2, 4, cfg.post_lr, 0.0, None)
    assert run.method.name == "cohort" and run.method.params == {"weights": [2.0, 1.0, 1.0], "mu": 0.01,
                                                                  "max_steps": 3}
    assert post_training_config(cfg, np.ones(3), 0.0, per_round=5).clients_per_round is None  # all take part


def test_cohort_weights_are_lambda_renormalised_over_the_round():
    from fedlib.methods import build_method
    from fedlib.methods.base import ClientUpdates

    method = build_method("cohort", {"weights": [0.5, 0.25, 0.25]})
    updates = ClientUpdates(clients=np.array([1, 2]), flat=torch.zeros(2, 3), sizes=np.array([10, 90]), buffers={})
    torch.testing.assert_close(method.weigh(None, updates), torch.tensor([0.5, 0.5]))
    sizes = build_method("cohort", {}).weigh(None, updates)  # no λ: sample counts (FedAvg)
    torch.testing.assert_close(sizes, torch.tensor([0.1, 0.9]))


@pytest.mark.parametrize("params,message", [
    ({"mu": -1}, "mu must be >= 0"), ({"max_steps": 0}, "max_steps must be >= 1"),
    ({"weights": [0.0, 0.0]}, "positive sum"),
])
def test_cohort_bad_hyper_parameters_fail_with_one_line(params, message):
    from fedlib.methods import build_method

    with pytest.raises(ValueError, match=message):
        build_method("cohort", params)


def test_cohort_weights_must_match_the_clients():
    from fedlib.config import make_config

    with pytest.raises(ConfigError, match=r"weights must have one entry per client \(5\), got 2"):
        make_config({"method": {"name": "cohort", "weights": [1.0, 2.0]}, "n_clients": 5})


def test_the_plain_post_trainings_pack_and_equal_each_cohort_alone(data, monkeypatch):
    """FedSCM per γ, Random, SDEA and FedAvg post-train as one pack (fedlib.packing); each equals
    its cohort trained alone by the engine."""
    import fedlib.scm_pipeline as pipeline
    from fedlib.engine import execute as alone

    cfg = _config(methods=("fedscm", "random", "sdea", "fedavg"))
    packed = execute(cfg, dataset=data)
    calls = []
    monkeypatch.setattr(pipeline, "execute_packed",
                        lambda prepared: calls.append(len(prepared)) or [alone(p, False) for p in prepared])
    separate = execute(cfg, dataset=data)
    assert calls == [len(cfg.gammas) + len(cfg.random_sizes) + 2]
    for label, method in packed["methods"].items():
        assert method["packed_with"] == calls[0]
        assert method["clients"] == separate["methods"][label]["clients"]
        assert abs(method["accuracy"] - separate["methods"][label]["accuracy"]) <= 1e-6, label


def test_the_pipeline_records_the_same_provenance_as_an_engine_run(data):
    """Issue 31: the one-shot stage's result carries the key, the resolved config, the rule versions and the
    data, as every engine run does (fedlib.results._key_provenance)."""
    from fedlib.scm_pipeline import run_pipeline

    cfg = ScmConfig.make(_config().to_dict(), post_rounds=0, stability_runs=0, expertise_repeats=0)
    meta = run_pipeline(cfg, cache=False, dataset=data).meta
    assert meta["config_key"] == cfg.key() and meta["resolved"] == cfg.resolved()
    assert meta["rule_versions"] == cfg.rule_versions() and set(meta["data"]) == {"source", "files", "sha256"}
    assert meta["device"].startswith("cpu (")


def _close(a, b, path="result"):
    """Two JSON-ready results agree: equal structure and strings, numbers within 1e-6."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert (a != a and b != b) or abs(a - b) <= 1e-6 * max(1.0, abs(a)), f"{path}: {a} vs {b}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def test_federations_run_together_equal_each_alone(data, monkeypatch):
    """Issue 28: FedSCM's one-shot stages of several federations (α, seeds, a covariate shift) train as
    one population in one call, their plain post-trainings as one pack, and each result equals its
    federation run alone (every method, the selections, the clients' accuracies, the diagnosis)."""
    import fedlib.scm_pipeline as pipeline
    from fedlib.scm_pipeline import execute_many

    configs = [_config(alpha=0.5, seed=0), _config(alpha=2.0, seed=1), _config(alpha=0.5, seed=1),
               _config(shift="covariate", seed=0)]
    alone = [execute(c, dataset=data) for c in configs]
    calls = {"train": [], "post": []}
    train, post = pipeline.train_together, pipeline.execute_packed
    monkeypatch.setattr(pipeline, "train_together", lambda requests, *a: calls["train"].append(
        sum(r.rows for r in requests)) or train(requests, *a))
    monkeypatch.setattr(pipeline, "execute_packed", lambda prepared, *a, **k: calls["post"].append(
        len(prepared)) or post(prepared, *a, **k))
    together = execute_many(configs, dataset=data)
    cohorts = len(configs[0].gammas) + len(configs[0].random_sizes) + 2  # FedSCM per γ, Random, SDEA, FedAvg
    assert calls["train"][0] == 4 * 12 and calls["post"] == [4 * cohorts]  # the first: every client of the 4
    for config, a, b in zip(configs, alone, together):
        for part in ("methods", "selections", "clients", "target_proportions", "diagnosis", "stability"):
            for label in a["methods"]:  # timings and pack sizes are the only differences
                for k in ("seconds", "packed_with", "pack_seconds"):
                    a["methods"][label].pop(k, None), b["methods"][label].pop(k, None)
            _close(a[part], b[part], f"{config.shift} α={config.alpha} seed {config.seed}: {part}")
    assert [b["meta"]["pack"]["index"] for b in together] == [0, 1, 2, 3]
    assert {b["meta"]["pack"]["size"] for b in together} == {4}


def test_run_pipelines_serves_the_cache_and_stores_each_result(data, tmp_path):
    from fedlib.cache import ResultCache
    from fedlib.scm_pipeline import run_pipelines

    store = ResultCache(tmp_path / "cache")
    first, second = _config(post_rounds=0, seed=0), _config(post_rounds=0, seed=1)
    done = []
    one = run_pipeline(first, cache=store, dataset=data)
    both = run_pipelines([first, second], cache=store, dataset=data, on_done=lambda i, r: done.append(i))
    assert both[0] == one and done == [0, 1]  # the first from the cache
    assert both[1].meta["config_key"] == second.key(second.data_fingerprint())
    assert run_pipeline(second, cache=store, dataset=data) == both[1]


# ----------------------------------------------------------------------------- the record (issue 46)

SECTIONS = {"methods", "selections", "clients", "target_proportions", "diagnosis"}  # no stability: not run here


def _small(**overrides):
    """The cheapest federation: selection only, no post-training, no stability, no η̂."""
    return _config(**{"post_rounds": 0, "stability_runs": 0, "expertise_repeats": 0, "temperatures": (),
                      "methods": ("fedscm", "best_source", "source_free"), **overrides})


def _values(record: RunResult):
    """What a record computed: everything but the clocks (each method's seconds, meta)."""
    methods = {label: {k: v for k, v in row.items() if k != "seconds"} for label, row in record.parts["methods"].items()}
    return record.config, record.history, record.final, {**record.parts, "methods": methods}


def test_fedlib_run_takes_an_scm_config_and_returns_the_pipelines_record(data, tmp_path):
    cfg = _small()
    record = fedlib.run(cfg, cache=False, progress=False, dataset=data)
    assert isinstance(record, RunResult) and _values(record) == _values(run_pipeline(cfg, cache=False, dataset=data))
    assert record.history == [] and set(record.parts) == SECTIONS
    headline = record.parts["methods"]["FedSCM (γ = 0.67)"]  # the first γ's FedSCM row
    assert record.final == {"method": "FedSCM (γ = 0.67)", "accuracy": headline["accuracy"],
                            "balanced_accuracy": headline["balanced_accuracy"]}
    assert record.meta["config_key"] == cfg.key()
    assert f"final (FedSCM (γ = 0.67)): accuracy {100 * headline['accuracy']:.2f}%" in record.summary()
    store = ResultCache(tmp_path)
    kept = fedlib.run(cfg.to_dict(), cache=store, progress=False, dataset=data)  # a mapping that is an ScmConfig's
    assert _values(kept) == _values(record)
    assert run_pipeline(cfg, cache=store, dataset=data) == kept  # cached where run_pipeline finds it
    assert run_many([cfg], cache=store) == [kept] == run_many([cfg.to_dict()], cache=store, pack=True)


def test_the_record_round_trips_and_reads_the_stored_layout_before_it(data, tmp_path):
    cfg = _small()
    record = run_pipeline(cfg, cache=False, dataset=data)
    as_json = json.loads(json.dumps(record.to_dict()))
    assert set(as_json) == {"config", "history", "final", "meta"} | SECTIONS  # the sections at the top level
    assert RunResult.from_dict(as_json) == record
    before = {k: v for k, v in as_json.items() if k not in ("history", "final")}  # as FedSCM runs were stored
    old = RunResult.from_dict(before)
    assert old == record and old.parts == record.parts and old.history == []
    assert old.final["accuracy"] == record.parts["methods"]["FedSCM (γ = 0.67)"]["accuracy"]
    store = ResultCache(tmp_path)
    store.put(cfg.key(), stored_payload(cfg.to_dict(), before))
    assert run_pipeline(cfg, cache=store, dataset=data) == record  # an old cache entry reads as the record
    assert old.to_dict() == as_json  # written back, it gains its history and final


def test_final_is_the_first_fedscm_row_else_the_first_row(data):
    result = execute(_small(methods=("best_source", "fedscm"), gammas=(0.8, 0.67)), data)
    assert list(result["methods"]) == ["Best Source", "FedSCM (γ = 0.8)", "FedSCM (γ = 0.67)"]
    assert result["final"] == {"method": "FedSCM (γ = 0.8)", **{k: result["methods"]["FedSCM (γ = 0.8)"][k]
                                                                  for k in ("accuracy", "balanced_accuracy")}}
    rows = {"Best Source": {"accuracy": 0.5, "balanced_accuracy": 0.25}, "FedAvg": {"accuracy": 0.75}}
    assert pipeline_final(rows) == {"method": "Best Source", "accuracy": 0.5, "balanced_accuracy": 0.25}
    assert pipeline_final({}) == {"method": None, "accuracy": None, "balanced_accuracy": None}


def test_bad_fedscm_inputs_to_the_front_door_fail_with_one_line():
    cfg = _small()
    for call, message in (
        (lambda: fedlib.run({**cfg.to_dict(), "gammas": (1.0,)}), "gammas: each must be in [0, 1)"),
        (lambda: fedlib.run(cfg, on_round=print), "on_round is for federated rounds"),
        (lambda: run_many([cfg], executor=object()), "FedSCM configs (ScmConfig) take no executor"),
        (lambda: run_many([cfg, fedlib.make_config(dataset="synthetic")], pack=True), "pack only among themselves"),
        (lambda: run_pack([cfg]), "pack by fedlib.scm_pipeline.run_pipelines"),
    ):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) \
                as info:
            call()
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="a part cannot be named 'final'"):
        RunResult(config={}, history=[], final={}, meta={}, parts={"final": {}})
