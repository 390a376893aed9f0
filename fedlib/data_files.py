"""Reading a dataset's files safely, whatever their source.

The one-line errors (``DataNotFoundError``, ``DataAccessError``, ``DataCorruptError``, ``path_problem``),
the raw image arrays a reader returns (``_ImageArrays``) and their checks, the ``.npz`` cache of decoded
image sets (keyed by the source's size and mtime, holding its content fingerprint and its arrays' hash)
and the content fingerprints of source files. ``fedlib.data_sources`` reads each source with these;
``fedlib.data`` is the public entry (``load_dataset``).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import stat
import tempfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .cache import atomic_write_text, default_cache_root, read_regular
from .errors import SHOWN_CHARS, clipped

_CACHE_FORMAT = 2  # 2: the npz records its source's content fingerprint and its arrays' hash
_ARRAY_FIELDS = ("x_train", "y_train", "x_test", "y_test")


def _one_line(text: str) -> str:
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip()


class DataNotFoundError(FileNotFoundError):
    """A dataset's files are in none of the places looked at and could not be downloaded."""

    def __init__(self, message: str):
        super().__init__(_one_line(message))


class DataAccessError(DataNotFoundError):
    """A data path that is not opened (a FIFO, a device, anything under /dev) or cannot be read
    (permission); the message is one line naming the path."""


def path_problem(path, *, directory: bool = False) -> str | None:
    """Why ``path`` cannot be data, in words (None: it can be, or it does not exist yet): a NUL byte,
    anything under /dev (``/dev/zero`` reads forever), a loop of symbolic links, a FIFO (blocks), a
    device or socket, a path that cannot be read; with ``directory``, anything but a directory.
    Checked before anything is opened; the one statement of these rules (configs use it too)."""
    try:
        text = os.fspath(path)
    except TypeError:
        return f"is not a path ({type(path).__name__})"
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\x00" in text:
        return "contains a NUL byte"
    real = os.path.realpath(text)
    if real == "/dev" or real.startswith("/dev/"):
        return "is under /dev (a device, not data)"
    try:
        mode = os.stat(text).st_mode
    except FileNotFoundError:
        return None  # the caller says what is missing (or a download makes it)
    except PermissionError:
        return "permission denied"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a loop of symbolic links"
        return f"cannot be read ({err.strerror or type(err).__name__})"
    except ValueError as err:
        return f"cannot be read ({_one_line(err)})"
    if stat.S_ISDIR(mode) or (stat.S_ISREG(mode) and not directory):
        return None
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
        "a socket" if stat.S_ISSOCK(mode) else "a file" if stat.S_ISREG(mode) else "not a regular file"
    return f"is {kind}, not a directory" if directory else f"is {kind}, not a regular file or directory"


def _check_data_path(path: Path, label: str, directory: bool = False) -> None:
    """Only regular files and directories are data (see :func:`path_problem`); anything else is a
    one-line DataAccessError naming the path, before it is opened."""
    problem = path_problem(path, directory=directory)
    if problem is not None:
        raise DataAccessError(f"{clipped(label)}: {clipped(path, 2 * SHOWN_CHARS)} {problem}; refused")


def _access_errors_in_one_line(function):
    """A PermissionError (or another OS error naming a file) while reading data becomes a one-line
    DataAccessError naming the path, not a traceback; so does a path that cannot be data (a NUL byte,
    a loop of symbolic links)."""
    @functools.wraps(function)
    def wrapper(name, *args, **kwargs):
        root = kwargs.get("root", args[0] if args else None)
        if root is not None and isinstance(name, str) and name != "synthetic":
            _check_data_path(root, f"{name}: data root", directory=True)
        try:
            return function(name, *args, **kwargs)
        except DataNotFoundError:
            raise
        except PermissionError as err:
            raise DataAccessError(f"{clipped(name)}: {clipped(err.filename or 'a data file', 2 * SHOWN_CHARS)}: "
                                  "permission denied") from None
        except IsADirectoryError as err:
            raise DataAccessError(f"{clipped(name)}: {clipped(err.filename, 2 * SHOWN_CHARS)}: a directory where a "
                                  "file was expected") from None
        except OSError as err:  # a loop of symbolic links, an I/O error, a name too long
            where = clipped(err.filename, 2 * SHOWN_CHARS) if err.filename else "a data file"
            raise DataAccessError(f"{clipped(name)}: {where}: cannot be read "
                                  f"({err.strerror or type(err).__name__})") from None

    return wrapper


