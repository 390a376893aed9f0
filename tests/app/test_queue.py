"""The results queue: every chapter's items, order, cost model, budget, storing, resuming."""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedlib.cache import load_entry
from fedlib.data import data_missing
from fedlib.results import RunResult

from fedlib.app import queue
from fedlib.app.queue import cost as queue_cost
from fedlib.app.queue import runner as queue_runner
from fedlib.app.queue import store as queue_store
from fedlib.app.kit.sources import load_profile
from fedlib.app.chapters import CHAPTER_MODULES, chapter_module

SMOKE_CHAPTERS = [c for c in CHAPTER_MODULES]


@pytest.mark.parametrize("chapter", SMOKE_CHAPTERS)
@pytest.mark.parametrize("profile", ["smoke", "paper"])
def test_a_chapter_declares_its_runs_once_and_the_book_reads_the_queues_cells(chapter, profile):
    """One declaration, ``runs(params)``: the book's configs are its cells' configs, each once in the order of
    the first cell naming it; every cell has a label and its config's seed; every run an experiment of the
    protocol makes (``experiment_configs``, where a chapter has one) is a cell."""
    from fedlib.app.chapters import record

    params = load_profile(chapter, profile)
    module, items = chapter_module(chapter), chapter_module(chapter).runs(params)
    configs = record(chapter).configs(params)
    assert [c.key() for c in configs] == list(dict.fromkeys(i.key for i in items))
    assert all(i.chapter == chapter and i.table and i.row and i.column for i in items)
    assert all(i.seed == i.config.seed for i in items)
    protocol = getattr(module, "experiment_configs", None) or getattr(getattr(module, "protocol", None),
                                                                      "experiment_configs", None)
    if protocol is not None:
        made = {c.key() for e in params["experiments"] for c in protocol(params, e)}
        assert made <= {i.key for i in items}
    if chapter == "leaderboard":  # its page's own subsets are cells too
        pages = {c.key() for c in module.configs(params)} | {c.key() for c in module.poisoning_configs(params)}
        pages |= {c.key() for d in params["datasets"] for c in module.uwa_configs(params, d)}
        assert pages == {i.key for i in items}


def test_every_paper_table_has_a_headline_row_at_seed_zero():
    for chapter in ("celm", "fedms", "logitfl", "fedscm", "flce"):
        items = queue.chapter_items(chapter, "paper")
        assert any(i.headline and i.first_seed and i.table_rank == 0 for i in items), chapter


@dataclass(frozen=True)
class FakeConfig:
    dataset: str = "fmnist"
    model: str = "mlp"
    rounds: int = 10
    local_epochs: int = 1
    n_clients: int = 5
    clients_per_round: int | None = None
    fraction: float = 1.0
    method: dict | None = None
    seed: int = 0
    name: str = "a"

    def key(self):
        return f"{self.name}-{self.seed}"

    def work(self):  # a config kind knows its training-sample passes (RunConfig.work)
        n = {"fmnist": 60000, "mnist": 60000}.get(self.dataset, 50000) * self.fraction
        return self.rounds * self.local_epochs * n * (self.clients_per_round or self.n_clients) / self.n_clients

    def to_dict(self):
        return {"dataset": self.dataset, "model": self.model, "rounds": self.rounds, "local_epochs": self.local_epochs,
                "n_clients": self.n_clients, "clients_per_round": self.clients_per_round, "fraction": self.fraction,
                "method": self.method or {"name": "fedavg"}, "seed": self.seed}

    # what a stored run is matched on when its data is absent here (fedlib.app.kit.stored.StoredIndex)
    def resolved(self):
        return self.to_dict()

    def rule_versions(self):
        return {"engine": "fake"}

    def data_fingerprint(self):
        return {"sha256": None}


def fake_item(name, seed=0, headline=False, rank=0, rounds=10, dataset="fmnist", model="mlp", method="fedavg"):
    config = FakeConfig(dataset=dataset, model=model, rounds=rounds, seed=seed, name=name, method={"name": method})
    return queue.QueueItem("celm", "Table 1", f"row {name}", "FedAvg", seed, config, lambda c: {},
                           headline=headline, table_rank=rank, first_seed=seed == 0)


def test_work_counts_training_sample_passes():
    from fedlib.config import make_config

    # 10 rounds x 1 epoch x 60,000 Fashion-MNIST samples, all 5 clients train each round
    assert queue.work(make_config(dataset="fmnist", n_clients=5, rounds=10)) == 10 * 60000
    # 10 % of 50 clients per round: a tenth of the data per round
    assert queue.work(make_config(dataset="fmnist", n_clients=50, clients_per_round=5, rounds=10)) == \
        pytest.approx(10 * 6000)
    # a logit run adds its distillation epochs over the server's set, per client
    logit = make_config(dataset="fmnist", n_clients=5, rounds=10, server_val=1000, method={"name": "logit_simple"})
    assert queue.work(logit) == 10 * (60000 + logit.method.params.get("distill_epochs", 1) * 1000 * 5)


