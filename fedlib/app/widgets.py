"""An interactive explorer: choose a split, a federation and methods, press Run, compare.

``explore()`` shows ipywidgets controls (dataset, split and its parameter, number of
clients, rounds, methods, seed), a Run button with a progress bar and a status line,
and below them the figures of the last Run: the split's bubble plot, the methods'
accuracy curves and their final-round contributions. Runs go through fedlib's result
cache, so repeating a Run is instant. The callbacks are Python and need a live kernel;
a saved notebook keeps the widgets' last state (figures included) for static pages.
"""

from __future__ import annotations

import base64
import io
import time

import ipywidgets as widgets
from IPython.display import display
from matplotlib.figure import Figure

from ..cache import ResultCache
from ..config import ConfigError, RunConfig, make_config
from ..data import DATASETS, Dataset, load_dataset
from ..data_files import DataCorruptError, DataNotFoundError
from ..methods import METHODS
from ..plots import accuracy_curves, bubble_plot, contribution_bars
from ..run import SPLITS, RunResult
from ..run import run as run_experiment

__all__ = ["SPLIT_PARAMETERS", "Explorer", "explore"]

SPLIT_PARAMETERS = {  # split -> its parameters that have a control (others keep defaults)
    "dirichlet": ("alpha",),
    "k_classes": ("k",),
    "maverick": ("n_mavericks", "gamma"),
    "celm_maverick": ("n_mavericks",),
    "adversarial": ("n_mavericks", "gamma"),
}
_PARAMETER_CONTROLS = ("alpha", "gamma", "k", "n_mavericks")

_CONTROL_DEFAULTS = dict(dataset="fmnist", split="dirichlet", alpha=0.5, gamma=0.5, k=2, n_mavericks=1,
                         n_clients=5, rounds=5, methods=("fedavg", "fedavg_uniform"), seed=0)
_FIXED_DEFAULTS = dict(fraction=0.1, test_samples=2000, batch_size=64)  # a Run takes seconds on a CPU

REFERENCE_MAX_CLIENTS = 10  # up to this many clients, runs also compute the final round's exact Shapley values
_NO_REFERENCE_DATASETS = ("synthetic",)  # 200 samples: no room for the 1,000-sample validation set it needs

_INPUT_ERRORS = (ConfigError, DataNotFoundError, DataCorruptError)  # shown as one line, not raised


class Explorer:
    """Controls for one comparison, a Run button, progress, and the figures of the last Run.

    Keyword arguments set the controls' initial values (``dataset``, ``split`` (a name),
    ``alpha``, ``gamma``, ``k``, ``n_mavericks``, ``n_clients``, ``rounds``, ``methods``,
    ``seed``); any other RunConfig field (``fraction``, ``test_samples``, ``batch_size``,
    ``lr``, ``model``, ...) is fixed for every run. After a successful Run, ``results``
    maps each method to its RunResult and ``figures`` holds the "split", "accuracy" and
    "contribution" Figures; a failed Run leaves both as they were.
    """

    def __init__(self, **defaults):
        initial = {**_CONTROL_DEFAULTS, **{k: v for k, v in defaults.items() if k in _CONTROL_DEFAULTS}}
        self.fixed = {**_FIXED_DEFAULTS, **{k: v for k, v in defaults.items() if k not in _CONTROL_DEFAULTS}}
        self.controls = _make_controls(initial)
        self.button = widgets.Button(description="Run", button_style="primary", icon="play")
        self.progress = widgets.IntProgress(value=0, min=0, max=1)
        self.status = widgets.Label("Choose a split and methods, then press Run.")
        self.output = widgets.Output()
        self.results: dict[str, RunResult] = {}
        self.figures: dict[str, Figure] = {}
        self._loaded: tuple[tuple, Dataset] | None = None  # (dataset, data root) and its tensors
        self.button.on_click(lambda _button: self.run())
        self.controls["split"].observe(lambda _change: self._show_split_parameters(), names="value")
        self._show_split_parameters()
        self.widget = self._layout()

    def config(self, method: str) -> dict:
        """The run config (a dict) that the controls describe, for one method."""
        c = self.controls
        split = c["split"].value
        return {
            **self.fixed,
            "dataset": c["dataset"].value,
            "split": {"name": split, **{name: c[name].value for name in SPLIT_PARAMETERS.get(split, ())}},
            "n_clients": c["n_clients"].value,
            "rounds": c["rounds"].value,
            "seed": c["seed"].value,
            "method": method,
            # the true contribution beside the methods' (exact Shapley: 2^N coalitions, small N only)
            "reference_values": (c["n_clients"].value <= REFERENCE_MAX_CLIENTS
                                 and c["dataset"].value not in _NO_REFERENCE_DATASETS),
        }

    def run(self) -> None:
        """What the Run button does: run each selected method, then redraw the figures.

        Bad input (a config error, missing data) shows its one-line message in the status
        label instead of raising.
        """
        methods = list(self.controls["methods"].value)
        if not methods:
            self.status.value = "Select at least one method."
            return
        self.progress.max = self.controls["rounds"].value * len(methods)
        self.progress.value = 0
        self.progress.bar_style = "info"
        self.button.disabled = True
        started = time.perf_counter()
        try:
            results = {method: self._run_method(method) for method in methods}
        except _INPUT_ERRORS as error:
            self.progress.bar_style = "danger"
            self.status.value = f"⚠ {str(error).splitlines()[0]}"
            return
        finally:
            self.button.disabled = False
        self.results = results
        self.figures = _draw(results)
        self.output.outputs = tuple(_png_output(fig, name) for name, fig in self.figures.items())
        self.progress.bar_style = "success"
        self.status.value = _summary(results, time.perf_counter() - started)

    # -- internals -------------------------------------------------------------------
    def _run_method(self, method: str) -> RunResult:
        """One run through the cache, advancing the progress bar by its rounds."""
        config = make_config(self.config(method))
        store = ResultCache()
        dataset = None if config.key() in store else self._dataset(config)
        start = self.progress.value

        def on_round(record: dict) -> None:
            self.progress.value += 1
            accuracy = f", accuracy {record['accuracy']:.1%}" if "accuracy" in record else ""
            self.status.value = f"{method}: round {record['round'] + 1}/{config.rounds}{accuracy}"

        self.status.value = f"{method}: starting"
        result = run_experiment(config, cache=store, progress=False, dataset=dataset, on_round=on_round)
        self.progress.value = start + config.rounds  # cached or stopped runs jump to the end
        return result

    def _dataset(self, config: RunConfig) -> Dataset:
        """The config's dataset, loaded once and reused while it stays selected."""
        source = (config.dataset, config.data_root)
        if self._loaded is None or self._loaded[0] != source:
            self._loaded = (source, load_dataset(config.dataset, root=config.data_root))
        return self._loaded[1]

    def _show_split_parameters(self) -> None:
        """Show only the parameter controls of the chosen split."""
        relevant = SPLIT_PARAMETERS.get(self.controls["split"].value, ())
        for name in _PARAMETER_CONTROLS:
            self.controls[name].layout.display = None if name in relevant else "none"

    def _layout(self) -> widgets.VBox:
        c = self.controls
        return widgets.VBox([
            widgets.HBox([c["dataset"], c["split"]]),
            widgets.HBox([c[name] for name in _PARAMETER_CONTROLS]),
            widgets.HBox([c["n_clients"], c["rounds"], c["seed"]]),
            widgets.HBox([c["methods"], widgets.VBox([self.button, self.progress, self.status])]),
            self.output,
        ])


