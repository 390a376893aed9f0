"""The results layer: a run's result as JSON-ready data (``RunResult``), the checks a stored
or cached payload must pass (``check_result``, ``result_check``) and the provenance a run
records (what produced it: key, config, rule versions, data, versions, device, date)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .config import ENGINE_VERSION, RunConfig
from .data import Dataset

__all__ = ["RunResult", "check_result", "result_check"]


@dataclass
class RunResult:
    """Everything a run produced, as JSON-ready data."""

    config: dict[str, Any]
    history: list[dict[str, Any]]
    final: dict[str, Any]
    meta: dict[str, Any]
    model: Any = field(default=None, repr=False, compare=False)  # (flat, buffers) when asked for

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "history": self.history, "final": self.final, "meta": self.meta}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunResult":
        return cls(data["config"], data["history"], data["final"], data["meta"])

    def series(self, key: str) -> tuple[list[int], list[Any]]:
        """(rounds, values) of a per-round metric, skipping rounds without it."""
        rows = [(h["round"], h[key]) for h in self.history if h.get(key) is not None]
        return [r for r, _ in rows], [v for _, v in rows]

    def summary(self) -> str:
        """A small text table: round, accuracy, balanced accuracy, seconds."""
        lines = [f"{'round':>5}  {'acc':>7}  {'bal.acc':>7}  {'train s':>7}  {'server s':>8}"]
        for h in self.history:
            if h.get("accuracy") is None:
                continue
            lines.append(
                f"{h['round'] + 1:>5}  {100 * h['accuracy']:>6.2f}%  {100 * h['balanced_accuracy']:>6.2f}%"
                f"  {h['time_train']:>7.2f}  {h['time_server']:>8.3f}"
            )
        f = self.final
        scores = ("no evaluated round" if f["accuracy"] is None else
                  f"accuracy {100 * f['accuracy']:.2f}%, balanced accuracy {100 * f['balanced_accuracy']:.2f}%")
        setup = [f"{label} {self.meta[k]:.1f} s" for k, label in (("time_load", "data and model"),
                                                                  ("warmup_s", "torch.func warm-up"))
                 if self.meta.get(k)]
        lines.append(f"final: {scores}, wall {self.meta['wall_time']:.1f} s on {self.meta['device']}"
                     + (f" (set-up before round 1, not in wall: {', '.join(setup)})" if setup else "")
                     + (f"\nstopped early: {f['stopped']}" if f.get("stopped") else ""))
        return "\n".join(lines)


def _fingerprint_of(config: RunConfig, dataset: Dataset | None) -> dict:
    """The data fingerprint: of the given Dataset (its files', else its tensors'), else of the files
    the config reads."""
    if dataset is None:
        return config.data_fingerprint()
    if dataset.fingerprint is None:
        from .data import tensor_fingerprint

        dataset.fingerprint = tensor_fingerprint(dataset)
    return dataset.fingerprint


def _key_provenance(config: RunConfig, fingerprint: dict, key: str) -> dict[str, Any]:
    """What produced a result: the key, the resolved hyper-parameters, the rule versions and the data."""
    return {"config_key": key, "config_key_without_data": config.config_key(), "resolved": config.resolved(),
            "rule_versions": config.rule_versions(),
            "data": {k: fingerprint.get(k) for k in ("source", "files", "sha256")}}


PLACEMENT_FIELDS = ("device",)  # where a run ran (recorded in meta.device), not what it computes


def placement_free(resolved: dict | None) -> dict | None:
    """A resolved config without its placement: the results queue runs a chapter's CPU config on a
    GPU and stores it under the chapter's key, so a stored run answers the config on any device."""
    return None if resolved is None else {k: v for k, v in resolved.items() if k not in PLACEMENT_FIELDS}


def result_check(config: RunConfig, fingerprint: dict) -> Callable[[dict], str | None]:
    """A check for ``ResultCache.get``: None when a stored run payload answers ``config`` on the data
    ``fingerprint`` describes (same resolved config, rule versions and data; a valid result),
    else what is wrong."""

    def check(payload: dict) -> str | None:
        problem = check_result(payload)
        if problem:
            return problem
        meta = payload["meta"]
        if placement_free(meta.get("resolved")) != placement_free(config.resolved()):
            return "its config is not the requested one"
        if meta.get("rule_versions") != config.rule_versions():
            return f"computed with rule versions {meta.get('rule_versions')}, now {config.rule_versions()}"
        if (meta.get("data") or {}).get("sha256") != fingerprint.get("sha256"):
            return "computed on other data"
        return None

    return check


def _score(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value) and 0.0 <= value <= 1.0)