def test_cost_model_uses_the_most_similar_stored_runs_then_the_fallback():
    model = queue.CostModel()
    cfg = FakeConfig().to_dict()  # 600,000 passes
    model.add(cfg, 60.0, "cpu (x86_64, 1 threads)")  # 1e-4 s per pass
    model.add(cfg, 120.0, "cpu (x86_64, 1 threads)")  # 2e-4 s per pass -> median 1.5e-4
    model.add(cfg, 0.0, "cpu")  # served from a cache: ignored
    seconds, how = model.estimate(FakeConfig(rounds=20).to_dict(), "cpu")
    assert seconds == pytest.approx(queue_cost.STARTUP_SECONDS + 1.5e-4 * 1_200_000)
    assert how == "measured (2)"
    # another method on the same model: the model's rate times the method's factor
    fedsv = {**cfg, "method": {"name": "fedsv"}}
    seconds, _ = model.estimate(fedsv, "cpu")
    assert seconds == pytest.approx(queue_cost.STARTUP_SECONDS + 1.5e-4 * 600_000 * queue.METHOD_FACTOR["fedsv"])
    # nothing measured on a GPU: the fallback, 0.005 s per 1,000 passes for the MLP
    seconds, how = model.estimate(cfg, "cuda")
    assert how == "fallback"
    assert seconds == pytest.approx(queue_cost.STARTUP_SECONDS + 0.005 * 600)


def test_order_is_seed_zero_then_headline_then_main_tables_then_cheap():
    items = [fake_item("late-seed", seed=1, headline=True), fake_item("appendix", rank=2, headline=False),
             fake_item("plain-expensive", rounds=100), fake_item("plain-cheap", rounds=1),
             fake_item("headline", headline=True, rounds=100)]
    entries = queue.plan(items=items, cost_model=queue.CostModel())
    assert [e.item.config.name for e in entries] == ["headline", "plain-cheap", "plain-expensive", "appendix",
                                                     "late-seed"]


def test_plan_marks_stored_and_absent_runs_and_filters_cpu_and_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    monkeypatch.setattr(queue_store, "data_missing", lambda d: "cifar100 data absent" if d == "cifar100" else None)
    items = [fake_item("a"), fake_item("b"), fake_item("c", dataset="cifar10", model="cnn"),
             fake_item("d", dataset="cifar100", model="cnn")]
    queue.store_payload(items[0], {"meta": {}}, "paper")  # a stored run of a (judged by content: not any file)
    entries = {e.item.config.name: e for e in queue.plan(items=items, cost_model=queue.CostModel())}
    assert entries["a"].stored and not entries["b"].stored and entries["d"].missing
    cpu = queue.plan(items=items, part="cpu", cost_model=queue.CostModel())
    gpu = queue.plan(items=items, part="gpu", cost_model=queue.CostModel())
    assert [e.item.config.name for e in cpu] == ["a", "b"]
    assert {e.item.config.name for e in gpu} == {"c", "d"}
    rows = queue.summary(list(entries.values()))
    assert rows == [{"chapter": "celm", "table": "Table 1", "stored": 1, "pending": 2, "not runnable": 1,
                     "pending hours": pytest.approx((entries["b"].cost + entries["c"].cost) / 3600)}]
    text = queue.format_list(list(entries.values()))
    assert "absent" in text and "total" in text


def entry(name, cost):
    return queue.Entry(fake_item(name), cost, "test", False, None)


def sleeper(seconds_of):
    """A worker command that sleeps (or fails for names starting with 'bad')."""
    def command(e, profile, device):
        name = e.item.config.name
        code = "import sys; sys.exit(3)" if name.startswith("bad") else f"import time; time.sleep({seconds_of[name]})"
        return [sys.executable, "-c", code]
    return command


def test_budget_starts_only_runs_that_fit_and_reports_failures():
    entries = [entry("a", 0.2), entry("too-long", 50.0), entry("bad", 0.1), entry("b", 0.2)]
    lines = []
    out = queue.run_queue(entries, budget=3.0, workers=2, log=lines.append, poll=0.05,
                          command=sleeper({"a": 0.1, "b": 0.1, "too-long": 50}))
    assert sorted(i.config.name for i in out.stored) == ["a", "b"]
    assert [i.config.name for i, _ in out.failed] == ["bad"]
    assert not out.killed and out.elapsed < 3.0
    assert any(line.startswith("budget:") for line in lines)
    assert sum(line.startswith("[start") for line in lines) == 3


def test_a_run_far_past_its_estimate_is_stopped_at_the_budget():
    out = queue.run_queue([entry("slow", 0.1)], budget=0.5, grace=0.0, workers=1, log=lambda _: None, poll=0.05,
                          command=sleeper({"slow": 30}))
    assert [i.config.name for i in out.killed] == ["slow"] and not out.stored
    assert out.elapsed < 10


