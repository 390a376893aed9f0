"""The compact stored record: a run's per-round history as numeric columns, losslessly.

A run's ``history`` is a list of per-round mappings (accuracy, loss, the clients' weights and scores,
per-class accuracy, the monitor's statistics, a method's diagnostics, ...). As JSON text every number
costs about 20 characters. :func:`encode_history` turns it into columns (``columns-2``): each key becomes
one array over the rounds, stored as its bytes (float32 where every value is a float32 exactly, as most
of the engine's numbers are; float64 otherwise; integers and booleans as such; accuracies as whole
numerators over their denominator), each row XOR-ed with the previous one, less the previous one, or as
it is (whichever compresses best: a value that does not change costs nothing, a count that grows costs
its steps), byte-shuffled; the columns' bytes follow one another in one LZMA stream, written as base85
text inside the JSON (``blob``, with its ``size``), each column naming its transform and place (``t``,
``at``). Lists of varying length, values absent in some rounds and nested mappings have their own column
kinds; anything else stays JSON. The earlier ``columns-1`` (each column deflated on its own) is read.

The encoding is lossless by construction: every column is decoded again while encoding and kept as
plain JSON unless the decoded values are the given ones exactly (same JSON text: ints stay ints, floats
stay floats, bit for bit). :func:`decode_history` gives back the list of mappings.

What a stored record keeps (``STORED_PRECISION``, applied by :func:`reduce_history` before encoding):
the metrics the book reads (accuracy, loss, balanced accuracy, F1, per-class accuracy, learning rate),
every integer and everything outside the history stay exact. The clients' per-round values (weights,
scores, similarities, a method's diagnostics) keep 17 significant bits (a float32 with its 7 lowest
mantissa bits rounded off: relative change at most 2**-17, about 7.6e-6, thirteen times finer than the
1e-4 within which the determinism contract lets another CPU's weights differ). The poisoning monitor's
statistics and the timings keep 11 significant bits (relative change at most 2**-11, float32's exponent
range, so a tiny ratio stays tiny): the monitor judges them against thresholds of 4, 10 and a cosine's
sign, and a timing varies between runs by far more.
"""

from __future__ import annotations

import base64
import json
import lzma
import zlib
from typing import Any

import numpy as np