def explore(**defaults) -> Explorer:
    """An :class:`Explorer` with these defaults, displayed (in a notebook) and returned."""
    explorer = Explorer(**defaults)
    display(explorer.widget)
    return explorer


def _make_controls(initial: dict) -> dict[str, widgets.Widget]:
    style = {"description_width": "initial"}
    return {
        "dataset": widgets.Dropdown(options=DATASETS, value=initial["dataset"], description="dataset", style=style),
        "split": widgets.Dropdown(options=SPLITS, value=initial["split"], description="split", style=style),
        "alpha": widgets.FloatLogSlider(value=initial["alpha"], base=10, min=-2, max=2, step=0.1,
                                        description="Dirichlet α", style=style),
        "gamma": widgets.FloatLogSlider(value=initial["gamma"], base=10, min=-2, max=2, step=0.1,
                                        description="Dirichlet γ", style=style),
        "k": widgets.IntSlider(value=initial["k"], min=1, max=10, description="classes per client", style=style),
        "n_mavericks": widgets.IntSlider(value=initial["n_mavericks"], min=0, max=9, description="Mavericks",
                                         style=style),
        "n_clients": widgets.IntSlider(value=initial["n_clients"], min=1, max=100, description="clients",
                                       style=style),
        "rounds": widgets.IntSlider(value=initial["rounds"], min=1, max=50, description="rounds", style=style),
        "methods": widgets.SelectMultiple(options=sorted(METHODS), value=tuple(initial["methods"]),
                                          rows=min(len(METHODS), 6), description="methods", style=style),
        "seed": widgets.BoundedIntText(value=initial["seed"], min=0, max=2**31 - 1, description="seed",
                                       style=style, layout=widgets.Layout(width="10em")),
    }


def _draw(results: dict[str, RunResult]) -> dict[str, Figure]:
    """The split (of the first run: every method shares it), accuracy and contributions."""
    first = next(iter(results.values()))
    return {
        "split": bubble_plot(first.meta["client_class_counts"], first.meta["client_roles"],
                             title=_split_title(first.config)),
        "accuracy": accuracy_curves(results),
        "contribution": contribution_bars(results),
    }


def _split_title(config: dict) -> str:
    """E.g. "dirichlet (alpha = 0.5), 5 clients"."""
    split = dict(config["split"])
    name = split.pop("name")
    params = ", ".join(f"{key} = {value:.3g}" for key, value in split.items())
    return f"{name}{f' ({params})' if params else ''}, {config['n_clients']} clients"


def _summary(results: dict[str, RunResult], seconds: float) -> str:
    """One line: each method's final accuracy (or why it stopped) and the time taken."""
    parts = []
    for method, result in results.items():
        stopped = result.final.get("stopped")
        parts.append(f"{method} stopped ({stopped})" if stopped else f"{method} {result.final['accuracy']:.1%}")
    return f"Done in {seconds:.1f} s. Final test accuracy: {', '.join(parts)}"


def _png_output(fig: Figure, name: str) -> dict:
    """A display_data output, as an Output widget stores it, holding the figure as PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    png = base64.b64encode(buffer.getvalue()).decode("ascii")
    return {"output_type": "display_data", "metadata": {}, "data": {"image/png": png, "text/plain": f"<{name} figure>"}}
