"""The interactive explorer driven from Python, its figures, and the book's explore notebook."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("ipywidgets")  # the book extra, not the test extra
nbformat = pytest.importorskip("nbformat")

from fedlib.app.widgets import Explorer  # noqa: E402
from fedlib.plots import accuracy_curves, contribution_bars, final_contributions  # noqa: E402
from fedlib.run import RunResult  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[2] / "book" / "explore.ipynb"
SMALL = dict(dataset="synthetic", fraction=1.0, test_samples=None, batch_size=64, rounds=3, n_clients=4)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def explorer():
    return Explorer(**SMALL)


def _set(explorer, **values):
    for name, value in values.items():
        explorer.controls[name].value = value


def test_run_compares_the_selected_methods_and_redraws(explorer):
    _set(explorer, split="dirichlet", alpha=0.3, n_clients=4, methods=("fedavg", "fedavg_uniform"))
    explorer.button.click()
    assert list(explorer.results) == ["fedavg", "fedavg_uniform"]
    for method, result in explorer.results.items():
        assert result.config["method"]["name"] == method
        assert result.config["split"] == {"name": "dirichlet", "alpha": explorer.controls["alpha"].value}
        assert len(result.history) == 3 and len(result.meta["client_sizes"]) == 4
    assert explorer.progress.value == explorer.progress.max == 6
    assert explorer.status.value.startswith("Done") and "fedavg_uniform" in explorer.status.value
    assert set(explorer.figures) == {"split", "accuracy", "contribution"}
    assert len(explorer.figures["accuracy"].axes[0].get_lines()) == 2
    assert len(explorer.figures["split"].axes[2].patches) == 4  # per-client marginal bars
    assert [list(o["data"]) for o in explorer.output.outputs] == [["image/png", "text/plain"]] * 3

    first_split = explorer.figures["split"]
    _set(explorer, n_clients=6, methods=("fedavg",))
    explorer.run()
    assert list(explorer.results) == ["fedavg"] and explorer.progress.value == 3
    assert explorer.figures["split"] is not first_split
    assert len(explorer.figures["split"].axes[2].patches) == 6
    assert len(explorer.figures["accuracy"].axes[0].get_lines()) == 1
    assert len(explorer.figures["contribution"].axes[0].patches) == 6  # synthetic data: no exact Shapley beside


def test_an_identical_run_comes_from_the_cache(explorer):
    explorer.run()
    first = {method: result.to_dict() for method, result in explorer.results.items()}
    explorer.run()
    assert {method: result.to_dict() for method, result in explorer.results.items()} == first  # same wall time
    assert explorer.progress.value == explorer.progress.max


@pytest.mark.parametrize(
    "values, expected",
    [
        (dict(split="maverick", n_clients=3, n_mavericks=5), "n_mavericks must be in"),
        (dict(split="adversarial", n_clients=5), "makes 57 clients"),
        (dict(dataset="mnist"), "mnist"),
        (dict(methods=()), "Select at least one method"),
    ],
)
def test_bad_input_shows_one_line_in_the_status(explorer, values, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "no-data"))
    monkeypatch.setenv("FEDLIB_DOWNLOAD", "0")
    _set(explorer, **values)
    explorer.run()  # must not raise
    assert expected in explorer.status.value and "\n" not in explorer.status.value
    assert explorer.results == {} and explorer.figures == {}
    assert not explorer.button.disabled


@pytest.mark.parametrize(
    "split, visible",
    [("iid", set()), ("dirichlet", {"alpha"}), ("k_classes", {"k"}), ("maverick", {"gamma", "n_mavericks"})],
)
def test_choosing_a_split_shows_only_its_parameters(explorer, split, visible):
    explorer.controls["split"].value = split
    parameters = ("alpha", "gamma", "k", "n_mavericks")
    shown = {name for name in parameters if explorer.controls[name].layout.display != "none"}
    assert shown == visible
    assert {key for key in explorer.config("fedavg")["split"] if key != "name"} == visible


def test_other_config_fields_are_fixed_for_every_run():
    config = Explorer(lr=0.05, fraction=0.5, split="k_classes", k=3, methods=["fedprox"]).config("fedprox")
    assert config["lr"] == 0.05 and config["fraction"] == 0.5 and config["method"] == "fedprox"
    assert config["split"] == {"name": "k_classes", "k": 3}


def _result(history, roles, method="fedavg"):
    meta = {"client_sizes": [10] * len(roles), "client_roles": roles}
    return RunResult(config={"method": {"name": method}}, history=history, final={}, meta=meta)


def test_final_contributions_use_scores_else_similarity_normalized():
    roles = ["benign", "benign", "maverick", "free_rider"]
    # no scores: FLCE §4.1.3's rule, similarity shares of the aggregated clients summed over rounds
    similar = _result([{"round": 0, "aggregated": [0, 2], "similarity": [0.2, 0.6]},
                       {"round": 1, "aggregated": [0, 1], "similarity": [0.5, -0.1]}], roles)
    scored = _result([{"round": 0, "aggregated": [0], "similarity": [1.0], "scores": [1.0, 1.0, 2.0, 0.0]}],
                     roles, method="celm")
    np.testing.assert_allclose(final_contributions(similar), [1.25 / 2, 0, 0.75 / 2, 0])
    np.testing.assert_allclose(final_contributions(scored), [0.25, 0.25, 0.5, 0])

    fig = contribution_bars({"similarity": similar, "scores": scored})
    ax = fig.axes[0]
    assert len(ax.patches) == 8  # 4 clients x 2 methods
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2\nmaverick", "3\nfree_rider"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["equal share", "similarity", "scores"]


def test_accuracy_curves_draw_one_percent_line_per_label():
    runs = {
        name: _result([{"round": r, "accuracy": acc} for r, acc in enumerate(accs)], ["benign"])
        for name, accs in {"a": [0.1, 0.5], "b": [0.2, 0.6]}.items()
    }
    ax = accuracy_curves(runs).axes[0]
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["a", "b"]
    np.testing.assert_allclose(lines[1].get_xydata(), [[1, 20], [2, 60]])


def test_notebook_is_stored_without_outputs_and_has_parameters():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
    tagged = [cell for cell in code if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1
    parameters: dict = {}
    exec(tagged[0].source, parameters)
    assert parameters["profile"] == "quick" and parameters["rounds"] <= 10


def test_papermill_run_saves_the_widget_state(tmp_path):
    papermill = pytest.importorskip("papermill")
    out = tmp_path / "explore.ipynb"
    papermill.execute_notebook(str(NOTEBOOK), str(out), parameters=dict(dataset="synthetic", rounds=2),
                               cwd=str(NOTEBOOK.parents[1]), progress_bar=False)
    state = json.loads(out.read_text())["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]
    models = {model["model_name"]: model["state"] for model in state["state"].values()}
    assert models["LabelModel"]["value"].startswith("Done")
    assert len(models["OutputModel"]["outputs"]) == 3


def test_small_federations_also_compute_the_true_contribution():
    assert Explorer(n_clients=5).config("fedavg")["reference_values"] is True
    assert Explorer(n_clients=40).config("fedavg")["reference_values"] is False  # 2^40 coalitions
    assert Explorer(n_clients=5, dataset="synthetic").config("fedavg")["reference_values"] is False


# ------------------------------------------------------------------- the served explorer (issue 43, point 6)


def _parsed_voila_app(folder):
    """Voilà's own app, reading the explorer's command line and private config file."""
    voila_app = pytest.importorskip("voila.app")
    from fedlib.app import explore

    app = voila_app.Voila()
    app.parse_command_line(explore.voila_command(9999, folder)[1:])
    app.load_config_file("voila", path=app.config_file_paths)
    return app


def test_the_explorer_caps_its_kernels_and_sends_no_referrer():
    """The generated configuration, read back by Voilà: a kernel manager that keeps at most MAX_KERNELS
    kernels (one per browser connection, the oldest shut down first, idle ones culled) and pages with
    ``Referrer-Policy: no-referrer`` (the token in the URL leaks through no Referer header)."""
    pytest.importorskip("voila.app")
    import shutil

    from voila.configuration import VoilaConfiguration
    from voila.voila_kernel_manager import voila_kernel_manager_factory

    from fedlib.app import explore

    config = explore.voila_config("t" * 43)
    assert config["Voila"]["tornado_settings"]["headers"] == {"Referrer-Policy": "no-referrer"}
    assert config["VoilaConfiguration"] == {"multi_kernel_manager_class": "fedlib.app.explore.CappedKernelManager"}
    assert config["CappedKernelManager"] == {"max_kernels": explore.MAX_KERNELS} and 2 <= explore.MAX_KERNELS <= 3
    folder = explore.write_config("t" * 43)
    try:
        app = _parsed_voila_app(folder)
    finally:
        shutil.rmtree(folder)
    assert app.tornado_settings["headers"] == {"Referrer-Policy": "no-referrer"}
    assert app.tornado_settings["allow_remote_access"] is False
    voila_config = VoilaConfiguration(parent=app)
    assert voila_config.multi_kernel_manager_class is explore.CappedKernelManager
    assert voila_config.preheat_kernel is False  # no pool of kernels started ahead of the pages
    manager_class = voila_kernel_manager_factory(voila_config.multi_kernel_manager_class, False, 0)
    manager = manager_class(parent=app)  # as Voilà builds it
    assert isinstance(manager, explore.CappedKernelManager) and manager.max_kernels == explore.MAX_KERNELS
    assert manager.cull_idle_timeout == explore.CULL_IDLE_S and manager.cull_connected is False


class _FakeKernels:
    """The part of a kernel manager that ``make_room`` uses, without kernels."""

    def __init__(self, ids):
        import logging

        self.ids, self.shut, self.log = list(ids), [], logging.getLogger("fake-kernels")

    def list_kernel_ids(self):
        return list(self.ids)

    async def shutdown_kernel(self, kernel_id, now=False):
        assert now is True
        self.ids.remove(kernel_id)
        self.shut.append(kernel_id)


def test_making_room_shuts_the_oldest_kernels_down_first():
    import asyncio

    from fedlib.app.explore import make_room

    kernels, order = _FakeKernels(["a", "b", "c"]), ["a", "b", "c"]
    assert asyncio.run(make_room(kernels, order, 3)) == ["a"] and order == ["b", "c"] and kernels.ids == ["b", "c"]
    assert asyncio.run(make_room(kernels, order, 3)) == [] and kernels.shut == ["a"]  # room for one more already
    kernels.ids.remove("b")  # closed by its page (Voilà shut it down): forgotten, not shut twice
    kernels.ids.append("x")  # started by someone else: counted, as the newest unknown
    assert asyncio.run(make_room(kernels, order, 2)) == ["c"] and order == ["x"]
    assert asyncio.run(make_room(kernels, order, 1)) == ["x"] and kernels.ids == [] and order == []


def test_the_capped_kernel_manager_shuts_the_oldest_real_kernel_down():
    """Three kernels started with room for two: the first is gone, the other two run."""
    pytest.importorskip("jupyter_server")
    pytest.importorskip("ipykernel")
    import asyncio

    from fedlib.app.explore import CappedKernelManager

    manager = CappedKernelManager(max_kernels=2)

    async def start_three():
        started = [await manager.start_kernel(kernel_name="python3") for _ in range(3)]
        running = manager.list_kernel_ids()
        await manager.shutdown_all(now=True)
        return started, running

    started, running = asyncio.run(start_three())
    assert sorted(running) == sorted(started[1:]) and started[0] not in running


@pytest.mark.parametrize("port", [70000, 0, -1, "x", 65536, 1.5])
def test_serving_on_a_bad_port_is_refused_in_one_line(port, capsys):
    from fedlib.app import explore

    never = ["/bin/sh", "-c", "echo started >&2; exit 3"]  # would print if a server were started
    assert explore.serve(port, command=never) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedlib explore: --port: must be an integer in [1, 65535] (got ") and err.count("\n") == 1
    assert "started" not in err