class DataCorruptError(ValueError):
    """A data file exists but cannot be decoded (truncated, bad header, wrong length)."""

    def __init__(self, message: str):
        super().__init__(_one_line(message))

@dataclass
class _ImageArrays:
    """Decoded data before normalization: uint8 images [N, H, W, C], int64 labels [N]."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str]
    source: str




def _check_arrays(arrays: _ImageArrays) -> None:
    """Raise DataCorruptError unless images and labels have the expected types and sizes."""
    for x, y in ((arrays.x_train, arrays.y_train), (arrays.x_test, arrays.y_test)):
        consistent = (
            x.dtype == np.uint8 and x.ndim == 4 and y.dtype == np.int64 and y.shape == (len(x),)
            and x.shape[1:] == arrays.x_train.shape[1:]
            and (y.size == 0 or (y.min() >= 0 and y.max() < len(arrays.classes)))
        )
        if not consistent:
            raise DataCorruptError(
                f"inconsistent images/labels read from {arrays.source}: images {x.dtype} "
                f"{x.shape}, labels {y.dtype} {y.shape}, {len(arrays.classes)} classes"
            )
    for split, y in (("train", arrays.y_train), ("test", arrays.y_test)):
        counts = np.bincount(y, minlength=len(arrays.classes))
        if len(y) == 0 or not counts.all():
            missing = [arrays.classes[c] for c in np.flatnonzero(counts == 0)][:5]
            raise DataCorruptError(
                f"incomplete data read from {arrays.source}: the {split} split has {len(y)} images and "
                f"no image of class(es) {missing} (truncated or partial copy?)"
            )




def _not_found(name: str, looked: Iterable[Path], download: bool, error: Exception | None = None):
    """The one-line DataNotFoundError: what was looked at, why nothing came, how to fix it."""
    if download:
        status = "download failed"
        if error:
            status += f" ({type(error).__name__}: {error})"
    else:
        status = "download disabled (download=False or FEDLIB_DOWNLOAD=0)"
        if error:
            status += f"; torchvision: {error}"
    advice = "Provide them: put the files in one of those places (root=... or FEDLIB_DATA)"
    if name == "fmnist":
        advice += ", or apt-get install dataset-fashion-mnist"
    if not download:
        advice += ", or allow downloading (download=True or FEDLIB_DOWNLOAD=1)"
    paths = ", ".join(str(path) for path in looked)
    return DataNotFoundError(
        f"{name}: data files not found; looked in {paths}; {status}. {advice}."
    )



# ----------------------------------------------------------------------------- cache


def _cache_file(cache_dir, label: str, source: Path, extra: list | None = None) -> Path:
    """The cache path for ``source``: its name hashes the path, file sizes and mtimes."""
    root = cache_dir or default_cache_root() / "datasets"
    key = json.dumps([_CACHE_FORMAT, str(source.resolve()), _fingerprint(source), extra])
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")[-60:]
    return Path(root).expanduser() / f"{readable}-{digest}.npz"


def _fingerprint(source: Path) -> list:
    """Size and mtime of a file, or of every file below a directory."""
    if not source.is_dir():
        stat = source.stat()
        return [stat.st_size, stat.st_mtime_ns]
    entries = []
    for file in sorted(source.rglob("*")):
        if file.is_file():
            stat = file.stat()
            entries.append([file.relative_to(source).as_posix(), stat.st_size, stat.st_mtime_ns])
    return entries


def _cached(cache_file: Path, build: Callable[[], _ImageArrays], source_sha256: str) -> _ImageArrays:
    """Arrays from ``cache_file`` if it records ``source_sha256`` (the content fingerprint of the
    files it was decoded from) and its arrays still hash to the value it records; otherwise
    (missing, unreadable, another source, altered arrays) build them and write it anew."""
    if os.path.lexists(cache_file) and not (cache_file.is_file() and not cache_file.is_symlink()):
        warnings.warn(f"rebuilding dataset cache {cache_file}: not a regular file")
    elif cache_file.exists():
        try:
            return _read_cache(cache_file, source_sha256)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
            warnings.warn(f"rebuilding dataset cache {cache_file}: {_one_line(error)}")
    arrays = build()
    _write_cache(cache_file, arrays, source_sha256)
    return arrays


def _arrays_sha256(arrays: _ImageArrays) -> str:
    digest = hashlib.sha256()
    for key in _ARRAY_FIELDS:
        value = np.ascontiguousarray(getattr(arrays, key))
        digest.update(f"{key}{value.dtype}{value.shape}".encode())
        digest.update(value.tobytes())
    digest.update(json.dumps([list(arrays.classes), arrays.source]).encode())
    return digest.hexdigest()


def _read_cache(cache_file: Path, source_sha256: str) -> _ImageArrays:
    with np.load(cache_file, allow_pickle=False) as npz:
        arrays = _ImageArrays(
            **{key: npz[key] for key in _ARRAY_FIELDS},
            classes=npz["classes"].tolist(),
            source=str(npz["source"]),
        )
        recorded_source = str(npz["source_sha256"]) if "source_sha256" in npz else None
        recorded_arrays = str(npz["arrays_sha256"]) if "arrays_sha256" in npz else None
    if recorded_source != source_sha256:
        raise ValueError("it was decoded from other source files (or records no source fingerprint)")
    if recorded_arrays != _arrays_sha256(arrays):
        raise ValueError("its arrays do not match the hash it records")
    _check_arrays(arrays)
    return arrays


def _write_cache(cache_file: Path, arrays: _ImageArrays, source_sha256: str) -> None:
    """Write atomically (a temporary file in the same folder, then os.replace); warn on failure."""
    temporary = None
    try:
        folder = cache_file.parent
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".tmp", delete=False) as handle:
            temporary = Path(handle.name)
            np.savez(
                handle,
                **{key: getattr(arrays, key) for key in _ARRAY_FIELDS},
                classes=np.array(arrays.classes, dtype=str),
                source=np.array(arrays.source, dtype=str),
                source_sha256=np.array(source_sha256, dtype=str),
                arrays_sha256=np.array(_arrays_sha256(arrays), dtype=str),
            )
        os.chmod(temporary, 0o644)  # NamedTemporaryFile makes it private
        os.replace(temporary, cache_file)
    except OSError as error:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        warnings.warn(f"could not write dataset cache {cache_file}: {error}")



_FINGERPRINT_MEMO: dict[str, dict] = {}


def _source_files(base: Path, only: list[str] | None = None) -> list[tuple[str, Path]]:
    if only is not None:
        return [(n, base / n) for n in only]
    if base.is_file():
        return [(base.name, base)]
    names = ("train_32x32.mat", "test_32x32.mat") if (base / "train_32x32.mat").is_file() else None
    if names:  # svhn: the two files at the root, not everything below it
        return [(n, base / n) for n in names]
    return [(f.relative_to(base).as_posix(), f) for f in sorted(base.rglob("*")) if f.is_file()]


def _content_fingerprint(base: Path, only: list[str] | None = None) -> dict:
    files = _source_files(base, only)
    stats = [(rel, f.stat()) for rel, f in files]
    stamp = json.dumps([str(base.resolve()), [[rel, st.st_size, st.st_mtime_ns] for rel, st in stats]])
    stamp_digest = hashlib.sha256(stamp.encode()).hexdigest()[:32]
    if stamp_digest in _FINGERPRINT_MEMO:
        return _FINGERPRINT_MEMO[stamp_digest]
    stored = default_cache_root() / "fingerprints" / f"{stamp_digest}.json"
    result = None
    try:
        candidate = json.loads(read_regular(stored, limit=1 << 20))
        if candidate.get("stamp") == stamp:
            result = candidate["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        result = None
    if result is None:
        rows = [[rel, st.st_size, _file_sha256(f)] for (rel, f), (_, st) in zip(files, stats)]
        digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
        result = {"files": [[rel, size] for rel, size, _ in rows], "sha256": digest}
        try:
            atomic_write_text(stored, json.dumps({"stamp": stamp, "fingerprint": result}))
        except OSError as error:
            warnings.warn(f"could not keep the data fingerprint in {stored}: {error}")
    if len(result["files"]) > 50:  # provenance stays small: the count, not every name
        result = {"files": [[f"{len(result['files'])} files", sum(s for _, s in result["files"])]],
                  "sha256": result["sha256"]}
    _FINGERPRINT_MEMO[stamp_digest] = result
    return result


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


