"""Issue 31: the core library imports nothing of the book application (an import-linter contract in
pyproject.toml), and every module of fedlib is placed on one side of that line. Issue 46: inside the
application the arrows run down its layers (the kit, the chapters, the judge and the queue, the build
and the explorer, the command line), every application module is placed in one, and no chapter module
imports the build or the queue, not even inside a function."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _contract() -> dict:
    return next(c for c in _contracts() if c["type"] == "forbidden")


def _app_layers() -> list[list[str]]:
    """The application's layers, highest first, each a list of fedlib.app's modules (import-linter's
    ``a : b`` or ``a | b`` siblings, ``(a)`` optional)."""
    contract = next(c for c in _contracts() if c["type"] == "layers" and c.get("containers") == ["fedlib.app"])
    return [[name.strip().strip("()") for name in re.split(r"[:|]", layer)] for layer in contract["layers"]]


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(root), "PATH": ""})


pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (pip install -e '.[test]')")


def test_the_core_imports_nothing_of_the_book_application_and_the_application_keeps_its_layers():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"{len(_contracts())} kept, 0 broken" in done.stdout


def test_every_module_is_on_one_side():
    package = ROOT / "fedlib"
    modules = {f"fedlib.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {f"fedlib.{d.name}" for d in package.iterdir() if (d / "__init__.py").is_file()}
    contract = _contract()
    core, application = set(contract["source_modules"]), set(contract["forbidden_modules"])
    assert not core & application
    assert modules == core | application, f"place these in pyproject.toml's layers: {sorted(modules ^ (core | application))}"


def test_every_application_module_is_in_one_layer():
    """Each module and package of fedlib.app in exactly one layer of the application (the contract is
    ``exhaustive`` too), the kit lowest, the build highest; the command line above the application."""
    app = ROOT / "fedlib" / "app"
    modules = {p.stem for p in app.glob("*.py") if p.stem != "__init__"}
    modules |= {d.name for d in app.iterdir() if (d / "__init__.py").is_file()}
    layers = _app_layers()
    placed = [name for layer in layers for name in layer]
    assert len(placed) == len(set(placed)), "a module in two layers"
    assert set(placed) == modules, f"place these in pyproject.toml's layers: {sorted(set(placed) ^ modules)}"
    assert layers[-1] == ["kit"] and layers[-2] == ["chapters"] and "book" in layers[0] and "queue" in layers[1]
    cli = next(c for c in _contracts() if c["type"] == "layers" and not c.get("containers"))
    assert cli["layers"] == ["fedlib.__main__", "fedlib.app"]


def test_a_chapter_that_imports_the_build_breaks_the_layers(tmp_path):
    """The layers contract on a copy of fedlib where a chapter imports the build inside a function."""
    shutil.copytree(ROOT / "fedlib", tmp_path / "fedlib", ignore=shutil.ignore_patterns("__pycache__"))
    chapter = tmp_path / "fedlib" / "app" / "chapters" / "fedavg.py"
    chapter.write_text(chapter.read_text() + "\n\ndef _late():\n    from ..book import toc\n\n    return toc\n")
    done = _lint(tmp_path)
    assert done.returncode != 0 and "BROKEN" in done.stdout
    assert "fedlib.app.chapters is not allowed to import fedlib.app.book" in done.stdout
    assert "fedlib.app.chapters.fedavg -> fedlib.app.book" in done.stdout


def _imported(source: str, package: str) -> set[str]:
    """Every module an ``import`` or ``from ... import`` anywhere in ``source`` (functions, classes,
    ``TYPE_CHECKING`` blocks included) names, as absolute names: ``from .. import book`` in package
    ``fedlib.app.chapters`` names ``fedlib.app`` and ``fedlib.app.book``; ``importlib.import_module("x")``
    and ``__import__("x")`` with a literal name count too."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(str(node.args[0].value))
    return found


FORBIDDEN_TO_CHAPTERS = ("fedlib.app.book", "fedlib.app.queue")


def _forbidden(names: set[str]) -> set[str]:
    return {n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN_TO_CHAPTERS)}


