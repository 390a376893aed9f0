"""A chapter's runs as the results queue takes them: :class:`QueueItem` (one run of a chapter's profile and
the paper cells it backs), :func:`items_of` (the items of one table), the runners an item names
(:func:`run_round` for every engine run, :func:`run_scm` for a FedSCM federation) and a run's work
(:func:`work`: its training-sample passes, what the queue's cost model prices and the performance page
counts). The chapters declare their items with these; the queue (``fedlib.app.queue``) orders, costs,
runs and stores them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ...config import RunConfig, ScmConfig
from ...run import run
from ...scm_pipeline import run_pipeline

CPU_DATASETS = ("fmnist", "mnist")  # what one-thread CPU processes finish in minutes

@dataclass(frozen=True)
class QueueItem:
    """One run of a chapter's profile and the paper cells it backs.

    ``backs`` lists (table, row, column) cells of ``book/reference/<paper>.yaml`` that the
    run's result feeds ("*" matches every row or column); default: (table, row, column)."""

    chapter: str
    table: str
    row: str
    column: str
    seed: int
    config: Any  # RunConfig | ScmConfig: .key(), .to_dict()
    runner: Callable[[Any], dict]
    headline: bool = False
    table_rank: int = 0  # 0: the paper's main table(s); larger: ablations, appendix
    first_seed: bool = True
    backs: tuple[tuple[str, str, str], ...] = ()

    @property
    def key(self) -> str:
        return self.config.key()

    @property
    def dataset(self) -> str:
        return self.config.dataset

    @property
    def cells(self) -> tuple[tuple[str, str, str], ...]:
        return self.backs or ((self.table, self.row, self.column),)

    @property
    def gpu(self) -> bool:
        """Meant for a GPU: anything beyond the small grey-scale datasets."""
        return self.dataset not in CPU_DATASETS

    def describe(self) -> str:
        return f"{self.chapter} {self.table} | {self.row} | {self.column} | seed {self.seed}"


def items_of(chapter: str, table: str, configs: Iterable, row: Callable[[Any], str], column: Callable[[Any], str],
             runner: Callable[[Any], dict], *, headline: str | None = None, rank: int = 0, first_seed: int = 0,
             backs: Callable[[Any], tuple] | None = None) -> list[QueueItem]:
    """Items of one table from its configs (``row``/``column`` label each config)."""
    out = []
    for c in configs:
        r = row(c)
        out.append(QueueItem(chapter, table, r, column(c), c.seed, c, runner, headline=r == headline, table_rank=rank,
                             first_seed=c.seed == first_seed, backs=tuple(backs(c)) if backs else ()))
    return out


# ----------------------------------------------------------------------------- the runners an item names


def run_round(config) -> dict:
    """Run a round-engine config; the result as a dict (``RunResult.to_dict()``)."""
    return run(config, progress=False).to_dict()


def run_scm(config) -> dict:
    """Run a FedSCM federation; its record as a dict (``RunResult.to_dict()``, its sections at the top level)."""
    return run_pipeline(config, progress=False).to_dict()


# ----------------------------------------------------------------------------- work


def _get(config, name, default=None):
    return config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)


def runner_kind(config) -> str:
    if method_name(config).startswith("logit_"):
        return "logit"
    if _get(config, "post_rounds") is not None:
        return "scm"
    return "round"


def method_name(config) -> str:
    """The method a config runs: its ``method`` as a mapping (``{"name": ...}``), a plain name (an older
    layout of stored configs) or a ``Method``; a pipeline's aggregator, else "pipeline"."""
    method = _get(config, "method")
    if method is None:
        return _get(config, "aggregator") or "pipeline"
    if isinstance(method, str):
        return method
    name = method.get("name") if isinstance(method, dict) else getattr(method, "name", None)
    return name if isinstance(name, str) else "?"


def method_params(config) -> dict:
    """The hyper-parameters of a config's method (empty for a method given by its name alone)."""
    method = _get(config, "method")
    if isinstance(method, dict):
        return method.get("params") or {k: v for k, v in method.items() if k != "name"}
    return dict(getattr(method, "params", None) or {})


def work(config) -> float:
    """Training-sample passes of one run: the config kind's own estimate (``RunConfig.work``,
    ``ScmConfig.work``; the cost model of ``fedlib.app.queue``'s docstring); a mapping is read as its kind first."""
    if isinstance(config, dict):
        config = (ScmConfig if "post_rounds" in config else RunConfig).make(config, "config")
    return config.work()