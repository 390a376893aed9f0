"""The queue's side of the store: whether an item's run is stored (and answers it), storing a result, the claims
a running queue holds on the keys it is computing (``runs/.<key>.claim``), and the data an item needs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from ...cache import read_regular
from ...config import RunConfig, ScmConfig
from ...data import data_missing
from ...results import check_result, placement_free, result_check
from ...store import Store, run_of
from ..kit.items import QueueItem
from ..kit.stored import StoredIndex

# ----------------------------------------------------------------------------- the store (adapter)


def results_root() -> Path:
    """Where the queue stores runs (``fedlib.store.Store.writing``): ``$FEDLIB_RESULTS``, else the
    repository's ``results/``; runs go in its ``runs/``."""
    return Store.writing().root


def stores() -> list[Store]:
    """The stores the queue reads: where it writes, and the repository's (once when they are one)."""
    return list(dict.fromkeys((Store.writing(), Store())))


def left_out_lines() -> list[str]:
    """One line per file of the queue's stores (where it writes, and the repository's) that no reader
    uses (:func:`fedlib.results.list_store`), each saying it is left where it is."""
    lines = []
    for store in stores():
        lines += [f"{store.root.name}/{store.runs.name}/{line}: left out, not read (left as it is)"
                  for line in store.listing().left_out]
    return lines


def answers(item: QueueItem, payload: dict) -> str | None:
    """None when a stored entry (checksum already verified) is a valid run of ``item``: the right
    schema, and it answers the item's key (its resolved config, rule versions and data, as the
    chapters judge it: ``fedlib.results.result_check``); else what is wrong."""
    if not isinstance(payload, dict):
        return "not a stored run"
    run = run_of(payload)
    config = item.config
    if isinstance(config, RunConfig):
        problem = check_result(run)
        if problem:
            return problem
        fingerprint = config.data_fingerprint()
        if not fingerprint.get("sha256"):  # data absent here: the file's own record of its data
            fingerprint = run["meta"].get("data") or {}
        return result_check(config, fingerprint)(run)
    stored_config = payload.get("config")
    if isinstance(config, ScmConfig):
        if not isinstance(run.get("methods"), dict):
            return "not a FedSCM pipeline result"
        try:
            stored = ScmConfig.make(stored_config)
        except ValueError:
            return "its config is not a valid FedSCM config"
        same = placement_free(stored.resolved()) == placement_free(config.resolved())
        return None if same else "its config is not the requested one"
    return None if stored_config == config.to_dict() else "its config is not the requested one"


def stored_state(item: QueueItem) -> tuple[bool, str | None]:
    """(stored, problem): whether a valid run of ``item`` is stored where the queue writes or in the
    repository, judged by content (checksum, schema, answering the key; regular files of bounded
    size only, read without moving anything); else the problem of a damaged file (None: no file)."""
    found = None
    for store in stores():
        payload, problem = store.read(item.key)
        if payload is None and problem is None:
            continue
        if problem is None:
            try:
                problem = answers(item, payload)
            except Exception as err:  # noqa: BLE001 - a malformed entry is a damaged one
                problem = f"invalid content ({type(err).__name__})"
        if problem is None:
            return True, None
        found = found or f"{store.path(item.key)}: {problem}"
    return False, found


def is_stored(item: QueueItem) -> bool:
    """Whether a valid run of ``item`` is stored (:func:`stored_state`); when its data is not on this
    machine, also by the fingerprint the run recorded (``fedlib.app.kit.stored.StoredIndex``)."""
    if stored_state(item)[0]:
        return True
    if data_missing(item.dataset) is None:  # the data is here: the key above is the run's
        return False
    return StoredIndex.read().run_of(item.config) is not None


def store_payload(item: QueueItem, result: dict, profile: str) -> Path:
    """Keep ``result`` as ``results/runs/<key>.json.zd`` (``fedlib.results.store_run``), plus where
    the run sits in the queue. A damaged file or another run's there is set aside first (renamed)."""
    canonical = item.config.to_dict()
    result = {**result, "config": canonical}  # the chapter's config, whatever device ran it
    return Store.writing().put(item.key, canonical, result, check=lambda entry: answers(item, entry),
                               queue={"profile": profile, "table": item.table, "row": item.row,
                                      "column": item.column, "seed": item.seed})


# ----------------------------------------------------------------------------- claims

# runs/.<key>.claim (``fedlib.store.Store.claim_path``): {"pid", "host", "since"} of the queue running <key>


