"""Issue 31: the core library imports nothing of the book application (an import-linter contract in
pyproject.toml), and every module of fedlib is placed on one side of that line."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def _contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["type"] == "forbidden")


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(root), "PATH": ""})


pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (pip install -e '.[test]')")


def test_the_core_imports_nothing_of_the_book_application():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


def test_every_module_is_on_one_side():
    package = ROOT / "fedlib"
    modules = {f"fedlib.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {f"fedlib.{d.name}" for d in package.iterdir() if (d / "__init__.py").is_file()}
    contract = _contract()
    core, application = set(contract["source_modules"]), set(contract["forbidden_modules"])
    assert not core & application
    assert modules == core | application, f"place these in pyproject.toml's layers: {sorted(modules ^ (core | application))}"


def test_a_core_module_that_imports_the_book_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "fedlib", tmp_path / "fedlib", ignore=shutil.ignore_patterns("__pycache__"))
    results = tmp_path / "fedlib" / "results.py"
    results.write_text(results.read_text() + "\n\ndef _root():\n    from .app.book import book_dir\n\n    return book_dir()\n")
    done = _lint(tmp_path)
    assert done.returncode != 0 and "BROKEN" in done.stdout and "fedlib.results -> fedlib.app.book" in done.stdout


def test_the_core_has_no_import_cycle():
    """Issue 31: no two core modules import each other, directly or around a loop (the application's
    modules may still; they are listed in the closing note of the issue)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("fedlib")
    core = set(_contract()["source_modules"])

    def top(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges = {m: set() for m in core}
    for module in graph.modules:
        if top(module) in core:
            edges[top(module)] |= {top(i) for i in graph.find_modules_directly_imported_by(module)
                                   if top(i) in core and top(i) != top(module)}
    seen, stack, cycles = {}, [], []

    def visit(m):  # depth-first; a grey module met again closes a cycle
        seen[m] = "grey"
        stack.append(m)
        for n in sorted(edges[m]):
            if seen.get(n) == "grey":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in seen:
                visit(n)
        stack.pop()
        seen[m] = "black"

    for m in sorted(core):
        if m not in seen:
            visit(m)
    assert not cycles, cycles


def test_one_provenance_builder():
    """Runs (without the commit: it is recorded when a run is stored), the FedSCM stage, calibration and
    benchmarks take their provenance from fedlib.provenance.environment."""
    from fedlib.provenance import environment, git_commit
    from fedlib.results import environment as run_environment

    built = environment("cpu", wall=2.5)
    assert list(built) == ["fedlib_version", "torch", "torchvision", "numpy", "python", "device", "wall_time",
                           "date", "commit"]
    assert built["commit"] == git_commit() and built["device"].startswith("cpu (")
    run = run_environment("cpu", 2.5)
    assert "commit" not in run and {k: v for k, v in built.items() if k not in ("commit", "date")} == \
        {k: v for k, v in run.items() if k != "date"}
    assert "wall_time" not in environment("cpu")
