"""Coverage levels of paper cells, from synthetic queue items, stored keys and a reference."""

from dataclasses import dataclass

import pandas as pd

from fedlib.app import chapters, coverage, queue
from fedlib.app.queue import store as queue_store


@dataclass(frozen=True)
class Cfg:
    name: str
    seed: int = 0
    dataset: str = "fmnist"
    model: str = "mlp"

    def key(self):
        return f"{self.name}-{self.seed}"


def item(row, column, seed=0, table="Table 1", dataset="fmnist", backs=()):
    return queue.QueueItem("celm", table, row, column, seed, Cfg(f"{row}|{column}", seed, dataset), lambda c: {},
                           first_seed=seed == 0, backs=backs)


REFERENCE = pd.DataFrame([
    {"table": "Table 1", "row": "F.MNIST PLS", "column": "CELM", "value": 1.0},
    {"table": "Table 1", "row": "F.MNIST PLS", "column": "FedAvg", "value": 1.0},
    {"table": "Table 1", "row": "F.MNIST SLS", "column": "CELM", "value": 1.0},
    {"table": "Table 1", "row": "F.MNIST SLS", "column": "FedAvg", "value": 1.0},
    {"table": "Table 1", "row": "CIFAR-10 PLS", "column": "CELM", "value": 1.0},
    {"table": "Table 1", "row": "FedISIC Natural", "column": "CELM", "value": 1.0},
    {"table": "Table 4", "row": "F.MNIST PLS", "column": "JSD CELM", "value": 1.0},
    {"table": "Table 4", "row": "F.MNIST PLS", "column": "EMD CELM", "value": 1.0},
])


def test_levels_from_stored_seeds_build_profile_and_missing_data(monkeypatch):
    monkeypatch.setattr(queue_store, "data_missing", lambda d: "cifar10 data absent" if d == "cifar10" else None)
    paper = [item("F.MNIST PLS", "CELM", s) for s in (0, 1, 2)] + [item("F.MNIST PLS", "FedAvg", s) for s in (0, 1, 2)]
    paper += [item("F.MNIST SLS", "CELM", s) for s in (0, 1, 2)] + [item("F.MNIST SLS", "FedAvg", s) for s in (0, 1)]
    paper += [item("CIFAR-10 PLS", "CELM", 0, dataset="cifar10")]
    paper += [item("F.MNIST PLS", "evidence", s, table="Table 4", backs=(("Table 4", "F.MNIST PLS", "*"),))
              for s in (0, 1, 2)]
    paper += [item("F.MNIST k=2", "UWA", 0, table="k sweep")]
    stored = {"F.MNIST PLS|CELM-0", "F.MNIST PLS|CELM-1", "F.MNIST PLS|CELM-2", "F.MNIST PLS|FedAvg-0",
              "F.MNIST PLS|evidence-1"}
    build = [item("F.MNIST SLS", "CELM", 0)]
    cells = {(c.table, c.row, c.column): c for c in
             coverage.coverage("celm", paper_items=paper, build_items=build, stored=stored, reference=REFERENCE)}
    assert cells[("Table 1", "F.MNIST PLS", "CELM")].level == "paper protocol, all seeds"
    assert cells[("Table 1", "F.MNIST PLS", "FedAvg")].detail == "1 of 3 seeds stored"
    assert cells[("Table 1", "F.MNIST PLS", "FedAvg")].level == "paper protocol, fewer seeds"
    assert cells[("Table 1", "F.MNIST SLS", "CELM")].level == "reduced protocol only"
    assert cells[("Table 1", "F.MNIST SLS", "FedAvg")].level == "queued, not run yet"
    assert cells[("Table 1", "F.MNIST SLS", "FedAvg")].detail == "2 run(s) queued"
    assert cells[("Table 1", "CIFAR-10 PLS", "CELM")].level == "not runnable here"
    assert cells[("Table 1", "CIFAR-10 PLS", "CELM")].detail == (
        "needs CIFAR-10 (not on this machine): python -m fedlib results --chapter celm --table 'Table 1' where it is "
        "present")
    assert cells[("Table 1", "FedISIC Natural", "CELM")].detail == "FedISIC-2019 data absent"
    # one run backs every column of its Table 4 row ("*")
    assert {cells[("Table 4", "F.MNIST PLS", c)].detail for c in ("JSD CELM", "EMD CELM")} == {"1 of 3 seeds stored"}
    # a table the paper gives no numbers for is ours
    own = cells[("k sweep", "F.MNIST k=2", "UWA")]
    assert not own.in_paper and own.level == "queued, not run yet"
    grid = coverage.grid(list(cells.values()), "Table 1")
    assert list(grid.index) == ["F.MNIST PLS", "F.MNIST SLS", "CIFAR-10 PLS", "FedISIC Natural"]
    assert grid.loc["F.MNIST PLS", "CELM"] == "paper protocol, all seeds"
    counts = coverage.counts(list(cells.values()))
    assert counts.loc["Table 1"].sum() == 6 and counts.loc["Table 1", "not runnable here"] == 2


