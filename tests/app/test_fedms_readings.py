"""FedMS issue 30, point 1: FedAvg under readings of §5.1 (run readings x score readings), the
queue-able configs and the calibration rule, on hand-made histories."""

import numpy as np
import pytest

from fedlib.app.chapters.fedms import FedMS
from fedlib.app.chapters.fedms import analysis as fedms_analysis
from fedlib.app.chapters.fedms import page as fedms_page
from fedlib.app.chapters.fedms import protocol as fedms
from fedlib.app.kit.sources import load_profile, load_reference
from fedlib.app.kit.stored import Stored
from fedlib.run import RunResult


@pytest.fixture(scope="module")
def params():
    """The paper profile under the chapter's original protocol (no table1_reading / table1_score / cifar10_reading)."""
    paper = {k: v for k, v in load_profile("fedms", "paper").items()
             if k not in ("table1_reading", "table1_score", "cifar10_reading")}
    return {**paper, "splits": ["Dir(10)", "Dir(1)", "Dir(0.1)"]}


def _run(accuracies):
    return RunResult(config={}, history=[{"round": t, "accuracy": a} for t, a in enumerate(accuracies)],
                     final={"accuracy": accuracies[-1]}, meta={})


HELD_OUT = "n_i weights, validation held out of training"


def test_reading_configs_change_only_what_their_reading_names(params):
    """The default reading is the paper's (Eq. 3's n_i weights, §5.1's validation from 20 % of the test set):
    Table 1's FedAvg run is that reading's run; the held-out reading keeps 2,000 training samples aside."""
    rows = fedms.maverick_reading_configs(params)
    assert len(rows) == 3 * len(fedms.MAVERICK_RUN_READINGS) and len({c.key() for *_, c in rows}) == len(rows)
    by = {(s, r): c for s, r, c in rows}
    table1 = fedms.run_config(params, "Dir(10)", "fedavg", params["seeds"][0])
    assert fedms.table1_reading(params) == fedms.PAPER_READING == "n_i weights, validation from the test set"
    test = by[("Dir(10)", fedms.PAPER_READING)]
    assert test.key() == table1.key()
    assert (test.method.name, test.server_val, test.test_samples) == ("fedavg", None, 8000)  # 80 % of 10,000
    assert test.resolved()["server_val"] == 0  # FedAvg needs no validation set: it trains on all 60,000 images
    held_out = by[("Dir(10)", HELD_OUT)]
    assert (held_out.method.name, held_out.server_val, held_out.test_samples) == ("fedavg", 2000, None)
    uniform = by[("Dir(10)", "uniform weights, validation held out of training")]
    assert uniform.method.name == "fedavg_uniform" and uniform.server_val == 2000 and uniform.test_samples is None
    keep = {k: v for k, v in table1.resolved().items() if k not in ("server_val", "test_samples", "method")}
    assert {k: v for k, v in held_out.resolved().items() if k in keep} == keep
    items = fedms.maverick_reading_items(params)
    assert [i.key for i in items] == [c.key() for *_, c in rows]
    assert sum(i.headline for i in items) == 1 and {i.table for i in items} == {"Maverick readings"}


def test_the_paper_reading_validates_every_method_on_the_test_set(params):
    """§5.1 for every method: those with a validation set take 2,000 test samples outside the 8,000
    evaluated (``validation_from: test``); the others train on everything. One reading for the whole
    table: CIFAR-10 runs the same way."""
    for cifar10 in (False, True):
        fedms_run = fedms.run_config(params, "Dir(0.1)", "fedms", 0, cifar10=cifar10)
        assert (fedms_run.validation_from, fedms_run.server_val, fedms_run.test_samples) == ("test", 2000, 8000)
        prox = fedms.run_config(params, "Dir(0.1)", "fedprox", 0, cifar10=cifar10)
        assert (prox.validation_from, prox.resolved()["server_val"], prox.test_samples) == (None, 0, 8000)
    held = fedms.run_config({**params, "table1_reading": HELD_OUT}, "Dir(0.1)", "fedms", 0)
    assert (held.validation_from, held.server_val, held.test_samples) == (None, 2000, None)