def test_store_payload_keeps_the_chapters_config_and_provenance(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    item = fake_item("x")
    result = {"config": {"device": "cuda"}, "final": {"accuracy": 0.5},
              "meta": {"device": "cuda (H100)", "date": "2026-01-01", "wall_time": 12.0}}
    path = queue.store_payload(item, result, "paper")
    payload = load_entry(path)["payload"]
    assert path == tmp_path / "runs" / "x-0.json.zd"
    assert payload["result"]["config"] == item.config.to_dict() == payload["config"]
    assert payload["device"] == "cuda (H100)" and payload["wall_time"] == 12.0
    assert payload["queue"]["table"] == "Table 1" and queue.is_stored(item)


def test_data_missing_names_the_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path))
    reason = data_missing("cifar100")
    assert reason.startswith("cifar100 data absent") and str(tmp_path) in reason
    assert data_missing("synthetic") is None


def test_cli_rejects_an_unknown_chapter(capsys):
    from fedlib.__main__ import main

    assert main(["results", "--list", "--only", "nope"]) == 2
    assert "unknown chapter 'nope'" in capsys.readouterr().err


def test_first_puts_named_tables_ahead_but_seed_zero_still_leads():
    a = fake_item("a", headline=True)
    b = queue.QueueItem("fedms", "Table 1", "row b", "FedMS", 0, FakeConfig(name="b"), lambda c: {})
    b1 = queue.QueueItem("fedms", "Table 1", "row b", "FedMS", 1, FakeConfig(name="b", seed=1), lambda c: {},
                         first_seed=False)
    entries = queue.plan(items=[a, b, b1], cost_model=queue.CostModel(), first=[("fedms", "Table 1")])
    assert [(e.item.config.name, e.item.seed) for e in entries] == [("b", 0), ("a", 0), ("b", 1)]
    only_seed1 = queue.plan(items=[a, b, b1], cost_model=queue.CostModel(), seeds=[1])
    assert [e.item.seed for e in only_seed1] == [1]


def test_a_table_filter_keeps_a_run_the_table_shares_under_another_label():
    """CELM's PLS CELM runs back Table 1 and Table 4 and are labelled Table 4: asking for Table 1 must
    still queue them (--table "Table 1" had left them out)."""
    a = fake_item("x", headline=True)
    b = queue.QueueItem("celm", "Table 4", "row x", "CELM evidence", 0, a.config, lambda c: {}, headline=True,
                        table_rank=-1, first_seed=True)  # the label the run gets
    entries = queue.plan(items=[a, b], cost_model=queue.CostModel(), tables=["Table 1"])
    assert [(e.item.table, e.item.key) for e in entries] == [("Table 4", a.key)]
    only_table4 = queue.plan(items=[a, b, fake_item("y")], cost_model=queue.CostModel(), tables=["Table 4"])
    assert [e.item.key for e in only_table4] == [a.key]  # y backs Table 1 only


def test_a_run_two_chapters_share_is_queued_once_and_stored_once(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path / "repo")
    a = fake_item("x")
    b = queue.QueueItem("fedavg", "Table 1 (FedAvg)", "row x", "FedAvg (uniform)", 0, a.config, lambda c: {})
    entries = queue.plan(items=[b, a], cost_model=queue.CostModel())
    assert len(entries) == 1 and set(entries[0].chapters) == {"celm", "fedavg"}
    queue.store_payload(a, {"meta": {}}, "paper")
    entries = queue.plan(items=[b, a], cost_model=queue.CostModel())
    assert entries[0].stored and [p.name for p in tmp_path.rglob("*.json*")] == ["x-0.json.zd"]
    assert queue.is_stored(b)  # the other chapter reads the same file


def test_packs_follow_first_then_value_and_a_pack_too_long_for_the_budget_runs_the_part_that_fits(monkeypatch):
    monkeypatch.setattr(queue_cost, "STARTUP_SECONDS", 0.0)
    monkeypatch.setattr(queue_runner, "is_stored", lambda item: False)
    items = queue.chapter_items("fedavg", "smoke")[:3] + queue.chapter_items("logitfl", "smoke")[:4]
    entries = queue.plan(items=items, cost_model=queue.CostModel())
    for first, chapter in (([("fedavg", None)], "fedavg"), ([("logitfl", None)], "logitfl")):
        units = queue.plan_packs(entries, "cuda", max_rows=1000, cost_model=queue.CostModel(), first=first)
        assert {i.chapter for i in units[0].items} == {chapter}  # --first decides before value per second
    wanted = [queue.Entry(fake_item(f"w{i}", rounds=3), 10.0, "test", False, None) for i in range(3)]
    started, lines = [], []

    def command(unit, profile, device):
        started.append(sorted(i.config.name for i in unit.items))
        return [sys.executable, "-c", "pass"]

    out = queue.run_queue([queue.Pack(wanted, 30.0, "measured pack")], budget=21.0, workers=1, log=lines.append, poll=0.05,
                          command=command, claims=False)
    assert started[0] == ["w0", "w1"]  # 2 of the 3 runs fit in 21 s at 10 s each
    assert any("of the 3 fits" in line for line in lines)
    assert {i.config.name for i in out.stored} >= {"w0", "w1"}