def test_no_chapter_module_imports_the_build_or_the_queue():
    """Not at module level, not inside a function: a chapter takes what it needs from the kit."""
    folder = ROOT / "fedlib" / "app" / "chapters"
    for path in sorted(folder.rglob("*.py")):  # a chapter split into a package: each of its modules
        package = ".".join(["fedlib", "app", "chapters", *path.relative_to(folder).parent.parts])
        found = _forbidden(_imported(path.read_text(), package))  # __init__ and modules alike
        assert not found, f"{path.relative_to(ROOT)} imports {sorted(found)}"


def test_the_chapter_check_sees_imports_inside_functions():
    hidden = ("def table(self):\n    if True:\n        from .. import book\n    from ..queue import work\n"
              "    import fedlib.app.book\n    return importlib.import_module('fedlib.app.queue')\n")
    assert _forbidden(_imported(hidden, "fedlib.app.chapters")) == {
        "fedlib.app.book", "fedlib.app.queue", "fedlib.app.queue.work"}
    assert not _forbidden(_imported("from ..kit.stored import stored_results\nfrom .. import kit\n",
                                    "fedlib.app.chapters"))


def test_a_core_module_that_imports_the_book_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "fedlib", tmp_path / "fedlib", ignore=shutil.ignore_patterns("__pycache__"))
    results = tmp_path / "fedlib" / "results.py"
    results.write_text(results.read_text() + "\n\ndef _root():\n    from .app.book import book_dir\n\n    return book_dir()\n")
    done = _lint(tmp_path)
    assert done.returncode != 0 and "BROKEN" in done.stdout and "fedlib.results -> fedlib.app.book" in done.stdout


def _cycles(graph, modules: set[str], top) -> list[list[str]]:
    """Every import loop among ``modules`` (each read as ``top(module)``), found depth-first."""
    edges = {m: set() for m in modules}
    for module in graph.modules:
        if top(module) in modules:
            edges[top(module)] |= {top(i) for i in graph.find_modules_directly_imported_by(module)
                                   if top(i) in modules and top(i) != top(module)}
    seen, stack, cycles = {}, [], []

    def visit(m):  # a grey module met again closes a cycle
        seen[m] = "grey"
        stack.append(m)
        for n in sorted(edges[m]):
            if seen.get(n) == "grey":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in seen:
                visit(n)
        stack.pop()
        seen[m] = "black"

    for m in sorted(modules):
        if m not in seen:
            visit(m)
    return cycles


def test_no_module_of_fedlib_is_in_an_import_cycle():
    """Issue 31: no two modules import each other, directly or around a loop, core and application alike
    (imports under ``TYPE_CHECKING`` never run and are left out)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("fedlib", exclude_type_checking_imports=True, cache_dir=None)
    assert not _cycles(graph, set(graph.modules), lambda m: m)


def test_a_loop_through_the_application_would_be_found(tmp_path):
    """The check above on a copy of fedlib where the lowest application module imports the queue back."""
    pytest.importorskip("grimp")
    shutil.copytree(ROOT / "fedlib", tmp_path / "fedlib", ignore=shutil.ignore_patterns("__pycache__"))
    sources = tmp_path / "fedlib" / "app" / "kit" / "sources.py"
    sources.write_text(sources.read_text() + "\n\ndef _late():\n    from .. import queue\n\n    return queue\n")
    code = ("import sys, grimp; sys.path.insert(0, sys.argv[1]); from test_layers import _cycles; "
            "g = grimp.build_graph('fedlib', exclude_type_checking_imports=True, cache_dir=None); "
            "print([loop for loop in _cycles(g, set(g.modules), lambda m: m)])")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests" / "app")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fedlib.app.kit.sources" in done.stdout and "fedlib.app.queue" in done.stdout


def test_the_core_has_no_import_cycle():
    """Issue 31: no two core modules import each other, directly or around a loop (as packages)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("fedlib", cache_dir=None)
    core = set(_contract()["source_modules"])

    cycles = _cycles(graph, core, lambda module: ".".join(module.split(".")[:2]))  # packages as one node
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