def test_readings_that_contradict_the_paper_are_labelled_with_what_they_contradict():
    assert fedms.departure(fedms.PAPER_READING) is None
    assert "Eq. 3" in fedms.departure("uniform weights, validation from the test set")
    assert "§5.1" not in fedms.departure("uniform weights, validation from the test set")
    both = fedms.departure("uniform weights, validation held out of training")
    assert "Eq. 3" in both and "§5.1" in both and "§5.1" in fedms.departure(HELD_OUT)
    assert [r for r in fedms.MAVERICK_RUN_READINGS if fedms.departure(r) is None] == [fedms.PAPER_READING]


def test_share_readings_change_only_the_mavericks_share(params):
    """1/N of 50 clients is 0.02; 10 % is 0.1; everything else is the held-out reading's FedAvg run (Dir(1))."""
    by = {(s, r): c for s, r, c in fedms.maverick_reading_configs(params)}
    base = by[("Dir(1)", HELD_OUT)]
    for reading, share in (("Mavericks hold 1/N of their class, n_i weights", 0.02),
                           ("Mavericks hold 10 % of their class, n_i weights", 0.1)):
        config = by[("Dir(1)", reading)]
        assert fedms.maverick_share(params, reading) == share
        assert config.resolved()["split"] == {**base.resolved()["split"], "maverick_share": share}
        assert {k: v for k, v in config.resolved().items() if k != "split"} == \
            {k: v for k, v in base.resolved().items() if k != "split"}
    assert "maverick_share" not in base.resolved()["split"]  # Table 1's keys are as stored


def test_the_profiles_table1_reading_sets_the_share_for_every_method_and_weights_for_fedavg(params):
    """table1_reading "Mavericks hold 1/N ...": every method runs on share 0.02, on MNIST and CIFAR-10 alike
    (one reading for the table); "uniform weights, validation from the test set": FedAvg becomes
    fedavg_uniform, FedMS keeps its method and the paper's validation; the readings' own configs do not
    move with the profile."""
    share = {**params, "table1_reading": "Mavericks hold 1/N of their class, n_i weights"}
    assert fedms.run_config(share, "Dir(10)", "fedms", 0).resolved()["split"]["maverick_share"] == 0.02
    assert fedms.run_config(share, "Dir(10)", "fedms", 0, cifar10=True).resolved()["split"]["maverick_share"] == 0.02
    by = {(s, r): c for s, r, c in fedms.maverick_reading_configs(params)}
    assert fedms.run_config(share, "Dir(1)", "fedavg", 0).key() == \
        by[("Dir(1)", "Mavericks hold 1/N of their class, n_i weights")].key()
    uniform = {**params, "table1_reading": "uniform weights, validation from the test set"}
    fedavg, fedms_run = (fedms.run_config(uniform, "Dir(0.1)", m, 0) for m in ("fedavg", "fedms"))
    assert (fedavg.method.name, fedavg.server_val, fedavg.test_samples) == ("fedavg_uniform", None, 8000)
    assert fedms_run.key() == fedms.run_config(params, "Dir(0.1)", "fedms", 0).key()
    for profile in (share, uniform):
        assert [c.key() for *_, c in fedms.maverick_reading_configs(profile)] == [c.key() for c in by.values()]
    assert fedms.maverick_split(params, "Dir(0.1)", 1.0) == {"name": "maverick", "n_mavericks": 2, "gamma": 0.1}
    with pytest.raises(ValueError, match="^table1_reading: must be one of 'n_i weights, validation from the test"):
        fedms.run_config({**params, "table1_reading": "median"}, "Dir(1)", "fedavg", 0)


