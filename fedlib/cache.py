"""JSON result store with atomic writes and checksums.

One file per key: ``{"sha256": <hex of the payload's canonical JSON>, "payload": {...}}``, as
``<key>.json``, or as the compact record ``<key>.json.zd`` (``compress=True``, the default of the committed
``results/`` store): its per-round history as numeric columns (:mod:`fedlib.record`; the checksum covers the
payload as written, and a reader gets the history back as per-round mappings), the entry's JSON text
deflated against a fixed preset dictionary (:data:`DICTIONARY_FILES`: JSON text of typical entries, so the
keys, config and provenance every entry repeats cost almost nothing). The file is :data:`ZD_MAGIC` then
the raw deflate stream; ``python -m fedlib.cache <file>`` prints it as JSON. The earlier forms are
read: ``<key>.json.gz`` (gzip, history columns-1 or a list of rounds) and plain ``<key>.json``.
Writes go to a temporary file in the same folder and are renamed into place, so a killed
process never leaves a half-written entry. Reading never deletes anything: an entry that is
unreadable, fails its checksum or fails the caller's check (``get(key, check=...)``: another
config's numbers, a wrong schema, NaN scores) is reported once by a warning and treated as
missing; in an ordinary cache it is set aside as ``<key>.json.invalid-<n>`` (kept for
inspection), in a protected store (``protect=True``, the committed ``results/``) a reader
leaves it where it is. Only regular files are read (a symbolic link, FIFO or device is refused
without being opened), at most :data:`MAX_ENTRY_BYTES` of them. No reader removes anything, not
even a killed writer's temporary file (a writer does, once it is an hour old). A store's folder is
listed by :func:`scan_folder` (``lstat`` only): an entry-named file no reader opens (a link, looping,
dangling or not, a FIFO, a directory, a name that is not a key) is left out with one line, never moved.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.resources
import json
import os
import re
import stat
import sys
import tempfile
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError, shown
from .record import compact, expand

_REPORTED: set[tuple[str, str]] = set()  # (path, problem) already warned about in this process
FORMS = (".json.zd", ".json.gz", ".json")  # an entry's file forms, the one read first first
ZD_MAGIC = b"fedlib.entry/zd-1\n"  # the compact form's first bytes: its container and dictionary version
DICTIONARY_FILES = {ZD_MAGIC: "record_dictionary_1.txt"}  # never edited: a new dictionary is a new version
DICTIONARY_SHA256 = {ZD_MAGIC: "37784a77fdceb0c2254ec0593e90480339ccfcc0f2803efca15fed53498d1ff5"}
MAX_ENTRY_BYTES = 64 * 2**20  # a stored run is well under 1 MB; anything past this is not read


class CacheWriteWarning(RuntimeWarning):
    """A finished result could not be kept (full disk, read-only or foreign folder, a file in the
    way); the result itself is still returned. The message is one line naming the path and cause."""


def write_failure(err: OSError, path: Path) -> str:
    """``<path>: <cause>`` of a failed write, one line (the path the system names, else ``path``)."""
    where = err.filename if isinstance(getattr(err, "filename", None), str) else str(path)
    cause = err.strerror or type(err).__name__
    return f"{where}: {cause}".replace("\n", " ")


def as_store(cache: "bool | ResultCache") -> "ResultCache | None":
    """``cache`` of ``fedlib.run`` and friends: True (the default cache), False (none) or a
    ``ResultCache``; anything else (``"no"``, 0, None) is a one-line ConfigError."""
    if isinstance(cache, ResultCache):
        return cache
    if cache is True or cache is False:
        return ResultCache() if cache else None
    raise ConfigError(f"cache: must be True, False or a fedlib.cache.ResultCache (got {shown(cache)})")


def read_regular(path: Path, limit: int = MAX_ENTRY_BYTES) -> bytes:
    """The bytes of ``path`` when it is a regular file (not a symbolic link, FIFO, socket or
    device) of at most ``limit`` bytes; else ``ValueError`` naming what it is. Never blocks on a
    FIFO and never reads past ``limit``."""
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        kind = ("a symbolic link" if stat.S_ISLNK(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file")
        raise ValueError(f"{kind}, not a regular file (refused)")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)  # the file opened (it may have been swapped since the lstat)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file (refused)")
        if info.st_size > limit:
            raise ValueError(f"too large ({info.st_size} bytes; at most {limit})")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise ValueError(f"too large (more than {limit} bytes)")
        return b"".join(chunks)
    finally:
        os.close(fd)


def default_cache_root() -> Path:
    """``$FEDLIB_CACHE`` or ``~/.cache/fedlib``."""
    env = os.environ.get("FEDLIB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "fedlib"


def _digest(payload: Any) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def gunzip_bounded(blob: bytes, limit: int = MAX_ENTRY_BYTES) -> bytes:
    """The gzip ``blob`` decompressed, refusing (ValueError) more than ``limit`` bytes of output."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = inflater.decompress(blob, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise ValueError(f"too large once decompressed (more than {limit} bytes)")
    if not inflater.eof:
        raise ValueError("truncated gzip data")
    return out