def test_an_unmeasured_first_pack_keeps_a_margin_and_is_split_before_a_later_unit_runs(monkeypatch):
    """The GPU call of 2026-11-27: a 69-run pack too long for the budget was skipped for a later pack
    whose assumed estimate fitted, ran past the budget and stored nothing."""
    monkeypatch.setattr(queue_cost, "STARTUP_SECONDS", 0.0)
    wanted = [queue.Entry(fake_item(f"w{i}", rounds=3), 10.0, "test", False, None) for i in range(3)]
    later = queue.Entry(fake_item("later"), 4.0, "measured (3)", False, None)
    assert queue.reserved(queue.Pack(wanted, 30.0, "assumed pack speed-up")) == 45.0
    assert queue.reserved(later) == 4.0
    started, lines = [], []

    def command(unit, profile, device):
        started.append(sorted(i.config.name for i in unit.items))
        return [sys.executable, "-c", "pass"]

    queue.run_queue([queue.Pack(wanted, 30.0, "assumed pack speed-up"), later], budget=21.0, workers=1,
                    log=lines.append, poll=0.05, command=command, claims=False)
    assert started[0] == ["w0"]  # 1 run x 10 s x 1.5 fits in 21 s, 2 do not; the later unit waits its turn
    assert started[-1] == ["later"] and len(started) == 4  # the runs took no time: w1, w2 then fitted too
    assert any("of the 3 fits" in line for line in lines)


def test_runs_this_queue_stored_re_estimate_the_rest_before_older_stores(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path / "repo")
    done, later = queue.chapter_items("fedavg", "smoke")[:2]
    model = queue.CostModel()
    model.add(done.config, 100.0, "cpu")  # an older store: 100 s for the same kind of run
    pending = [queue.Entry(later, *model.estimate(later.config), False, None)]
    assert pending[0].cost == pytest.approx(queue_cost.STARTUP_SECONDS + 100.0 * queue.work(later.config)
                                            / queue.work(done.config))
    queue.store_payload(done, {"meta": {"wall_time": 10.0, "device": "cpu"}}, "paper")
    queue.recost(pending, [done], model, "cpu")
    assert pending[0].how == "measured (1)"
    assert pending[0].cost == pytest.approx(queue_cost.STARTUP_SECONDS + 10.0 * queue.work(later.config)
                                            / queue.work(done.config))
    assert len(model.samples) == 2  # the fresh run also joins the store's samples


def test_a_packed_rate_is_split_by_the_methods_server_work():
    """A pack of FedAvg (factor 1) and FedMS (factor 3), equal work w, took W seconds: each stored run says
    W / (2 w) per pass; per unit of factor that is W / (4 w), so FedMS's share is 3 W / 4 and FedAvg's W / 4,
    and the same pack is estimated at W again (plus the start-up)."""
    items = queue.chapter_items("fedms", "smoke")
    fedavg = next(i for i in items if i.config.method.name == "fedavg" and i.table == "Table 1")
    fedms = next(i for i in items if i.config.method.name == "fedms" and i.table == "Table 1"
                 and i.config.split == fedavg.config.split and i.config.seed == fedavg.config.seed)
    w, wall = queue.work(fedavg.config), 120.0
    assert queue.work(fedms.config) == w
    model = queue.CostModel()
    for item in (fedavg, fedms):
        model.add(item.config, wall, "cuda:0 (H100)", pack_size=2, pack_methods=["fedavg", "fedms"])
    assert model.packed_rate(fedavg.config, "cuda") == pytest.approx(wall / (4 * w))
    assert model.packed_rate(fedms.config, "cuda") == pytest.approx(3 * wall / (4 * w))
    entries = [queue.Entry(i, 1.0, "test", False, None) for i in (fedavg, fedms)]
    cost, how = queue.pack_cost(entries, "cuda", model)
    assert how == "measured pack" and cost == pytest.approx(queue_cost.STARTUP_SECONDS + wall)


def test_a_key_the_profile_has_no_run_for_is_a_one_line_error_naming_the_data_root():
    with pytest.raises(ValueError, match=r"celm: no run with key 'nope' in the smoke profile \(a key includes the "
                                         r"data's fingerprint: was it made with this FEDLIB_DATA\?"):
        queue.run_one("celm", "nope", "smoke")