def check_result(payload: Any) -> str | None:
    """None when ``payload`` has the schema of ``RunResult.to_dict()`` with valid values (scores
    null or finite in [0, 1]), else the first problem found."""
    if not isinstance(payload, dict) or not all(isinstance(payload.get(k), t) for k, t in
                                                (("config", dict), ("history", list), ("final", dict),
                                                 ("meta", dict))):
        return "not a run result (needs config, history, final, meta)"
    final = payload["final"]
    for name in ("accuracy", "balanced_accuracy", "f1"):
        if not _score(final.get(name)):
            return f"final.{name} is not a score in [0, 1] (got {str(final.get(name))[:40]})"
    per_class = final.get("per_class_accuracy", [])
    if not isinstance(per_class, list) or not all(_score(v) for v in per_class):
        return "final.per_class_accuracy is not a list of scores"
    rounds = final.get("rounds_completed")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds != len(payload["history"]):
        return "final.rounds_completed does not match the history"
    for record in payload["history"]:
        if not isinstance(record, dict) or not isinstance(record.get("round"), int):
            return "a history record has no round"
        if not all(_score(record.get(k)) for k in ("accuracy", "balanced_accuracy")):
            return f"round {record['round']}: accuracy is not a score in [0, 1]"
    return None


def _strict(record: dict[str, Any]) -> dict[str, Any]:
    """Non-finite floats become null; their places are listed in ``record["non_finite"]`` (strict JSON)."""
    found: list[str] = []

    def clean(value, where):
        if isinstance(value, float) and not math.isfinite(value):
            found.append(where)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{where}.{k}" if where else k) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    out = clean(record, "")
    if found:
        out["non_finite"] = found[:20] + ([f"... {len(found) - 20} more"] if len(found) > 20 else [])
    return out


def environment(device: torch.device, wall: float) -> dict[str, Any]:
    """A run's environment (``fedlib.provenance.environment``; its commit is recorded when it is stored)."""
    from .provenance import environment as built

    return built(device, wall, commit=False)


def _provenance(p, wall: float) -> dict[str, Any]:
    """A run's provenance: its key, the environment (:func:`environment`), its data and clients."""
    return {
        "config_key": p.config.key(), **environment(p.device, wall), "dataset_source": p.dataset.source,
        "engine_version": ENGINE_VERSION, "client_sizes": np.asarray(p.partition.sizes).tolist(),
        "client_roles": list(p.partition.roles), "client_class_counts": np.asarray(p.partition.counts).tolist(),
        "model_parameters": sum(t.numel() for t in p.model.parameters()),
        # local training's arithmetic (RunConfig.precision; float32 unless the config says bfloat16)
        "precision": getattr(p.config, "precision", "float32"),
    }


# ----------------------------------------------------------------------------- the stored runs

RUNS_FOLDER = "runs"  # results/runs/<key>.json.gz: every stored run, once, keyed by its config and data
# A run's cache entry ($FEDLIB_CACHE/runs/<key>.json) and its stored copy are the same JSON
# (``stored_payload``): copying one to the other's folder is all it takes to keep a run.


def runs_dir(results_root: str | Path | None = None) -> Path:
    """Where stored runs live: ``<results_root>/runs`` (default: the repository's ``results/``)."""
    from .provenance import repo_root

    return Path(results_root if results_root is not None else repo_root() / "results") / RUNS_FOLDER


def stored_payload(config: dict[str, Any], result: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A stored run: the config as written, the result, and one provenance block (commit, device,
    date, wall time of the run itself, even when it came from the cache) plus ``extra``."""
    from .provenance import git_commit

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
    from .cache import key_of

    for path in paths:
        payload, problem = store.read(key_of(path))
        result = run_of(payload) if payload else None
        yield path, payload, result, problem or check_result(result)


@dataclass(frozen=True)
class StoredRun:
    """One valid entry of the store: its file, key, entry (``stored_payload``), run (:func:`run_of`) and
    its config as this version reads it (a ``RunConfig``, or a ``ScmConfig`` for a FedSCM pipeline)."""

    path: Path
    key: str
    entry: dict
    result: dict
    config: Any

    def agrees(self) -> bool:
        """Whether the entry's own config, on the data its run recorded, has the file's key: its name, its
        config and its run's record tell the same story (a current run; a re-signed or renamed one does not)."""
        try:
            return self.config.key(self.result.get("meta", {}).get("data") or {}) == self.key
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
    from .config import ScmConfig

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
    from .cache import ResultCache, read_regular, scan_folder

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
    """(the run, None) of an entry file's bytes, or (None, why it is left out)."""
    entry, problem = parse(path, blob)
    if problem is not None:
        return None, problem
    result = run_of(entry)
    config, problem = stored_config(entry.get("config"), result)
    return (None, problem) if problem else (StoredRun(path, key, entry, result, config), None)


def entry_check(config: RunConfig, fingerprint: dict) -> Callable[[dict], str | None]:
    """``result_check`` on an entry's run (:func:`run_of`), for ``ResultCache.get``."""
    check = result_check(config, fingerprint)
    return lambda entry: check(run_of(entry))


def store_run(key: str, config: dict[str, Any], result: dict[str, Any], results_root=None,
              check: Callable[[dict], str | None] | None = None, **extra: Any):
    """Keep one run under ``results/runs/<key>.json.gz`` (atomic; an invalid file there, or one failing
    ``check``, is set aside, never deleted). Every writer of stored runs goes through here. Returns the path."""
    from .cache import ResultCache

    return ResultCache(runs_dir(results_root), protect=True).put(key, stored_payload(config, result, **extra),
                                                                 check=check)