_DICTIONARIES: dict[bytes, bytes] = {}


def _dictionary(magic: bytes) -> bytes:
    """The preset dictionary a compact entry names, checked against its recorded digest."""
    if magic not in _DICTIONARIES:
        data = importlib.resources.files("fedlib").joinpath(DICTIONARY_FILES[magic]).read_bytes()
        if hashlib.sha256(data).hexdigest() != DICTIONARY_SHA256[magic]:
            raise ValueError(f"{DICTIONARY_FILES[magic]} is not the dictionary its entries were written with")
        _DICTIONARIES[magic] = data
    return _DICTIONARIES[magic]


def zd_compress(text: bytes) -> bytes:
    """The compact container: :data:`ZD_MAGIC`, then ``text`` deflated against its preset dictionary."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, _dictionary(ZD_MAGIC))
    return ZD_MAGIC + deflater.compress(text) + deflater.flush()


def zd_decompress(blob: bytes, limit: int = MAX_ENTRY_BYTES) -> bytes:
    """The text of a compact container (ValueError when it is not one, is damaged or truncated, or holds
    more than ``limit`` bytes)."""
    magic = blob[:len(ZD_MAGIC)]
    if magic not in DICTIONARY_FILES:
        raise ValueError("not a compact fedlib entry (unknown first bytes)")
    inflater = zlib.decompressobj(wbits=-15, zdict=_dictionary(magic))
    out = inflater.decompress(blob[len(magic):], limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise ValueError(f"too large once decompressed (more than {limit} bytes)")
    if not inflater.eof or inflater.unused_data:
        raise ValueError("truncated or trailing deflate data")
    return out


def _decoded(name: str, content: bytes) -> bytes:
    """An entry file's JSON text, by its form."""
    if name.endswith(".zd"):
        return zd_decompress(content)
    return gunzip_bounded(content) if name.endswith(".gz") else content


def load_entry(path: str | Path) -> dict:
    """A store file (any form) as written: ``{"sha256": ..., "payload": ...}``, unchecked (for
    inspection; readers use :meth:`ResultCache.read`). From a shell: ``python -m fedlib.cache <file>``."""
    return json.loads(_decoded(str(path), read_regular(Path(path))))


def key_of(path: Path) -> str:
    """The key of a store file: its name without its form's suffix (:data:`FORMS`)."""
    name = path.name
    suffix = next((form for form in FORMS if name.endswith(form)), "")
    return name[:-len(suffix)] if suffix else name