def test_augmented_runs_are_timed_apart_from_plain_ones():
    """A crop + flip run is estimated from augmented runs when there are some, else from its plain twins
    times AUGMENT_FACTOR (also for packs and for the fallback rates)."""
    item = next(i for i in queue.chapter_items("celm", "smoke") if i.config.dataset == "fmnist")
    plain, augmented = item.config, item.config.model_copy(update={"augment": "crop_flip"})
    w = queue.work(plain)
    assert queue.work(augmented) == w
    model = queue.CostModel()
    fallback = model.estimate(plain, "cuda")[0] - queue_cost.STARTUP_SECONDS
    assert model.estimate(augmented, "cuda")[0] - queue_cost.STARTUP_SECONDS == pytest.approx(queue.AUGMENT_FACTOR * fallback)
    model.add(plain, 100.0, "cuda:0 (H100)")
    model.add(plain, 60.0, "cuda:0 (H100)", pack_size=2, pack_methods=[plain.method.name] * 2)
    seconds, how = model.estimate(augmented, "cuda")
    assert how == "measured plain runs x augmentation"
    assert seconds == pytest.approx(queue_cost.STARTUP_SECONDS + 100.0 * queue.AUGMENT_FACTOR)
    assert model.packed_rate(augmented, "cuda") == pytest.approx(30.0 / w * queue.AUGMENT_FACTOR)
    model.add(augmented, 180.0, "cuda:0 (H100)")
    model.add(augmented, 90.0, "cuda:0 (H100)", pack_size=2, pack_methods=[plain.method.name] * 2)
    assert model.estimate(augmented, "cuda") == (pytest.approx(queue_cost.STARTUP_SECONDS + 180.0), "measured (1)")
    assert model.estimate(plain, "cuda")[0] == pytest.approx(queue_cost.STARTUP_SECONDS + 100.0)  # not mixed
    assert model.packed_rate(augmented, "cuda") == pytest.approx(45.0 / w)


def test_fedscm_federations_are_planned_as_packs_and_run_by_run_pipelines(monkeypatch):
    """Issue 28: the paper profile's FedSCM federations (Table 2's 3 α x 3 seeds, Table 4's covariate
    shift) join packs of at most SCM_PACK_RUNS with equal scm_pack_signature, costed as their separate
    runs; --run-pack hands them to fedlib.scm_pipeline.run_pipelines, which stores each."""
    monkeypatch.setattr(queue_cost, "STARTUP_SECONDS", 0.0)
    items = queue.chapter_items("fedscm", "paper")
    assert len(items) == 12 and {queue.scm_pack_signature(i.config) for i in items} == {
        queue.scm_pack_signature(items[0].config)}
    entries = [queue.Entry(i, 100.0, "test", False, None) for i in items]
    units = queue.plan_packs(entries, "cuda", cost_model=queue.CostModel())
    assert [len(u.entries) for u in units] == [queue.SCM_PACK_RUNS, 12 - queue.SCM_PACK_RUNS]
    assert units[0].cost == 100.0 * queue.SCM_PACK_RUNS and units[0].how == "separate estimates"
    smoke = queue.chapter_items("fedscm", "smoke")
    seen, stored = [], []
    record = RunResult(config={}, history=[], final={}, meta={"wall_time": 1.0}, parts={"methods": {}})
    monkeypatch.setattr(queue_runner, "run_pipelines", lambda configs, on_done: seen.append(configs) or [
        on_done(i, record) or record for i in range(len(configs))])
    monkeypatch.setattr(queue_runner, "store_payload", lambda item, result, profile: stored.append(
        (item.key, result)) or Path(item.key))
    queue.run_packed([f"fedscm:{i.key}" for i in smoke], "smoke", log=lambda *a: None)
    assert [[c.key() for c in configs] for configs in seen] == [[i.config.key() for i in smoke]]
    assert stored == [(i.key, record.to_dict()) for i in smoke]  # each record stored as its dict
    engine = queue.chapter_items("fedavg", "smoke")[0]
    with pytest.raises(ValueError, match="cannot share a pack"):
        queue.run_packed([f"fedscm:{smoke[0].key}", f"fedavg:{engine.key}"], "smoke")


def test_a_fedscm_federation_costs_every_cohort_it_post_trains():
    """By hand, the paper profile (CIFAR-10, K = 500, 5 local epochs, 1,000 post rounds of 1 epoch, 3 γ,
    Random 3 + 5 + 10, SDEA 3, FedAvg and K3DA on all clients, FMDA-OT 100 samples each): a client holds
    100 samples; a round trains (3 x 20 + 18 + 3 + 500 + 501) x 100 + 500 x 100 passes = 158,200."""
    config = next(i.config for i in queue.chapter_items("fedscm", "paper") if i.table == "Table 2")
    assert (config.n_clients, config.fedavg_per_round, config.ot_samples) == (500, None, 100)
    assert config.round_passes(50000) == pytest.approx((3 * 20 + 18 + 3 + 500 + 501) * 100 + 500 * 100)
    assert queue.work(config) == pytest.approx(5 * 50000 + 1000 * 158200)
    fewer = config.model_copy(update={"fedavg_per_round": 10, "methods": ("fedscm", "fedavg")})
    assert fewer.round_passes(50000) == pytest.approx((3 * 20 + 10) * 100)