def test_every_paper_coverage_is_computed_from_the_repository():
    for paper in chapters.papers():
        cells = coverage.coverage(paper, "smoke")
        assert cells and all(c.level in coverage.LEVELS for c in cells)
        assert any(c.in_paper for c in cells)


def test_stored_runs_count_when_their_data_is_not_on_this_machine(monkeypatch):
    """Data presence changes only what can be re-run: a stored seed keeps its level, marked."""
    monkeypatch.setattr(queue_store, "data_missing", lambda d: "mnist data absent" if d == "mnist" else None)
    paper = [item("F.MNIST PLS", "CELM", s, dataset="mnist") for s in (0, 1, 2)]
    paper += [item("F.MNIST PLS", "FedAvg", s, dataset="mnist") for s in (0, 1, 2)]
    stored = {"F.MNIST PLS|CELM-0", "F.MNIST PLS|CELM-1", "F.MNIST PLS|CELM-2", "F.MNIST PLS|FedAvg-1"}
    cells = {(c.table, c.row, c.column): c for c in
             coverage.coverage("celm", paper_items=paper, build_items=[], stored=stored, reference=REFERENCE)}
    celm, fedavg = cells[("Table 1", "F.MNIST PLS", "CELM")], cells[("Table 1", "F.MNIST PLS", "FedAvg")]
    assert celm.level == "paper protocol, all seeds"
    assert celm.detail == "3 of 3 seeds stored; data not on this machine (fingerprint recorded)"
    assert fedavg.level == "paper protocol, fewer seeds" and fedavg.detail.startswith("1 of 3 seeds stored; data not")
    # nothing stored and no data: not runnable here
    assert cells[("Table 1", "F.MNIST SLS", "CELM")].level == "not runnable here"


def test_the_repository_coverage_is_the_same_without_any_data(tmp_path, monkeypatch):
    """The stored runs of the repository give the same levels with an empty data folder (MNIST,
    CIFAR-10 and Fashion-MNIST all absent) as with the data here; only the notes differ."""
    from fedlib import data_sources

    levels = {}
    for name, root in (("here", None), ("empty", tmp_path)):
        if root is not None:
            monkeypatch.setenv("FEDLIB_DATA", str(root))
            monkeypatch.setattr(data_sources, "DEBIAN_FASHION_MNIST", tmp_path / "none")
        levels[name] = {(c.table, c.row, c.column): c.level for paper in ("celm", "logitfl", "fedms")
                        for c in coverage.coverage(paper, "smoke") if c.level in coverage.LEVELS[:2]}
    assert levels["here"] and levels["here"] == levels["empty"]


def test_every_count_of_the_papers_cells_is_the_reference_yamls_total():
    """The papers' cells are every distinct (table, row, column) of book/reference/*.yaml, counted here from
    the files themselves (627 since CELM's Table 7: 222 + 77 + 156 + 169 + 3): the coverage of each paper
    has exactly its YAML's cells as paper cells, and ``per_level`` counts them all."""
    import yaml

    from fedlib.app.book import book_dir

    from_files = {}
    for path in sorted((book_dir() / "reference").glob("*.yaml")):
        entries = yaml.safe_load(path.read_text())["entries"]
        from_files[path.stem] = len({(e["table"], e["row"], e["column"]) for e in entries})
    assert sum(from_files.values()) == 627 and from_files["celm"] == 222
    by_paper = coverage.reference_cells()
    assert {chapters.record(p).reference: n for p, n in by_paper.items()} == from_files
    cells = {paper: coverage.coverage(paper, "smoke", stored=set()) for paper in chapters.papers()}
    assert {p: sum(c.in_paper for c in cs) for p, cs in cells.items()} == by_paper
    _, values = coverage.per_level(cells)
    assert values["n_paper_cells"] == sum(from_files.values()) and values["n_stored_paper_cells"] == 0
    assert values["n_cells"] >= values["n_paper_cells"]  # and our own tables' cells