def test_the_readings_are_an_experiment_of_the_paper_profile_and_its_queue(params):
    readings = {c.key() for *_, c in fedms.maverick_reading_configs(params)}
    assert "maverick_readings" in params["experiments"]
    assert readings <= {i.key for i in fedms.runs(params)} and readings <= {c.key() for c in fedms.configs(params)}
    without = {**params, "experiments": ["table1"]}  # the smoke and quick builds do not run them
    assert "Maverick readings" not in {i.table for i in fedms.runs(without)}
    assert len(readings - {c.key() for c in fedms.configs(without)}) == 15  # all but Table 1's 3 FedAvg runs
    assert "maverick_readings" not in load_profile("fedms", "quick")["experiments"]


def test_maverick_class_accuracy_by_hand():
    """3 clients x 4 classes; the Maverick (client 2) alone holds class 3, and also holds class 0:
    only class 3 counts, at 25 %."""
    run = RunResult(config={}, history=[], final={"accuracy": 0.7, "per_class_accuracy": [0.9, 0.8, 0.7, 0.25]},
                    meta={"client_roles": ["benign", "benign", "maverick"],
                          "client_class_counts": [[5, 5, 5, 0], [5, 5, 5, 0], [3, 0, 0, 7]]})
    assert fedms.maverick_class_accuracy(run) == pytest.approx(25.0)


def test_reading_score_by_hand():
    run = _run([0.5, 0.6, 0.7, 0.8])
    assert fedms.reading_score(run, 1) == pytest.approx(80.0)
    assert fedms.reading_score(run, 2) == pytest.approx(75.0)
    assert fedms.reading_score(run, None) == pytest.approx(65.0)


def test_calibration_picks_the_smallest_mean_gap_among_permitted_readings_by_hand(params):
    """Paper FedAvg: 79.13 / 79.00 / 74.55. The paper's reading ends at 96 % after 90 % rounds: last round
    gaps 16.87 + 17.00 + 21.45 -> mean 18.44; uniform weights sit at 80 % in every round: gaps 0.87, 1.00,
    5.45 -> mean 2.44, nearer, but uniform weights contradict Eq. 3, so it is shown and never chosen."""
    rows = fedms.maverick_reading_configs(params)
    results = {}
    for split, reading, config in rows:
        if reading == fedms.PAPER_READING:
            results[config.key()] = _run([0.9] * 9 + [0.96])
        elif reading == "uniform weights, validation held out of training":
            results[config.key()] = _run([0.8] * 10)
    frame, chosen = fedms_analysis.calibrate_maverick_readings(params, results, load_reference("fedms"))
    first = frame.loc[(fedms.PAPER_READING, "last round")]
    assert first["mean |ours − paper|"] == pytest.approx((16.87 + 17.0 + 21.45) / 3)
    assert frame.loc[(fedms.PAPER_READING, "mean of the last 10 rounds"), "Dir(10) ours"] == pytest.approx(90.6)
    uniform = frame.loc["uniform weights, validation held out of training"]
    assert uniform["mean |ours − paper|"].tolist() == pytest.approx([(0.87 + 1.0 + 5.45) / 3] * 3)
    assert uniform["departs from"].str.contains("Eq. 3").all() and first["departs from"] == "—"
    assert chosen == (fedms.PAPER_READING, "mean of the last 10 rounds")  # 90.6, tied with all rounds: the first
    assert np.isnan(frame.loc[(HELD_OUT, "last round"), "mean |ours − paper|"])
    _, none = fedms_analysis.calibrate_maverick_readings(params, {}, load_reference("fedms"))
    assert none is None
    only_deviations = {k: v for k, v in results.items() if k not in {c.key() for _, r, c in rows
                                                                      if r == fedms.PAPER_READING}}
    assert fedms_analysis.calibrate_maverick_readings(params, only_deviations, load_reference("fedms"))[1] is None


