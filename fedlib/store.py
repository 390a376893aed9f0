"""The store of runs: the ONE code that knows the results folder.

``Store(root)`` is a results folder: its runs in ``runs/<key>.json.zd`` (one ``stored_payload`` each, written
in the compact record, ``fedlib.record``, through ``fedlib.cache.ResultCache``), the claims a running queue
holds there (``runs/.<key>.claim``), the one listing every reader shares (:func:`list_store`, read again only
when a file changed) and the writer every run goes through (:meth:`Store.put`). ``Store()`` is the
repository's ``results/``; ``Store.writing()`` is where the queue writes (``$FEDLIB_RESULTS``, else the
repository's). No other module builds a path under a results folder (tests/core/test_store.py checks it).
"""

from __future__ import annotations

import functools
import hashlib
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache import KEY_NAME, ResultCache, key_of, read_regular, scan_folder
from .config import RunConfig, ScmConfig
from .provenance import git_commit, repo_root
from .record import decode_history, expand, is_encoded
from .results import check_result, result_check

CLAIM_SUFFIX = ".claim"  # runs/.<key>.claim: a running queue's hold on a key it computes


def default_root() -> Path:
    """The repository's ``results/`` (``$FEDLIB_REPO``'s when set): what the pages read."""
    return repo_root() / "results"


class Store:
    """A results folder (default: :func:`default_root`)."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_root()

    @classmethod
    def writing(cls) -> Store:
        """Where the queue stores runs: ``$FEDLIB_RESULTS`` (e.g. a GPU machine's folder, copied into the
        repository afterwards), else the repository's ``results/``."""
        env = os.environ.get("FEDLIB_RESULTS")
        return cls(env) if env else cls()

    def __eq__(self, other) -> bool:
        return isinstance(other, Store) and self.runs.resolve() == other.runs.resolve()

    def __hash__(self) -> int:
        return hash(self.runs.resolve())

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    @property
    def runs(self) -> Path:
        """The folder of stored runs."""
        return self.root / RUNS_FOLDER

    def cache(self):
        """The runs folder as a ``ResultCache`` that never deletes (checksummed reads, atomic writes)."""
        return ResultCache(self.runs, protect=True)

    def path(self, key: str) -> Path:
        """The file of ``key``'s run."""
        return self.cache().path(_checked(key))

    def read(self, key: str) -> tuple[dict | None, str | None]:
        """(the stored entry, None), (None, None) when absent, or (None, why it is not readable)."""
        return self.cache().read(_checked(key))

    def beside(self, name: str) -> Path:
        """A data file kept beside the runs, not a run (e.g. the logit chapter's calibration record)."""
        return self.root / name

    def claim_path(self, key: str) -> Path:
        """The claim file a running queue holds on ``key``."""
        return self.runs / f".{_checked(key)}{CLAIM_SUFFIX}"

    def listing(self) -> StoreListing:
        """Every file, judged once (:func:`list_store`)."""
        return list_store(self.runs)

    def put(self, key: str, config: dict[str, Any], result: dict[str, Any],
            check: Callable[[dict], str | None] | None = None, **extra: Any) -> Path:
        """Keep one run (:func:`store_run`)."""
        return store_run(_checked(key), config, result, self.root, check=check, **extra)


def _checked(key: str) -> str:
    """``key`` when it can name a file of the store (no separators, no leading dot); else a one-line ValueError."""
    if not isinstance(key, str) or not KEY_NAME.fullmatch(key):
        raise ValueError(f"not a run key: {str(key)[:60]!r} (letters, digits, '.', '_' and '-', not first '.')")
    return key


# ----------------------------------------------------------------------------- the stored runs

RUNS_FOLDER = "runs"  # results/runs/<key>.json.zd: every stored run, once, keyed by its config and data
# A run's cache entry ($FEDLIB_CACHE/runs/<key>.json) and its stored copy are the same JSON
# (``stored_payload``): copying one to the other's folder is all it takes to keep a run.


def runs_dir(results_root: str | Path | None = None) -> Path:
    """Where stored runs live: ``<results_root>/runs`` (default: the repository's ``results/``)."""
    return Store(results_root).runs


