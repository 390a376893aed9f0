"""The one store (``fedlib.store.Store``): the only code that knows the results folder's layout."""

import re
from pathlib import Path

import pytest

import fedlib
from fedlib.config import make_config
from fedlib.store import Store

ROOT = Path(__file__).resolve().parents[2]
# a path built under a results folder: its runs folder, the folder itself, a claim, the queue's target
LAYOUT = re.compile(r"""/\s*["'](runs|results)["']|["']results["']\s*/|RUNS_FOLDER|runs_dir\(|FEDLIB_RESULTS|\.claim["']""")
ALLOWED = {
    'default_cache_root() / "runs"',  # the user's run cache ($FEDLIB_CACHE/runs), not a results folder
    '"benchmarks" / "results"',  # the benchmarks' records, not a store of runs
}


def test_no_module_but_the_store_builds_a_path_under_the_results_folder():
    offenders = []
    for path in sorted((ROOT / "fedlib").rglob("*.py")):
        if path == ROOT / "fedlib" / "store.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if '"""' in line or line.lstrip().startswith(("#", "``")):
                continue
            if LAYOUT.search(code) and not any(ok in code for ok in ALLOWED):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_grep_finds_what_it_forbids():
    for line in ('folder = repo_root() / "results" / "runs"', 'x = runs_dir(root)', 'p = root / "runs"',
                 'os.environ.get("FEDLIB_RESULTS")', 'name = f".{key}.claim"'):
        assert LAYOUT.search(line), line
    assert not LAYOUT.search('store = Store().runs')


def test_a_run_put_is_read_listed_and_claimed_inside_its_store(tmp_path, monkeypatch):
    config = make_config(dataset="synthetic", model="mlp", n_clients=3, rounds=1, method="fedavg")
    result = fedlib.run(config, cache=False, progress=False).to_dict()
    store = Store(tmp_path / "out")
    path = store.put(config.key(), config.to_dict(), result)
    assert path.parent == store.runs == tmp_path / "out" / "runs" and path == store.path(config.key())
    entry, problem = store.read(config.key())
    assert problem is None and entry["result"]["final"] == result["final"]
    assert [r.key for r in store.listing().runs] == [config.key()]
    assert store.claim_path("abc").parent == store.runs and store.claim_path("abc").name.startswith(".abc")
    assert store.beside("x.json") == tmp_path / "out" / "x.json"
    # where the queue writes: $FEDLIB_RESULTS, else the repository's (one default, patchable in one place)
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "out"))
    assert Store.writing() == store
    monkeypatch.delenv("FEDLIB_RESULTS")
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path / "repo")
    assert Store.writing() == Store() == Store(tmp_path / "repo") and Store().read(config.key()) == (None, None)


def test_an_empty_store_lists_nothing(tmp_path):
    assert Store(tmp_path).listing().runs == [] and Store(tmp_path).read("0" * 20) == (None, None)
    for bad in ("../escape", ".hidden", "a/b", ""):
        with pytest.raises(ValueError, match="not a run key"):
            Store(tmp_path).read(bad)


def test_the_listing_decodes_a_runs_history_only_when_it_is_read(tmp_path):
    """A compact record is judged on the columns ``check_result`` reads; its full history is decoded on the first
    read of ``entry`` or ``result``, and equals what the store's reader returns."""
    config = make_config(dataset="synthetic", model="mlp", n_clients=3, rounds=2, method="fedavg")
    result = fedlib.run(config, cache=False, progress=False).to_dict()
    store = Store(tmp_path)
    store.put(config.key(), config.to_dict(), result)
    (run,) = store.listing().runs
    assert "entry" not in run.__dict__ and run.meta == result["meta"] and run.final == result["final"]
    assert isinstance(run.stored["result"]["history"], dict)  # still columns
    assert run.result == store.read(config.key())[0]["result"] and "entry" in run.__dict__
    assert len(run.result["history"]) == 2