def test_a_model_without_runs_on_a_device_is_estimated_from_a_like_model_scaled_by_flops():
    """The wider CNN had no run on a GPU: its packs were put at the unknown-model figure (10x the CNN's), so
    the 2026-11-28 plan of the GPU call started none of CELM's CIFAR-10 Table 1. Now: the CNN's packed rate
    there times the FLOPs per sample of the two (by hand, 15,775,232 / 4,655,440), not counted as measured."""
    ratio = 15_775_232 / 4_655_440
    assert queue.model_flops("cnn_wide", "cifar10") / queue.model_flops("cnn", "cifar10") == pytest.approx(ratio)
    for kind, figures in queue.FALLBACK_SECONDS_PER_1000.items():
        assert figures["cnn_wide"] == pytest.approx(figures["cnn"] * ratio, rel=2e-3), kind
    cnn = FakeConfig(dataset="cifar10", model="cnn", rounds=200).to_dict()  # 200 x 50,000 = 10 M passes
    wide = {**cnn, "model": "cnn_wide"}
    model = queue.CostModel()
    assert model.estimate(wide, "cuda")[1] == "fallback"
    model.add(cnn, 40.0, "cuda:0 (H100)", pack_size=2, pack_methods=["fedavg", "fedavg"])  # 2e-6 s per pass
    model.add({**cnn, "rounds": 20}, 20.0, "cuda:0 (H100)", pack_size=2, pack_methods=["fedavg", "fedavg"])
    rate, how = model.packed_estimate(wide, "cuda")
    assert rate == pytest.approx(2e-6 * ratio)  # the run of the same size (10 M passes) first
    assert how == "scaled from cnn by FLOPs (1)"
    cost, how = queue.pack_cost([queue.Entry(queue.QueueItem("celm", "Table 1", "r", "c", 0, wide, lambda c: {}),
                                             1.0, "t", False, None)], "cuda", model)
    assert cost == pytest.approx(queue_cost.STARTUP_SECONDS + 20.0 * ratio) and how.startswith("pack scaled")
    assert queue.reserved(queue.Pack([], cost, how)) == pytest.approx(cost * queue.UNCALIBRATED_MARGIN)
    # a separate run: the same method's separate runs of the other model; the model's own runs come first
    model.add(cnn, 100.0, "cuda:0 (H100)")
    seconds, how = model.estimate(wide, "cuda")
    assert seconds == pytest.approx(queue_cost.STARTUP_SECONDS + 100.0 * ratio) and how == "scaled from cnn by FLOPs (1)"
    model.add(wide, 150.0, "cuda:0 (H100)")
    assert model.estimate(wide, "cuda") == (queue_cost.STARTUP_SECONDS + 150.0, "measured (1)")
    # not across a factor over 4 in FLOPs (ResNet-20 is 17.5 CNNs), nor from augmented to plain runs
    resnet = {**cnn, "model": "resnet20"}
    assert model.estimate(resnet, "cuda")[1] == "fallback" and model.packed_estimate(resnet, "cuda") is None
    model.add({**wide, "augment": "crop_flip"}, 10.0, "cuda:0 (H100)", pack_size=2, pack_methods=["fedavg"] * 2)
    assert model.packed_estimate(wide, "cuda") == (pytest.approx(2e-6 * ratio), "scaled from cnn by FLOPs (1)")
    assert queue.model_flops("vgg11", "fmnist") is None and queue.model_flops("cnn", "imagefolder:/x") is None


def test_a_budgeted_list_previews_what_the_queue_would_start():
    """``--list --budget``: the units :func:`queue.run_queue` would start, by the estimates: a first pack too
    long for the budget is split to the part that fits (here 1 of 3 runs, at 10 s x the 1.5 margin), before a
    later unit; the rest follow as the estimated time passes."""
    wanted = [queue.Entry(fake_item(f"w{i}", rounds=3), 10.0, "test", False, None) for i in range(3)]
    later = queue.Entry(fake_item("later"), 4.0, "measured (3)", False, None)
    units = [queue.Pack(wanted, 30.0 + queue_cost.STARTUP_SECONDS, "assumed pack speed-up"), later]
    started = queue.preview(units, budget=21.0 + 1.5 * queue_cost.STARTUP_SECONDS)
    assert [sorted(i.config.name for i in u.items) for _, u in started] == [["w0"], ["later"]]
    assert [at for at, _ in started] == [0.0, 10.0]  # then w1 needs 1.5 x (10 + 15 s start-up) > 33.5 s left
    text = queue.format_preview(started, 43.5)
    assert text.startswith("With a budget of 44 s and 1 worker(s), by the estimates this queue would start 2 unit(s) "
                           "of 2 run(s):")
    assert "at 0:10" in text and "[measured (3)]" in text
    assert queue.preview(units, budget=1.0) == []