def stored_payload(config: dict[str, Any], result: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A stored run: the config as written, the result, and one provenance block (commit, device,
    date, wall time of the run itself, even when it came from the cache) plus ``extra``."""
    meta = result.get("meta", {})
    return {"config": config, "result": result, "commit": git_commit(), "device": meta.get("device"),
            "date": meta.get("date"), "wall_time": meta.get("wall_time"), **extra}


def run_of(entry: dict[str, Any]) -> dict[str, Any]:
    """The run result of a cache or store entry: entries are ``stored_payload``s (config, result,
    provenance); a bare result (the cache's format before one store) is read as it is."""
    return entry["result"] if isinstance(entry.get("result"), dict) and "history" not in entry else entry


def read_stored(store, paths) -> Iterator[tuple[Path, dict | None, dict | None, str | None]]:
    """Each stored file of ``store`` (a ``ResultCache``) among ``paths``: (path, its entry, its run, why
    the run is not valid: None when it is), read through the store's safe reader and :func:`check_result`."""
    for path in paths:
        payload, problem = store.read(key_of(path))
        result = run_of(payload) if payload else None
        yield path, payload, result, problem or check_result(result)


@dataclass(frozen=True)
class StoredRun:
    """One valid entry of the store: its file, key, entry (``stored_payload``), run (:func:`run_of`) and
    its config as this version reads it (a ``RunConfig``, or a ``ScmConfig`` for a FedSCM pipeline).
    The listing keeps a compact record's history in its columns (``fedlib.record``) and decodes it the first
    time ``entry`` or ``result`` is read: ``meta`` and ``final`` never need it."""

    path: Path
    key: str
    stored: dict  # the entry as written (a compact record's history still columns)
    config: Any

    @functools.cached_property
    def entry(self) -> dict:
        return expand(self.stored)

    @functools.cached_property
    def result(self) -> dict:
        return run_of(self.entry)

    @property
    def meta(self) -> dict:
        return run_of(self.stored).get("meta") or {}

    @property
    def final(self) -> dict:
        return run_of(self.stored).get("final") or {}

    def agrees(self) -> bool:
        """Whether the entry's own config, on the data its run recorded, has the file's key: its name, its
        config and its run's record tell the same story (a current run; a re-signed or renamed one does not)."""
        try:
            return self.config.key(self.meta.get("data") or {}) == self.key
        except Exception:  # noqa: BLE001 - a config that cannot make its key does not agree
            return False


@dataclass
class StoreListing:
    """The store of runs as readers see it (:func:`list_store`): ``runs``, the valid entries by key;
    ``left_out``, one line ``<name> (<why>)`` per file no reader uses (left where it is); ``signature``,
    a digest of the whole store (names, kinds and content checksums) that changes with any file."""

    root: Path
    runs: list[StoredRun]
    left_out: list[str]
    signature: str

    def engine_runs(self) -> list[StoredRun]:
        """The runs of the round engine (``RunConfig``); FedSCM pipelines are read by their own chapter."""
        return [r for r in self.runs if isinstance(r.config, RunConfig)]


# what reading a store found, by folder: its last listing, and each file's verdict by (name, content digest)
_LISTINGS: dict[Path, StoreListing] = {}
_VERDICTS: dict[Path, dict[tuple[str, str], tuple[StoredRun | None, str | None]]] = {}


def stored_config(raw: Any, result: Any) -> tuple[Any, str | None]:
    """(config, None): a stored entry's ``config`` as this version reads it (a ``RunConfig``; a
    ``ScmConfig`` when its run is a FedSCM pipeline's), with the run valid for it (:func:`check_result`);
    else (None, why), one line."""
    pipeline = isinstance(result, dict) and isinstance(result.get("methods"), dict)
    problem = None if pipeline else check_result(result)
    if problem:
        return None, problem
    try:
        config = (ScmConfig if pipeline else RunConfig).make(raw, "config")
    except Exception as err:  # noqa: BLE001 - an unknown method, an old layout: one line, never a traceback
        text = " ".join(str(err).split()).removeprefix("config: ") or type(err).__name__
        return None, f"its config is not one this version reads: {text[:160]}"
    return config, None


def list_store(root: str | Path | None = None) -> StoreListing:
    """Every file of the store ``root`` (default: the repository's ``results/runs/``), judged once: the
    ONE listing of stored runs the book, the queue, the claims and the migration read.

    A file is left out, with one line, when it is not a regular file (a symbolic link, looping, dangling
    or pointing anywhere, a FIFO, a directory, a device), when its name is not a key (not UTF-8, odd
    characters), when it is unreadable, too large or fails its checksum, or when its config is not one
    this version reads (an unknown method) or its run is not a valid one. Nothing is moved, renamed or
    deleted. Each call reads the files' bytes (bounded, regular files only); an entry is parsed again only
    when its content changed, and while nothing changed the same listing is returned."""
    folder = Path(root) if root is not None else runs_dir()
    scan = scan_folder(folder)
    known = _VERDICTS.get(folder, {})
    verdicts: dict[tuple[str, str], tuple[StoredRun | None, str | None]] = {}
    runs, left_out = [], list(scan.left_out)
    digest = hashlib.sha256()
    for line in scan.left_out:
        digest.update(f"left out {line}\n".encode())
    for key, path in scan.entries:
        try:
            blob = read_regular(path)
        except FileNotFoundError:  # removed since the scan: not in the store
            continue
        except ValueError as err:  # swapped for a special file since the scan, or too large
            run, problem = None, str(err)
        except OSError as err:
            run, problem = None, f"unreadable ({err.strerror or type(err).__name__})"
        else:
            content = (path.name, hashlib.sha256(blob).hexdigest())
            digest.update(f"{content[0]} {content[1]}\n".encode())
            run, problem = verdicts[content] = known.get(content) or _judge(path, key, blob, ResultCache.parse)
        if run is not None:
            runs.append(run)
            continue
        digest.update(f"{path.name} ({problem})\n".encode())
        left_out.append(f"{path.name} ({problem})")
    _VERDICTS[folder] = verdicts  # only the files there now
    listing = _LISTINGS.get(folder)
    if listing is None or listing.signature != digest.hexdigest():  # the same object while nothing changed
        listing = _LISTINGS[folder] = StoreListing(folder, runs, left_out, digest.hexdigest())
    return listing


def _judge(path: Path, key: str, blob: bytes, parse) -> tuple[StoredRun | None, str | None]:
    """(the run, None) of an entry file's bytes, or (None, why it is left out). A compact record is checked
    on the history columns :func:`fedlib.results.check_result` reads (round and the two scores per round);
    the rest of its history is decoded when the run is read."""
    entry, problem = parse(path, blob, expanded=False)
    if problem is not None:
        return None, problem
    result = run_of(entry)
    checked = result
    if isinstance(result, dict) and is_encoded(result.get("history")):
        try:
            checked = {**result, "history": decode_history(result["history"], CHECKED_COLUMNS)}
        except (ValueError, KeyError, TypeError, IndexError, zlib.error) as err:
            return None, f"unreadable history columns ({type(err).__name__})"
    config, problem = stored_config(entry.get("config"), checked)
    return (None, problem) if problem else (StoredRun(path, key, entry, config), None)


CHECKED_COLUMNS = frozenset({"round", "accuracy", "balanced_accuracy"})  # what check_result reads of each round


def entry_check(config: RunConfig, fingerprint: dict) -> Callable[[dict], str | None]:
    """``result_check`` on an entry's run (:func:`run_of`), for ``ResultCache.get``."""
    check = result_check(config, fingerprint)
    return lambda entry: check(run_of(entry))


def store_run(key: str, config: dict[str, Any], result: dict[str, Any], results_root=None,
              check: Callable[[dict], str | None] | None = None, **extra: Any):
    """Keep one run under ``results/runs/<key>.json.zd`` (atomic; an invalid file there, or one failing
    ``check``, is set aside, never deleted). Every writer of stored runs goes through here. Returns the path."""
    return Store(results_root).cache().put(key, stored_payload(config, result, **extra), check=check)