def test_the_page_shows_every_candidate_and_says_which_have_no_run(params, monkeypatch):
    """Stored: the paper's reading on all three splits at 80 % in every round (Maverick classes at 0 %).
    Gaps 0.87 / 1.00 / 5.45 -> mean 2.44, chosen (last round, the first of its ties); the paper profile
    reads Table 1 that way, so the page says so."""
    from fedlib.app.chapters.fedms import FedMS

    reading = fedms.PAPER_READING
    meta = {"client_roles": ["benign", "maverick"], "client_class_counts": [[5, 0], [1, 4]]}
    run = RunResult(config={}, history=[{"round": t, "accuracy": 0.8} for t in range(10)],
                    final={"accuracy": 0.8, "per_class_accuracy": [1.0, 0.0]}, meta=meta)
    stored = {c.key(): run for _, r, c in fedms.maverick_reading_configs(params) if r == reading}
    monkeypatch.setattr(fedms_page, "stored_results", lambda chapter, configs: Stored(stored, {}, []))
    chapter = FedMS("paper", params)
    chapter.paper_params = params
    table = chapter.maverick_readings()
    frame, values = table.frame.data, table.values
    assert len(frame) == len(fedms.MAVERICK_RUN_READINGS) * len(fedms.MAVERICK_SCORE_READINGS)
    assert values["mr_runs"] == 3 and values["mr_candidates"] == 18
    assert values["mr_chosen"] == f"{reading}, read as the last round"
    assert values["mr_chosen_dir10"] == pytest.approx(80.0) and values["mr_chosen_gap"] == pytest.approx(2.44)
    assert values["mr_protocol"].startswith("it is the paper profile's protocol")
    line = frame.loc[(reading, "last round")]
    assert line["Dir(10) ours (paper 79.13)"] == "80.00" and line["Dir(0.1) Maverick classes, last round (%)"] == "0.00"
    assert line["chosen"] and frame["chosen"].sum() == 1
    assert frame.loc[("uniform weights, validation from the test set", "last round"),
                     "Dir(1) ours (paper 79.00)"] == "no stored run yet"
    chapter.paper_params = {**params, "table1_score": "mean over all rounds"}
    assert chapter.maverick_readings().values["mr_protocol"].startswith("it lands within 3 points of the paper on Dir(10)")
    assert values["mr_chosen_mav"] == pytest.approx(0.0) and values["mr_runner_up"] == "none"  # one run reading
    monkeypatch.setattr(fedms_page, "stored_results", lambda chapter, configs: Stored({}, {}, []))
    table = chapter.maverick_readings()
    empty = table.values
    assert table.frame is None and table.note.startswith("No stored FedAvg run of any reading yet")
    assert empty["mr_runs"] == 0 and empty["mr_chosen"] == "none (no candidate has a run)"
    assert empty["mr_protocol"] == "the protocol stays as it was" and np.isnan(empty["mr_chosen_gap"])


def test_the_page_names_the_best_candidate_of_another_run_reading(params, monkeypatch):
    """The paper's reading at 80 % in every round (mean gap 2.44) and uniform weights at 79 % (gaps 0.13, 0,
    4.45 -> 1.527): uniform is nearer but contradicts Eq. 3, so the paper's reading is chosen and uniform
    is the runner-up; Maverick classes 0 % (paper's) and 50 % (uniform)."""
    from fedlib.app.chapters.fedms import FedMS

    def run(accuracy, maverick_class):
        return RunResult(config={}, history=[{"round": t, "accuracy": accuracy} for t in range(10)],
                         final={"accuracy": accuracy, "per_class_accuracy": [1.0, maverick_class]},
                         meta={"client_roles": ["benign", "maverick"], "client_class_counts": [[5, 0], [1, 4]]})

    paper, uniform = fedms.PAPER_READING, "uniform weights, validation held out of training"
    stored = {c.key(): run(0.8, 0.0) if r == paper else run(0.79, 0.5)
              for _, r, c in fedms.maverick_reading_configs(params) if r in (paper, uniform)}
    monkeypatch.setattr(fedms_page, "stored_results", lambda chapter, configs: Stored(stored, {}, []))
    chapter = FedMS("paper", params)
    chapter.paper_params = params
    values = chapter.maverick_readings().values
    assert values["mr_chosen"] == f"{paper}, read as the last round" and values["mr_chosen_gap"] == pytest.approx(2.44)
    assert values["mr_runner_up"] == f"{uniform}, read as the last round"
    assert values["mr_runner_up_gap"] == pytest.approx((0.13 + 0 + 4.45) / 3)
    assert (values["mr_chosen_mav"], values["mr_runner_up_mav"]) == (pytest.approx(0.0), pytest.approx(50.0))