def test_the_cli_list_with_a_budget_prints_the_preview_and_runs_nothing(tmp_path, monkeypatch, capsys):
    from fedlib.__main__ import main

    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path / "repo")
    monkeypatch.setattr(queue, "run_queue", lambda *a, **k: pytest.fail("--list must not run anything"))
    assert main(["results", "--list", "--summary", "--only", "fedavg", "--profile", "smoke", "--pack", "on",
                 "--budget", "100000"]) == 0
    out = capsys.readouterr().out
    pending = len(queue.unique(queue.chapter_items("fedavg", "smoke")))
    assert "packs: 1 pack(s) of" in out
    assert (f"With a budget of 100000 s and 1 worker(s), by the estimates this queue would start 1 unit(s) of "
            f"{pending} run(s):") in out
    assert main(["results", "--list", "--only", "fedavg", "--profile", "smoke", "--budget", "1"]) == 0
    assert "would start 0 unit(s) of 0 run(s):" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the CLI's input (issue 43, point 5)


@pytest.fixture()
def empty_store(tmp_path, monkeypatch):
    """The CLI queue on an empty store of its own (nothing read from the repository's results/)."""
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path / "repo")
    monkeypatch.setattr(queue, "run_queue", lambda *a, **k: pytest.fail("nothing may run"))
    return tmp_path


def cli(capsys, *args):
    from fedlib.__main__ import main

    code = main(["results", *args])
    out, err = capsys.readouterr()
    return code, out, err


SMOKE_FEDAVG = ("--only", "fedavg", "--profile", "smoke")


@pytest.mark.parametrize("flags, line", [
    (("--seed", "99"), "fedlib results: --seed: no run in this queue has seed 99 (its seeds: 0)"),
    (("--seed", "0", "7"), "fedlib results: --seed: no run in this queue has seed 7 (its seeds: 0)"),
    (("--seed", "-1"), "fedlib results: --seed: seeds are >= 0 (got -1)"),
    (("--dataset", "cifar100"), "fedlib results: --dataset: no run in this queue is on 'cifar100' "
                                "(its datasets: fmnist)"),
    (("--dataset", "nope"), "fedlib results: --dataset: unknown dataset 'nope'; known: "),
    (("--gpu-only",), "fedlib results: --gpu-only: no run in this queue is a GPU run"),
])
def test_queue_filters_that_match_nothing_say_so_in_one_line_and_exit_non_zero(empty_store, capsys, flags, line):
    code, out, err = cli(capsys, "--list", *SMOKE_FEDAVG, *flags)
    assert code == 2 and out == ""
    assert err.startswith(line) and err.count("\n") == 1


def test_filters_each_matching_something_but_nothing_together_are_one_line():
    items = [fake_item("a", seed=0), fake_item("b", seed=1, dataset="mnist")]
    with pytest.raises(ValueError) as info:
        queue.plan(items=items, datasets=["mnist"], seeds=[0], cost_model=queue.CostModel())
    assert str(info.value) == ("no run in this queue matches --dataset mnist with --seed 0 together "
                               "(2 run(s) before filtering)")
    assert [e.item.config.name for e in queue.plan(items=items, seeds=[1], cost_model=queue.CostModel())] == ["b"]
    assert queue.plan(items=[], seeds=[5], cost_model=queue.CostModel()) == []  # an empty queue is not a filter's fault


@pytest.mark.parametrize("workers, line", [
    ("100000", "fedlib results: --workers: must be an integer in [1, 256] (got 100000)"),
    ("257", "fedlib results: --workers: must be an integer in [1, 256] (got 257)"),
    ("0", "fedlib results: --workers: must be an integer in [1, 256] (got 0)"),
])
def test_workers_beyond_reason_are_refused_in_one_line(empty_store, capsys, workers, line):
    code, out, err = cli(capsys, *SMOKE_FEDAVG, "--workers", workers)
    assert (code, out, err) == (2, "", line + "\n")


def fake_cuda(monkeypatch, count):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("count, device, line", [
    (0, "cuda:99", "fedlib results: --device: 'cuda:99' requested but CUDA is not available here"),
    (0, "cuda", "fedlib results: --device: 'cuda' requested but CUDA is not available here"),
    (1, "cuda:1", "fedlib results: --device: 'cuda:1' does not exist here (1 CUDA device(s): cuda:0 to cuda:0)"),
    (2, "cuda:99", "fedlib results: --device: 'cuda:99' does not exist here (2 CUDA device(s): cuda:0 to cuda:1)"),
    (0, "tpu", "fedlib results: --device: must be cpu, cuda or cuda:N (got 'tpu')"),
])
def test_a_device_that_is_not_here_is_refused_in_one_line_before_anything_runs(empty_store, capsys, monkeypatch,
                                                                               count, device, line):
    fake_cuda(monkeypatch, count)
    code, out, err = cli(capsys, *SMOKE_FEDAVG, "--device", device)
    assert (code, out, err) == (2, "", line + "\n")