FORMAT = "fedlib.history/columns-2"
FORMATS = ("fedlib.history/columns-1", FORMAT)  # what is read; columns-1 is the earlier record
_KINDS = {"f": "float", "i": "int", "b": "bool"}
_TRANSFORMS = ("x", "d", "n")
LEADING_COLUMNS = ("round", "accuracy", "balanced_accuracy")  # first in the blob: what the store's listing checks  # a column's rows: XOR-ed with the previous, less the previous, as they are
# LZMA1 in the .lzma container (13 bytes of header), a 1 MiB window (a history's columns are far smaller),
# no literal context (lc=0): the bytes are byte-shuffled numbers, not text
_BLOB_FILTERS = [{"id": lzma.FILTER_LZMA1, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": 1 << 20, "lc": 0}]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=True)


def _scalar_kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "b"
    if isinstance(value, int):
        return "i" if -(2**63) <= value < 2**63 else None
    if isinstance(value, float):
        return "f"
    return None


def _leaf_kind(value: Any, depth: int = 0) -> tuple[str | None, tuple[int, ...] | None]:
    """(the kind shared by every number of ``value``, its rectangular shape) or (None, None)."""
    if isinstance(value, list):
        if depth > 4:
            return None, None
        if not value:
            return "e", (0,)
        parts = [_leaf_kind(v, depth + 1) for v in value]
        kinds, shapes = {k for k, _ in parts}, {s for _, s in parts}
        if None in kinds or len(shapes) != 1 or len(kinds - {"e"}) > 1:
            return None, None
        kind = next(iter(kinds - {"e"}), "e")
        return kind, (len(value), *next(iter(shapes)))
    kind = _scalar_kind(value)
    return (kind, ()) if kind else (None, None)


class _Blob:
    """The column bytes of one history (columns-2), appended in the order the columns are encoded."""

    def __init__(self):
        self.data = bytearray()

    def add(self, raw: bytes) -> list[int]:
        at = [len(self.data), len(raw)]
        self.data += raw
        return at


def _transformed(words: np.ndarray, width: int, transform: str) -> bytes:
    """Each row less the previous one (``x``: XOR, ``d``: wrapping difference, ``n``: as it is), byte-shuffled."""
    delta = words.copy()
    if delta.ndim and delta.shape[0] > 1:
        if transform == "x":
            delta[1:] ^= words[:-1]
        elif transform == "d":
            delta[1:] -= words[:-1]
    return delta.reshape(-1).view(np.uint8).reshape(-1, width).T.tobytes()


def _pack(array: np.ndarray, blob: _Blob) -> dict[str, Any]:
    """The column's bytes under the row transform that compresses best, appended to ``blob``."""
    raw = np.ascontiguousarray(array)
    width = raw.dtype.itemsize
    words = raw.view(f"u{width}") if width > 1 else raw.view("u1")
    options = [(t, _transformed(words, width, t)) for t in _TRANSFORMS]
    transform, data = min(options, key=lambda option: len(zlib.compress(option[1], 6)))
    return {"t": transform, "at": blob.add(data)}


def _compress_blob(raw: bytes) -> str:
    return base64.b85encode(lzma.compress(raw, format=lzma.FORMAT_ALONE, filters=_BLOB_FILTERS)).decode("ascii") \
        if raw else ""


def _decompress_blob(text: str, size: int, upto: int | None = None) -> bytes:
    """The history's column bytes (ValueError when damaged or not ``size`` bytes long); with ``upto``, only
    its first ``upto`` bytes (the stream is decoded no further)."""
    if not isinstance(size, int) or size < 0 or not isinstance(text, str):
        raise ValueError("a columnar history's blob needs its text and size")
    if not text:
        if size:
            raise ValueError("a columnar history's blob is missing")
        return b""
    inflater = lzma.LZMADecompressor(format=lzma.FORMAT_ALONE)
    try:
        data = inflater.decompress(b85decode(text), max_length=size + 1 if upto is None else upto)
    except lzma.LZMAError as err:
        raise ValueError(f"a columnar history's blob is damaged ({err})") from None
    if upto is not None and upto < size:
        if len(data) != upto:
            raise ValueError(f"a columnar history's blob holds fewer than {upto} bytes")
        return data
    if len(data) != size or not inflater.eof:
        raise ValueError(f"a columnar history's blob holds {len(data)} bytes, not {size}")
    return data


_B85_ALPHABET = (b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                 b"!#$%&()*+-;<=>?@^_`{|}~")
_B85_VALUE = np.full(256, 255, dtype=np.uint8)
_B85_VALUE[np.frombuffer(_B85_ALPHABET, np.uint8)] = np.arange(85, dtype=np.uint8)
_B85_POWERS = 85 ** np.arange(4, -1, -1, dtype=np.uint64)


def b85decode(text: str) -> bytes:
    """``base64.b85decode`` in numpy, whole groups at once (the store's reading time was mostly the
    pure-Python one): the same bytes, and a ValueError for a character or group it would refuse."""
    raw = np.frombuffer(text.encode("ascii"), np.uint8)
    pad = -len(raw) % 5
    digits = _B85_VALUE[np.concatenate([raw, np.full(pad, ord("~"), np.uint8)])]
    if np.any(digits == 255):
        raise ValueError("bad base85 character")
    words = digits.reshape(-1, 5).astype(np.uint64) @ _B85_POWERS
    if np.any(words > 0xFFFFFFFF):
        raise ValueError("base85 overflow in a group")
    data = words.astype(">u4").tobytes()
    return data[:len(data) - pad] if pad else data


def _unpack(packed: str | dict, dtype: str, shape: list[int], blob: bytes | None) -> np.ndarray:
    """A packed column back: columns-1's own deflated text (XOR for floats, difference for integers) or
    columns-2's transform and place in ``blob``."""
    dtype = np.dtype(dtype)
    width = dtype.itemsize
    count = int(np.prod(shape)) if shape else 1
    if isinstance(packed, str):
        data = zlib.decompress(b85decode(packed), bufsize=max(count * width, 1))
        transform = "x" if dtype.kind == "f" else "d"
    else:
        transform, (start, size) = packed["t"], packed["at"]
        if transform not in _TRANSFORMS or not isinstance(start, int) or not isinstance(size, int):
            raise ValueError(f"a history column's packing {packed!r} is not one of columns-2")
        if blob is None or start < 0 or start + size > len(blob):
            raise ValueError("a history column lies outside its history's blob")
        data = bytes(blob[start:start + size])
    if len(data) != count * width:
        raise ValueError(f"a history column holds {len(data)} bytes, not {count * width}")
    words = np.frombuffer(data, np.uint8).reshape(width, -1).T.copy().view(f"u{width}" if width > 1 else "u1")
    words = words.reshape(shape)
    if words.ndim and words.shape[0] > 1:
        if transform == "x":
            words = np.bitwise_xor.accumulate(words, axis=0)
        elif transform == "d":
            words = np.cumsum(words, axis=0, dtype=words.dtype)
    return words.view(dtype).reshape(shape)


_DENOMINATORS = np.arange(1, 2**16, dtype=np.float64)


def _denominator(values: np.ndarray) -> int | None:
    """The smallest n < 2**16 for which every value is float32(k) / float32(n) for a whole k, else None:
    an accuracy is correct / total, computed in float32."""
    inner = values[(values != 0) & (values != 1)]
    if not np.all(np.isfinite(values)) or np.any((values < 0) | (values > 1)):
        return None
    if inner.size == 0:
        return 1
    first = np.float32(inner[0])
    candidates = _DENOMINATORS[np.float32(np.rint(inner[0] * _DENOMINATORS)) / _DENOMINATORS.astype(np.float32)
                               == first][:64]
    target = values.astype(np.float32)
    for n in candidates:
        k = np.rint(values * n)
        if np.array_equal(k.astype(np.float32) / np.float32(n), target):
            return int(n)
    return None


def _ratio(values: list[Any], array: np.ndarray, blob: _Blob) -> dict[str, Any] | None:
    """A float column whose values are all ratios of whole numbers (per trailing column): numerators and
    denominators, packed; None when one is not."""
    if array.dtype != np.float32 or array.ndim not in (1, 2) or array.shape[0] < 2:
        return None
    wide = array.astype(np.float64).reshape(array.shape[0], -1)
    dens = [_denominator(wide[:, j]) for j in range(wide.shape[1])]
    if any(d is None for d in dens):
        return None
    counts = np.rint(wide * np.asarray(dens, dtype=np.float64)).astype(np.int32).reshape(array.shape)
    return {"k": "ratio", "s": list(array.shape), "den": dens, "num": _pack(counts, blob)}


def _numeric(values: list[Any], blob: _Blob) -> dict[str, Any] | None:
    """A rectangular column of one number kind, packed; None when it is not one."""
    kind, shape = _leaf_kind(values)
    if kind not in ("f", "i", "b"):
        return None
    if kind == "f":
        array = np.asarray(values, dtype=np.float64)
        single = array.astype(np.float32)
        exact = np.array_equal(single.astype(np.float64), array, equal_nan=True) and not np.any(
            np.isnan(array) & ~np.isnan(single))
        array = single if exact else array
        ratio = _ratio(values, array, blob) if exact else None
        if ratio is not None:
            return ratio
    elif kind == "i":
        array = np.asarray(values, dtype=np.int64)
        if array.size and array.min() >= -(2**31) and array.max() < 2**31:
            array = array.astype(np.int32)
    else:
        array = np.asarray(values, dtype=np.bool_)
    return {"k": _KINDS[kind], "d": array.dtype.str, "s": list(shape), "z": _pack(array, blob)}


def _encode_column(values: list[Any], blob: _Blob) -> dict[str, Any]:
    """One column (a value per row, None where a row lacks the key is handled by the caller)."""
    mark = len(blob.data)
    column = _numeric(values, blob)
    if column is None and values and all(isinstance(v, list) for v in values):  # lists of varying length
        flat = [x for v in values for x in v]
        lengths, inner = _numeric([len(v) for v in values], blob), _numeric(flat, blob) if flat else None
        if lengths is not None and (inner is not None or not flat):
            column = {"k": "ragged", "n": lengths, "v": inner}
    if column is None and values and all(isinstance(v, dict) for v in values):
        column = {"k": "dict", **_encode_rows(values, blob)}
    if column is None or _canonical(_decode_column(column, len(values), blob.data)) != _canonical(values):
        del blob.data[mark:]  # its bytes, if any, are not kept
        return {"k": "json", "v": values}
    return column


def _decode_column(column: dict[str, Any], rows: int, blob: bytes | None) -> list[Any]:
    kind = column["k"]
    if kind == "json":
        return list(column["v"])
    if kind in ("float", "int", "bool"):
        array = _unpack(column["z"], column["d"], column["s"], blob)
        cast = {"float": np.float64, "int": np.int64, "bool": np.bool_}[kind]
        return array.astype(cast).tolist()
    if kind == "ratio":
        dens = np.asarray(column["den"], dtype=np.float32)
        counts = _unpack(column["num"], "<i4", column["s"], blob).astype(np.float32)
        return (counts.reshape(counts.shape[0], -1) / dens).reshape(column["s"]).astype(np.float64).tolist()
    if kind == "ragged":
        lengths = _decode_column(column["n"], rows, blob)
        flat = _decode_column(column["v"], 0, blob) if column["v"] is not None else []
        edges = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        return [flat[a:b] for a, b in zip(edges[:-1], edges[1:])]
    if kind == "dict":
        return _decode_rows(column, rows, blob)
    raise ValueError(f"unknown history column kind {kind!r}")


def _encode_rows(rows: list[dict], blob: _Blob, first: tuple[str, ...] = ()) -> dict[str, Any]:
    """Mappings (one per row) as columns; a key absent in some rows keeps a presence mask. The columns of
    ``first`` go first in ``blob``, so a reader of only those decompresses only its start."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    columns = {}
    for key in sorted(keys, key=lambda k: (k not in first, first.index(k) if k in first else 0)):
        present = [key in row for row in rows]
        values = [row[key] for row in rows if key in row]
        column = _encode_column(values, blob)
        if not all(present):
            column = {"k": "some", "p": _numeric(present, blob), "c": column}
        columns[key] = column
    return {"keys": keys, "c": {key: columns[key] for key in keys}}


def _decode_rows(block: dict[str, Any], rows: int, blob: bytes | None, only=None) -> list[dict]:
    out: list[dict] = [{} for _ in range(rows)]
    for key in block["keys"] if only is None else [k for k in block["keys"] if k in only]:
        column = block["c"][key]
        if column["k"] == "some":
            present = _decode_column(column["p"], rows, blob)
            where = [i for i, p in enumerate(present) if p]
            values = _decode_column(column["c"], len(where), blob)
        else:
            where, values = list(range(rows)), _decode_column(column, rows, blob)
        if len(values) != len(where):
            raise ValueError(f"history column {key!r} holds {len(values)} values for {len(where)} rounds")
        for i, value in zip(where, values):
            out[i][key] = value
    return out


# column (a top-level history key, or "key.sub" inside a per-round mapping) -> the significant bits it keeps
STORED_PRECISION: dict[str, int] = {
    **{key: 11 for key in ("time_train", "time_server", "time_eval", "time_round", "time_monitor",
                           "disagreement.cosine", "disagreement.norm_ratio", "disagreement.core_cosine")},
    **{key: 17 for key in ("weights", "scores", "similarity", "diagnostics.*")},
}


def significant(value: float, bits: int) -> float:
    """``value`` as a float32 rounded (to nearest, ties to even) to ``bits`` significant bits (at most 24).
    The float32 exponent range is kept: nothing underflows or overflows the way a float16 would; a value
    beyond float32's range is returned as it is."""
    with np.errstate(over="ignore"):
        single = np.asarray(value, dtype=np.float32)
    if not np.isfinite(single):
        return value if np.isfinite(value) else float(single)
    word = int(single.view(np.uint32))
    drop = 24 - bits
    if drop <= 0:
        return float(single)
    keep, rest, half = word >> drop, word & ((1 << drop) - 1), 1 << (drop - 1)
    keep += rest > half or (rest == half and keep & 1)
    rounded = float(np.asarray(keep << drop, dtype=np.uint32).view(np.float32))
    return rounded if np.isfinite(rounded) else float(single)


def _rounded(value: Any, bits: int) -> Any:
    """``value`` with every float rounded to ``bits`` significant bits (:func:`significant`)."""
    if isinstance(value, float):
        return significant(value, bits)
    if isinstance(value, list):
        return [_rounded(v, bits) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v, bits) for k, v in value.items()}
    return value


def reduce_history(history: list[dict], precision: dict[str, int] | None = None) -> list[dict]:
    """``history`` with the columns of ``precision`` (default :data:`STORED_PRECISION`) rounded to their
    significant bits; every other value unchanged. ``"key.*"`` covers every entry of a per-round mapping."""
    precision = STORED_PRECISION if precision is None else precision

    def bits(key: str, sub: str | None = None) -> int | None:
        return precision.get(key) if sub is None else precision.get(f"{key}.{sub}", precision.get(f"{key}.*"))

    out = []
    for row in history:
        new = {}
        for key, value in row.items():
            if isinstance(value, dict):
                new[key] = {sub: (_rounded(v, bits(key, sub)) if bits(key, sub) else v) for sub, v in value.items()}
            else:
                new[key] = _rounded(value, bits(key)) if bits(key) else value
        out.append(new)
    return out


def encode_history(history: list[dict]) -> dict[str, Any]:
    """``history`` (a list of per-round mappings) as columns; :func:`decode_history` gives it back exactly."""
    if not isinstance(history, list) or not all(isinstance(row, dict) for row in history):
        raise TypeError("a history is a list of per-round mappings")
    blob = _Blob()
    columns = _encode_rows(history, blob, LEADING_COLUMNS)
    return {"format": FORMAT, "rounds": len(history), **columns, "size": len(blob.data),
            "blob": _compress_blob(bytes(blob.data))}


def decode_history(encoded: dict[str, Any], only=None) -> list[dict]:
    """The list of per-round mappings :func:`encode_history` encoded (ValueError on a damaged one); with
    ``only``, each mapping holds just those top-level keys (what a check reads, without decoding the rest)."""
    if not is_encoded(encoded):
        raise ValueError(f"not a columnar history ({', '.join(FORMATS)})")
    rows = encoded["rounds"]
    if not isinstance(rows, int) or rows < 0:
        raise ValueError("a columnar history's rounds must be a count")
    blob = None
    if encoded["format"] == FORMAT:
        upto = None if only is None else max((_end(encoded["c"][k]) for k in encoded["keys"] if k in only), default=0)
        blob = _decompress_blob(encoded.get("blob"), encoded.get("size"), upto)
    return _decode_rows(encoded, rows, blob, only)


def _end(spec: Any) -> int:
    """Where a column's last byte in its history's blob ends (0 for a JSON column)."""
    if isinstance(spec, dict):
        if spec.get("k") == "json":
            return 0
        at = spec.get("at")
        ends = [at[0] + at[1]] if isinstance(at, list) and len(at) == 2 and all(isinstance(v, int) for v in at) else []
        return max(ends + [_end(v) for k, v in spec.items() if k != "at"])
    return max([_end(v) for v in spec], default=0) if isinstance(spec, list) else 0


def is_encoded(history: Any) -> bool:
    return isinstance(history, dict) and history.get("format") in FORMATS


def _history_holder(payload: Any) -> dict | None:
    """The mapping that holds a stored payload's ``history``: its ``result`` (a ``stored_payload``), or the
    payload itself (a bare result, the cache's earlier form); None when there is none."""
    if not isinstance(payload, dict):
        return None
    holder = payload.get("result") if isinstance(payload.get("result"), dict) else payload
    return holder if "history" in holder else None


def compact(payload: Any) -> Any:
    """A stored payload as the compact record keeps it: its history reduced to ``STORED_PRECISION`` and
    encoded as columns (a payload without a list-of-mappings history is returned as it is)."""
    holder = _history_holder(payload)
    history = holder.get("history") if holder is not None else None
    if not isinstance(history, list) or not history or not all(isinstance(row, dict) for row in history):
        return payload
    encoded = encode_history(reduce_history(history))
    if holder is payload:
        return {**payload, "history": encoded}
    return {**payload, "result": {**holder, "history": encoded}}


def expand(payload: Any) -> Any:
    """A payload as readers use it: a columnar history decoded back to per-round mappings (ValueError
    when it is damaged); any other payload as it is."""
    holder = _history_holder(payload)
    if holder is None or not is_encoded(holder.get("history")):
        return payload
    history = decode_history(holder["history"])
    if holder is payload:
        return {**payload, "history": history}
    return {**payload, "result": {**holder, "history": history}}