def _claim_path(key: str, root: Path | None = None) -> Path:
    return (Store(root) if root is not None else Store.writing()).claim_path(key)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


UNREADABLE_CLAIM_S = 60.0  # an unreadable claim may be being written: held this long after its last change


def claim_problem(owner: Any) -> str | None:
    """Why a claim's content is not a claim this queue writes (None when it is): a mapping with a pid
    (a positive integer) and a host (text). Such a claim holds nothing."""
    if not isinstance(owner, dict):
        return f"not a claim ({type(owner).__name__})"
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return f"its pid {str(pid)[:40]!r} is not a process id"
    if not isinstance(owner.get("host"), str):
        return f"its host {str(owner.get('host'))[:40]!r} is not a host name"
    return None


def claim_owner(key: str, root: Path | None = None) -> dict | None:
    """The claim on ``key`` (``{"pid", "host", "since"}``), or None when there is none. An unreadable
    claim (being written, or a folder, a link, a FIFO) is ``{"pid": None, "host": None, "since": <its
    last change>}``; a readable one that is no claim (:func:`claim_problem`) also has ``"invalid"``: why."""
    path = _claim_path(key, root)
    try:
        owner = json.loads(read_regular(path, limit=4096))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):
        owner = None
    if owner is not None:
        problem = claim_problem(owner)
        if problem is None:
            return owner
        return {"pid": None, "host": None, "since": 0.0, "invalid": problem}
    try:  # unreadable (being written, or its writer died mid-write): held, until a minute old
        since = os.lstat(path).st_mtime
    except OSError:
        since = time.time()
    return {"pid": None, "host": None, "since": since}


def _remove_claim_file(path: Path) -> None:
    """Remove a dead claim moved out of the way: a file, a link (not what it points to) or an old
    directory claim with what it holds."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def claim(key: str, root: Path | None = None, log: Callable[[str], None] | None = None) -> tuple[bool, dict | None]:
    """Claim the run ``key`` for this process: an atomic exclusive create of ``runs/.<key>.claim``
    holding the pid and host. A claim whose owner is dead (same host, pid gone), one that is no claim
    (:func:`claim_problem`: a pid that is not a process id, ...; reported to ``log`` in one line), or an
    unreadable one (a folder of an older queue, a link, a file cut short) over a minute old, is taken
    over and removed, leaving nothing behind; another host's claim holds until it is released.
    Returns (claimed, the current owner when not)."""
    path = _claim_path(key, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = claim_owner(key, root)
            if owner is None:
                continue  # released meanwhile: try again
            invalid = owner.get("invalid")
            dead = invalid is not None or (owner.get("host") == socket.gethostname()
                                           and isinstance(owner.get("pid"), int) and not _alive(owner["pid"]))
            dead = dead or (owner.get("pid") is None
                            and time.time() - float(owner.get("since") or 0) > UNREADABLE_CLAIM_S)
            if not dead:
                return False, owner
            stale = path.with_name(f"{path.name}.stale-{os.getpid()}")
            _remove_claim_file(stale)  # a leftover of this pid's earlier take-over
            try:
                os.replace(path, stale)  # one taker wins the rename; the others find it gone
            except FileNotFoundError:
                continue
            moved = _read_moved(stale)
            if moved != owner and claim_problem(moved) is None:  # a live taker's fresh claim: put it back
                try:
                    os.link(stale, path)
                except FileExistsError:
                    pass
            elif invalid is not None and log is not None:
                log(f"claim {path.name}: {invalid}; taken over")
            _remove_claim_file(stale)
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(mine)
        return True, None
    return False, claim_owner(key, root)


def _read_moved(path: Path) -> Any:
    """The content of a claim file moved aside (None when it is not a readable claim file)."""
    try:
        return json.loads(read_regular(path, limit=4096))
    except (OSError, ValueError, RecursionError):
        return None


def release(key: str, root: Path | None = None) -> None:
    """Remove this process's claim on ``key`` (another owner's claim is left alone)."""
    owner = claim_owner(key, root)
    if owner is not None and owner.get("pid") == os.getpid():
        _claim_path(key, root).unlink(missing_ok=True)


# ----------------------------------------------------------------------------- data


def missing_data(items: Iterable[QueueItem]) -> dict[str, str | None]:
    """Dataset -> why its data is absent here (None: present), for the datasets of ``items``."""
    return {dataset: data_missing(dataset) for dataset in dict.fromkeys(i.dataset for i in items)}