def test_devices_that_are_here_are_accepted(monkeypatch):
    fake_cuda(monkeypatch, 2)
    assert queue.check_device("cpu") == "cpu" and queue.check_device("cuda") == "cuda"
    assert queue.check_device("cuda:1") == "cuda:1"
    fake_cuda(monkeypatch, 0)
    assert queue.check_device("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"^--device: 'cuda:0' requested but CUDA is not available here$"):
        queue.run_one("fedavg", "anykey", "smoke", device="cuda:0")


def test_a_list_for_a_device_not_here_is_an_estimate_with_a_note(empty_store, capsys, monkeypatch):
    """``--list --device cuda`` on a CPU machine plans a GPU call (benchmarks/gpu_coverage.sh prepare)."""
    fake_cuda(monkeypatch, 0)
    code, out, err = cli(capsys, "--list", "--summary", *SMOKE_FEDAVG, "--device", "cuda:99")
    assert code == 0 and "total" in out
    assert err == ("fedlib results: note: --device: 'cuda:99' requested but CUDA is not available here; the list "
                   "only estimates for it\n")


def test_the_cli_lists_the_files_the_store_leaves_out_one_line_each(empty_store, capsys):
    runs = empty_store / "runs"
    runs.mkdir()
    (runs / "loop.json.gz").symlink_to("loop.json.gz")
    (runs / "folder.json").mkdir()
    code, out, err = cli(capsys, "--list", "--summary", *SMOKE_FEDAVG)
    assert code == 0 and "total" in out
    assert err.splitlines() == [
        "fedlib results: results/runs/folder.json (a directory, not a regular file): left out, not read (left as it is)"
        .replace("results/runs", f"{empty_store.name}/runs"),
        "fedlib results: results/runs/loop.json.gz (a symbolic link that loops, not a regular file): left out, not "
        "read (left as it is)".replace("results/runs", f"{empty_store.name}/runs")]
    assert (runs / "loop.json.gz").is_symlink() and (runs / "folder.json").is_dir()


# ----------------------------------------------------------------------------- backends (issue 47)


class AnswerBackend:
    """A backend (``queue.LocalProcesses``'s interface) whose units end at their first poll with ``answer(unit)``."""

    def __init__(self, answer, slots=2):
        self.answer, self.n, self.started = answer, slots, []

    def slots(self):
        return self.n

    def accepts(self, unit):
        return True

    def start(self, unit):
        self.started.append(unit.items[0].config.name)
        return unit

    def poll(self, unit):
        return self.answer(unit)

    def cancel(self, unit):
        raise AssertionError("nothing is past the budget")

    def close(self):
        pass


def test_runs_a_backend_sends_back_are_checked_and_stored_here_and_absent_data_is_logged(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path / "repo")

    def answer(unit):
        name = unit.items[0].config.name
        if name == "absent":
            return queue.Finished(absent="cifar10 data absent (looked in /nowhere)", where="w1")
        if name == "bad":
            return queue.Finished(error="RuntimeError: boom", where="w2")
        if name == "short":
            return queue.Finished(records=[], where="w3 (cpu)")
        return queue.Finished(records=[{"meta": {"wall_time": 2.0, "device": "cpu"}}], where="w4 (cpu)", seconds=2.0)

    entries = [entry(name, 1.0) for name in ("ok", "absent", "bad", "short")]
    lines = []
    backend = AnswerBackend(answer)
    out = queue.run_queue(entries, "paper", log=lines.append, poll=0.01, backend=backend)
    assert backend.started == ["ok", "absent", "bad", "short"]  # the queue's order, 2 at a time
    assert [i.config.name for i in out.stored] == ["ok"] and queue.is_stored(out.stored[0])
    assert load_entry(tmp_path / "runs" / "ok-0.json.zd")["payload"]["wall_time"] == 2.0
    assert [(i.config.name, why) for i, why in out.absent] == [("absent", "cifar10 data absent (looked in /nowhere)")]
    assert [(i.config.name, why) for i, why in out.failed] == [
        ("bad", "RuntimeError: boom"), ("short", "the worker sent back list instead of 1 result(s)")]
    assert out.ran_on == {"ok-0": "w4 (cpu)", "absent-0": "w1", "bad-0": "w2", "short-0": "w3 (cpu)"}
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["ok-0.json.zd"]  # no claim left, nothing partial
    assert any(line.startswith("[done  1] celm Table 1 | row ok") and " in 0:02 " in line and "on w4 (cpu)" in line
               for line in lines)
    assert "[absent] celm Table 1 | row absent | FedAvg | seed 0: not runnable on w1: cifar10 data absent " \
           "(looked in /nowhere)" in lines


def test_a_gpu_unit_waits_for_a_free_gpu_slot_while_cpu_units_start():
    gpu = queue.Entry(fake_item("g", dataset="cifar10"), 1.0, "test", False, None)
    cpu = entry("c", 1.0)
    busy = {"gpu": True}
    pick = queue.next_unit([gpu, cpu], None, accept=lambda unit: not (unit.items[0].gpu and busy["gpu"]))
    assert pick is cpu
    busy["gpu"] = False
    assert queue.next_unit([gpu, cpu], None, accept=lambda unit: not (unit.items[0].gpu and busy["gpu"])) is gpu