def test_table1_score_reads_runs_as_the_profile_says(params):
    run = _run([0.5, 0.6, 0.7, 0.8])
    assert fedms.table1_score(params) is None  # the paper profile without table1_score: the final accuracy
    assert fedms.table1_score({**params, "table1_score": "mean of the last 10 rounds"})(run) == pytest.approx(65.0)
    one = fedms.table1_score({**params, "table1_score": "mean over all rounds"}, cifar10=True)
    assert one(run) == pytest.approx(65.0)  # one score for MNIST and CIFAR-10 alike
    with pytest.raises(ValueError, match="^table1_score: must be one of 'last round', "):
        fedms.table1_score({**params, "table1_score": "best round"})


def test_cifar10_readings_change_only_what_they_name_and_stay_on_the_screens_validation(params):
    """The CIFAR-10 screen (a model recipe, issue 30) was run under the held-out validation reading and
    stays on it: its first reading is FedAvg's Table 1 run under that reading, not the paper's."""
    rows = fedms.cifar10_reading_configs(params)
    assert len(rows) == len(params["cifar10_splits"]) * len(fedms.CIFAR10_READINGS)
    assert len({c.key() for *_, c in rows}) == len(rows)
    by = {(s, r): c for s, r, c in rows}
    table1 = fedms.run_config({**params, "table1_reading": HELD_OUT}, "Dir(10)", "fedavg", params["seeds"][0],
                              cifar10=True)
    assert table1.key() != fedms.run_config(params, "Dir(10)", "fedavg", params["seeds"][0], cifar10=True).key()
    assert by[("Dir(10)", "no augmentation, no weight decay")].key() == table1.key()
    both = by[("Dir(10)", "crop + flip, weight decay 5e-4")]
    assert both.augment == "crop_flip" and both.weight_decay == 5e-4
    assert both.model_copy(update={"augment": None, "weight_decay": 0.0}).resolved() == table1.resolved()
    items = [i for i in fedms.runs(load_profile("fedms", "paper")) if i.table == "CIFAR-10 readings"]
    assert len(items) == len(rows) and all(i.column in fedms.CIFAR10_READINGS for i in items)


def test_cifar10_calibration_by_hand(params):
    """Paper FedAvg CIFAR-10: 63.36 / 61.52 / 48.68 on Dir(10) / Dir(1) / Dir(0.1). The protocol so far ends
    at 54 % on Dir(10) and Dir(1) (gaps 9.36, 7.52 -> 8.44); crop + flip at 62 % on Dir(10) only (gap 1.36):
    fewer splits measured, so not yet comparable; weight decay at 60 % on both (3.36, 1.52 -> 2.44): chosen."""
    rows = fedms.cifar10_reading_configs(params)
    finals = {"no augmentation, no weight decay": 0.54, "weight decay 5e-4": 0.60}
    results = {c.key(): _run([0.3, finals[r]]) for s, r, c in rows if r in finals and s != "Dir(0.1)"}
    results.update({c.key(): _run([0.62]) for s, r, c in rows if r == "crop + flip" and s == "Dir(10)"})
    frame, chosen = fedms_analysis.calibrate_cifar10_readings(params, results, load_reference("fedms"))
    assert frame.loc["no augmentation, no weight decay", "mean |ours − paper|"] == pytest.approx((9.36 + 7.52) / 2)
    assert frame.loc["crop + flip", "mean |ours − paper|"] == pytest.approx(1.36)
    assert frame.loc["weight decay 5e-4", "mean |ours − paper|"] == pytest.approx((3.36 + 1.52) / 2)
    assert chosen == "weight decay 5e-4"
    assert fedms_analysis.calibrate_cifar10_readings(params, {}, load_reference("fedms"))[1] is None