def atomic_write_text(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # what a key may be (config keys are hex)


def shown_name(name: str, limit: int = 120) -> str:
    """A file name as one printable line: bytes that are not UTF-8 as ``\\xNN``, control characters
    escaped, at most ``limit`` characters."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def special_kind(path: Path, info: os.stat_result, root: Path) -> str:
    """What a file that is not a regular one is, in words (a link: looping, dangling or leaving ``root``)."""
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        shown = shown_name(target, 60)
        try:
            resolved = path.resolve(strict=True)
        except FileNotFoundError:
            return f"a dangling symbolic link (to {shown})"
        except (OSError, RuntimeError):  # ELOOP (RuntimeError before Python 3.13)
            return "a symbolic link that loops"
        try:
            resolved.relative_to(root.resolve())
            return f"a symbolic link (to {shown})"
        except (ValueError, OSError, RuntimeError):
            return f"a symbolic link to outside the store ({shown})"
    if stat.S_ISFIFO(info.st_mode):
        return "a FIFO"
    if stat.S_ISDIR(info.st_mode):
        return "a directory"
    if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        return "a device"
    if stat.S_ISSOCK(info.st_mode):
        return "a socket"
    return "not a regular file"


@dataclass
class StoreScan:
    """A store folder as files (:func:`scan_folder`): ``entries`` (key, path) of the regular files a
    reader may open, one per key (the one :meth:`ResultCache.path` reads: compressed first), sorted by
    key; ``left_out`` one line ``<name> (<why>)`` per entry-named file no reader opens (a link, a FIFO,
    a directory, a device, a name that is not a key)."""

    root: Path
    entries: list[tuple[str, Path]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


def scan_folder(root: Path) -> StoreScan:
    """The entry-named files (:data:`FORMS`, not hidden) of ``root``, each looked at with
    ``lstat`` only: nothing is opened, followed, moved or deleted; a missing folder is an empty store."""
    root = Path(root)
    out = StoreScan(root)
    found = []
    try:
        with os.scandir(root) as listing:
            for e in listing:
                if e.name.startswith(".") or not e.name.endswith(FORMS):
                    continue
                try:
                    found.append((e.name, os.lstat(e.path)))
                except OSError:  # gone meanwhile: not in the store
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return out
    except OSError as err:
        out.left_out.append(f"{shown_name(root.name)} (the store folder is unreadable: {err.strerror})")
        return out
    by_key: dict[str, dict[str, os.stat_result]] = {}
    for name, info in found:
        by_key.setdefault(key_of(Path(name)), {})[name] = info
    for key in sorted(by_key, key=os.fsencode):
        forms = by_key[key]
        name = next(key + form for form in FORMS if key + form in forms)  # as ResultCache.path reads it
        info, path = forms[name], root / name
        if not stat.S_ISREG(info.st_mode):
            out.left_out.append(f"{shown_name(name)} ({special_kind(path, info, root)}, not a regular file)")
        elif not _utf8(key):
            out.left_out.append(f"{shown_name(name)} (its name is not valid UTF-8)")
        elif not KEY_NAME.fullmatch(key):
            out.left_out.append(f"{shown_name(name)} (its name is not a key: letters, digits, '.', '_', '-')")
        else:
            out.entries.append((key, path))
    return out


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes of the name, kept as surrogates by os.fsdecode
        return False
    return True


def _report(path: Path, problem: str, action: str) -> None:
    if (str(path), problem) not in _REPORTED:
        _REPORTED.add((str(path), problem))
        warnings.warn(f"result entry {path}: {problem}; {action}", RuntimeWarning, stacklevel=4)


class ResultCache:
    """Checksummed JSON entries under ``root`` (default: ``<cache root>/runs``).

    ``protect=True`` (the committed ``results/`` store): a reader never renames or deletes an
    entry; only a writer replacing an invalid entry first moves it aside. ``compress`` (default:
    ``protect``): entries are written as ``<key>.json.zd``; a writer replacing a valid entry in another
    form removes it once the new one is in place. Every form is read, in the order of :data:`FORMS`."""

    def __init__(self, root: str | Path | None = None, *, protect: bool = False, compress: bool | None = None):
        self.root = Path(root) if root is not None else default_cache_root() / "runs"
        self.protect = protect
        self.compress = protect if compress is None else compress

    def entry_paths(self) -> list[Path]:
        """One file per stored key, sorted by key: the one :meth:`path` reads (compressed first)."""
        if not self.root.is_dir():
            return []
        keys = {key_of(p) for form in FORMS for p in self.root.glob(f"*{form}")}
        return [self.path(key) for key in sorted(keys)]

    def scan(self) -> "StoreScan":
        """The store's folder as files, without opening any: :class:`StoreScan`."""
        return scan_folder(self.root)

    def _remove_stale_temporaries(self, older_than_s: float = 3600.0) -> None:
        """Temporary files of writers killed mid-write (never read as entries) are removed once
        they are clearly abandoned; only a writer of an ordinary cache does this (never a reader)."""
        if self.protect or not self.root.is_dir():
            return
        now = time.time()
        for tmp in self.root.glob(".*.tmp"):
            try:
                if now - tmp.stat().st_mtime > older_than_s:
                    tmp.unlink()
            except OSError:
                pass

    def path(self, key: str) -> Path:
        """The entry's file: the one there (in the order of :data:`FORMS`), else where a write would put it."""
        for form in FORMS:
            if os.path.lexists(path := self.root / f"{key}{form}"):
                return path
        return self.root / f"{key}{FORMS[0] if self.compress else '.json'}"

    def read(self, key: str) -> tuple[dict | None, str | None]:
        """(payload, None) for a readable entry with a matching checksum, else (None, problem);
        (None, None) when there is no entry. Nothing is reported or moved."""
        path = self.path(key)
        try:
            content = read_regular(path)
        except FileNotFoundError:
            return None, None
        except NotADirectoryError:  # the cache root is a file: nothing stored there
            return None, None
        except ValueError as err:
            return None, str(err)
        except OSError as err:
            return None, f"unreadable ({err.strerror or type(err).__name__})"
        return self.parse(path, content)

    @staticmethod
    def parse(path: Path, content: bytes, expanded: bool = True) -> tuple[dict | None, str | None]:
        """(payload, None) of the bytes ``content`` of the entry file ``path`` (decoded by its form) when
        they hold an entry with a matching checksum, else (None, problem). ``expanded=False``:
        a compact record's history is left in its columns (``fedlib.record``; the store's listing decodes a
        run's history only when it is read)."""
        try:
            entry = json.loads(_decoded(path.name, content))
            payload = entry["payload"]
            if entry["sha256"] != _digest(payload):
                return None, "checksum mismatch (edited or damaged)"
        except (ValueError, KeyError, TypeError, OSError, RecursionError, EOFError, zlib.error) as err:
            return None, f"unreadable ({type(err).__name__})"
        if not isinstance(payload, dict):
            return None, "payload is not a mapping"
        if not expanded:
            return payload, None
        try:
            return expand(payload), None  # a compact record's columnar history, decoded (fedlib.record)
        except (ValueError, KeyError, TypeError, IndexError, zlib.error) as err:
            return None, f"unreadable history columns ({type(err).__name__})"

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

    def put(self, key: str, payload: dict, check: Callable[[dict], str | None] | None = None) -> Path:
        """Write the entry (atomically). An entry already there that is invalid (unreadable, wrong
        checksum, not a regular file, or failing ``check``) is first set aside, never overwritten.
        An ``OSError`` (full disk, read-only folder, ...) is raised: see :meth:`keep`."""
        path = self.path(key)
        if os.path.lexists(path):
            old, problem = self.read(key)
            if problem is None and old is not None and check is not None:
                try:
                    problem = check(old)
                except Exception as err:  # noqa: BLE001 - a malformed entry is an invalid one
                    problem = type(err).__name__
            if problem is not None and self.set_aside(key) is None:
                raise OSError(errno.EEXIST, f"an invalid entry is in the way and cannot be set aside ({problem})",
                              str(path))
        if self.compress:  # the committed store keeps the compact record (fedlib.record)
            payload = compact(payload)
        text = json.dumps({"sha256": _digest(payload), "payload": payload}, indent=None if self.compress else 1,
                          separators=(",", ":") if self.compress else None)
        target = self.root / f"{key}{FORMS[0] if self.compress else '.json'}"
        atomic_write_text(target, zd_compress(text.encode()) if self.compress else text)
        if target != path and os.path.lexists(path):  # the valid entry in another form, now replaced
            os.unlink(path)
        self._remove_stale_temporaries()
        return target

    def keep(self, key: str, payload: dict) -> Path | None:
        """:meth:`put`, but a failed write is one :class:`CacheWriteWarning` line (path and cause)
        instead of an exception: a finished result is returned even when it cannot be cached."""
        try:
            return self.put(key, payload)
        except OSError as err:
            warnings.warn(f"could not cache the result ({write_failure(err, self.path(key))}); "
                          "it is returned but not kept", CacheWriteWarning, stacklevel=3)
            return None

    def __contains__(self, key: str) -> bool:
        return self.read(key)[0] is not None


if __name__ == "__main__":  # python -m fedlib.cache <entry file>...: each as JSON (any form), unchecked
    for name in sys.argv[1:]:
        print(json.dumps(load_entry(name), indent=1))
