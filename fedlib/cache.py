"""JSON result store with atomic writes and checksums.

One file per key: ``{"sha256": <hex of the payload's canonical JSON>, "payload": {...}}``.
Writes go to a temporary file in the same folder and are renamed into place, so a killed
process never leaves a half-written entry; an entry whose checksum does not match (a
corrupted or hand-edited file) is reported as missing and recomputed by the caller.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


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


class ResultCache:
    """Checksummed JSON entries under ``root`` (default: ``<cache root>/runs``)."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_cache_root() / "runs"
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

    def get(self, key: str) -> dict | None:
        """The stored payload, or None when absent or corrupted (the bad file is removed)."""
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text())
            payload = entry["payload"]
            if entry["sha256"] != _digest(payload):
                raise ValueError("checksum mismatch")
        except (ValueError, KeyError, TypeError, OSError):
            path.unlink(missing_ok=True)
            return None
        return payload

    def put(self, key: str, payload: dict) -> Path:
        path = self.path(key)
        atomic_write_text(path, json.dumps({"sha256": _digest(payload), "payload": payload}, indent=1))
        return path

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None