def test_an_adopted_cifar10_reading_sets_every_cifar10_run_and_the_screen_keeps_its_keys(params):
    """Issue 30 point 2: ``cifar10_reading`` puts the chosen recipe in every CIFAR-10 Table 1 run, the
    screen's runs keep their keys (each reading still changes the original recipe, under the screen's
    held-out validation), so the screen's wider-CNN FedAvg run is Table 1's FedAvg run under that
    validation reading once the recipe is adopted; MNIST runs are untouched."""
    from fedlib.app.chapters import readings

    wide = "wider CNN (32, 64 channels; FC 512, 128)"
    adopted = {**params, "cifar10_reading": wide}
    assert [c.key() for *_, c in fedms.cifar10_reading_configs(adopted)] == [
        c.key() for *_, c in fedms.cifar10_reading_configs(params)]
    screen = {(s, r): c for s, r, c in fedms.cifar10_reading_configs(params)}
    for split in params["cifar10_splits"]:
        fedavg = fedms.run_config({**adopted, "table1_reading": HELD_OUT}, split, "fedavg", params["seeds"][0],
                                  cifar10=True)
        assert fedavg.key() == screen[(split, wide)].key() != screen[(split, readings.ORIGINAL)].key()
    assert fedms.run_config(adopted, "Dir(1)", "fedms", 2, cifar10=True).model == "cnn_wide"
    assert fedms.run_config(params, "Dir(1)", "fedms", 2, cifar10=True).model == "cnn"
    assert fedms.run_config(adopted, "Dir(1)", "fedms", 2).key() == fedms.run_config(params, "Dir(1)", "fedms", 2).key()
    with pytest.raises(ValueError, match="^cifar10_reading: must be one of 'no augmentation, no weight decay', "):
        fedms.run_config({**params, "cifar10_reading": "wide"}, "Dir(1)", "fedavg", 0, cifar10=True)


def test_the_page_says_whether_the_profile_uses_the_rules_choice(params, monkeypatch):
    """The sentence after the screen: not yet adopted while a candidate lacks a run on a split; adopted
    once the profile names it; and the earlier recipe's Table 1 runs are shown apart, as stale."""
    from fedlib.app.chapters import readings

    wide = "wider CNN (32, 64 channels; FC 512, 128)"
    rows = fedms.cifar10_reading_configs(params)
    finals = {readings.ORIGINAL: 0.54, wide: 0.57}
    stored = {c.key(): _run([finals.get(r, 0.2)]) for s, r, c in rows if r in finals or s != "Dir(1)"}
    earlier_fedms = fedms.run_config({**params, "table1_reading": HELD_OUT}, "Dir(1)", "fedms", 0, cifar10=True)
    stored[earlier_fedms.key()] = _run([0.5])
    monkeypatch.setattr(fedms_page, "stored_results", lambda chapter, configs: Stored(
        {c.key(): stored[c.key()] for c in configs if c.key() in stored}, {}, []))
    for profile, expected in ((params, "not every candidate has a run on every split yet"),
                              ({**params, "cifar10_reading": wide}, "the paper profile uses it")):
        chapter = FedMS("paper", profile)
        chapter.paper_params = profile
        monkeypatch.setattr(chapter, "cifar_note", lambda: "CIFAR-10")
        values = chapter.cifar10_readings().values
        assert values["cr_chosen"] == wide and values["cr_protocol"].startswith(expected)
        stale = chapter.table1_cifar10_earlier()
        earlier, table = stale.frame, stale.values
        if profile is params:  # the original recipe, validation held out of training: FedAvg (3 splits), FedMS
            assert table["t1c_earlier_n"] == 4
            cell = earlier.loc[("CIFAR-10 Mavericks + Dir(1)",
                                "stored paper profile, validation held out of training (stale)"), "FedMS"]
            assert cell.startswith("50.00")
        else:  # the original recipe's FedAvg (3 splits) and FedMS (Dir(1)) runs, stale
            # plus the wider CNN's 3 screen runs, under the held-out validation: 4 + 3
            assert table["t1c_earlier_n"] == 7 and table["t1c_recipe"] == wide
            cell = earlier.loc[("CIFAR-10 Mavericks + Dir(1)", "stored paper profile, earlier recipe (stale)"), "FedMS"]
            assert cell.startswith("50.00")


