"""JSON result store with atomic writes and checksums.

One file per key: ``{"sha256": <hex of the payload's canonical JSON>, "payload": {...}}``.
Writes go to a temporary file in the same folder and are renamed into place, so a killed
process never leaves a half-written entry. Reading never deletes anything: an entry that is
unreadable, fails its checksum or fails the caller's check (``get(key, check=...)``: another
config's numbers, a wrong schema, NaN scores) is reported once by a warning and treated as
missing; in an ordinary cache it is set aside as ``<key>.json.invalid-<n>`` (kept for
inspection), in a protected store (``protect=True``, the committed ``results/``) a reader
leaves it where it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

_REPORTED: set[tuple[str, str]] = set()  # (path, problem) already warned about in this process


def default_cache_root() -> Path:
    """``$FEDLIB_CACHE`` or ``~/.cache/fedlib``."""
    env = os.environ.get("FEDLIB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "fedlib"


def _digest(payload: Any) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _report(path: Path, problem: str, action: str) -> None:
    if (str(path), problem) not in _REPORTED:
        _REPORTED.add((str(path), problem))
        warnings.warn(f"result entry {path}: {problem}; {action}", RuntimeWarning, stacklevel=4)


class ResultCache:
    """Checksummed JSON entries under ``root`` (default: ``<cache root>/runs``).

    ``protect=True`` (the committed ``results/`` store): a reader never renames or deletes an
    entry; only a writer replacing an invalid entry first moves it aside."""

    def __init__(self, root: str | Path | None = None, *, protect: bool = False):
        self.root = Path(root) if root is not None else default_cache_root() / "runs"
        self.protect = protect
        self._remove_stale_temporaries()

    def _remove_stale_temporaries(self, older_than_s: float = 3600.0) -> None:
        """Temporary files of writers killed mid-write (never read as entries) are removed
        once they are clearly abandoned."""
        import time

        if not self.root.is_dir():
            return
        now = time.time()
        for tmp in self.root.glob(".*.tmp"):
            try:
                if now - tmp.stat().st_mtime > older_than_s:
                    tmp.unlink()
            except OSError:
                pass

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def read(self, key: str) -> tuple[dict | None, str | None]:
        """(payload, None) for a readable entry with a matching checksum, else (None, problem);
        (None, None) when there is no entry. Nothing is reported or moved."""
        path = self.path(key)
        if not path.exists() and not path.is_symlink():
            return None, None
        if not path.is_file():
            return None, "not a regular file"
        try:
            entry = json.loads(path.read_text())
            payload = entry["payload"]
            if entry["sha256"] != _digest(payload):
                return None, "checksum mismatch (edited or damaged)"
        except (ValueError, KeyError, TypeError, OSError, RecursionError) as err:
            return None, f"unreadable ({type(err).__name__})"
        if not isinstance(payload, dict):
            return None, "payload is not a mapping"
        return payload, None

    def get(self, key: str, check: Callable[[dict], str | None] | None = None) -> dict | None:
        """The stored payload, or None when absent or invalid. ``check(payload)`` returns a problem
        (text) or None. An invalid entry is reported once; in an unprotected cache it is set aside."""
        payload, problem = self.read(key)
        if problem is None and payload is not None and check is not None:
            try:
                problem = check(payload)
            except Exception as err:  # noqa: BLE001 - a malformed payload must not crash the lookup
                problem = f"invalid content ({type(err).__name__}: {str(err)[:120]})"
        if problem is None:
            return payload
        if self.protect:
            _report(self.path(key), problem, "skipped (a stored result is never moved by reading it)")
        else:
            aside = self.set_aside(key)
            _report(self.path(key), problem, f"set aside as {aside.name}, recomputing" if aside else "ignored")
        return None

    def set_aside(self, key: str) -> Path | None:
        """Rename the entry to ``<key>.json.invalid-<n>`` (the first free n); never deletes."""
        path = self.path(key)
        for n in range(1, 10_000):
            target = path.with_name(f"{path.name}.invalid-{n}")
            if not target.exists():
                try:
                    os.replace(path, target)
                    return target
                except OSError:
                    return None
        return None

    def put(self, key: str, payload: dict) -> Path:
        path = self.path(key)
        if path.exists() and self.read(key)[1] is not None:  # never overwrite an invalid entry: keep it aside
            self.set_aside(key)
        atomic_write_text(path, json.dumps({"sha256": _digest(payload), "payload": payload}, indent=1))
        return path

    def __contains__(self, key: str) -> bool:
        return self.read(key)[0] is not None