def test_the_fedms_precision_screen_pairs_table1s_fedavg_runs_and_keys_each_precision_apart(monkeypatch):
    """Issue 45 on the FedMS page: the screen's arms are Table 1's CIFAR-10 FedAvg run on Dir(10) in each
    precision, keyed apart; ``cifar10_precision`` puts the adopted one in every CIFAR-10 run (MNIST stays
    float32); the page applies the shared rule to the stored pairs and names the profile file."""
    from fedlib.app.chapters import precisions

    paper = load_profile("fedms", "paper")
    rows = fedms.precision_screen_configs(paper)
    assert [(p, c.seed) for p, c in rows] == [(p, s) for s in paper["seeds"] for p in ("float32", "bfloat16")]
    assert {c.method.name for _, c in rows} == {"fedavg"} and {c.split.params["gamma"] for _, c in rows} == {10.0}
    assert len({c.key() for _, c in rows}) == 6 and [c.precision for _, c in rows[:2]] == ["float32", "bfloat16"]
    adopted = {**paper, "cifar10_precision": "bfloat16"}
    for precision, config in rows:  # the arms keep their keys whichever precision the profile adopts
        declared = {**paper, "cifar10_precision": precision}
        assert fedms.run_config(declared, "Dir(10)", "fedavg", config.seed, cifar10=True).key() == config.key()
    assert [c.key() for _, c in fedms.precision_screen_configs(adopted)] == [c.key() for _, c in rows]
    assert fedms.run_config(adopted, "Dir(1)", "fedms", 0, cifar10=True).precision == "bfloat16"
    assert fedms.run_config(adopted, "Dir(1)", "fedms", 0).precision == "float32"
    with pytest.raises(ValueError, match="^cifar10_precision: must be one of 'float32', 'bfloat16'"):
        fedms.run_config({**paper, "cifar10_precision": "fp16"}, "Dir(1)", "fedavg", 0, cifar10=True)
    items = [i for i in fedms.runs(paper) if i.table == "Precision screen"]
    assert sorted(i.config.key() for i in items) == sorted(c.key() for _, c in rows)

    finals = {("float32", 0): 0.70, ("bfloat16", 0): 0.702, ("float32", 1): 0.69, ("bfloat16", 1): 0.693,
              ("float32", 2): 0.71, ("bfloat16", 2): 0.709}
    stored = {c.key(): RunResult(config={}, history=[], final={"accuracy": finals[(p, c.seed)]}, meta={"device": "cpu"})
              for p, c in rows}
    monkeypatch.setattr(fedms_page, "stored_results", lambda chapter, configs: Stored(stored, {}, []))
    chapter = FedMS("paper", paper)
    table = chapter.precision_screen()
    # differences +0.2, +0.3, -0.1 points: mean 0.1333, sd 0.2082, t(0.975, 2) 4.3027 -> ±0.5172
    assert list(table.frame.data["bfloat16 − float32"].round(6)) == [0.2, 0.3, -0.1]
    assert table.values["ps_rule"] == "bfloat16" and table.values["ps_adopted"] == "float32"
    assert (table.values["ps_lo"], table.values["ps_hi"]) == pytest.approx((0.1333 - 0.5172, 0.1333 + 0.5172), abs=1e-3)
    assert "params/fedms/paper.yaml) but the rule says bfloat16" in table.values["ps_protocol"]
    assert precisions.screen(rows[:2], stored, "float32", "params/fedms/paper.yaml")[1]["ps_verdict"].startswith(
        "indicative (1 paired seed)")
