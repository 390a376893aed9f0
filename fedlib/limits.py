"""Hard limits on input (core: configs, split parameters and command-line flags are checked against them),
and the shared one-line validators of flags that several commands take: :func:`check_device`,
:func:`check_workers`, :func:`check_port` (each returns the value or raises :class:`ConfigError`)."""

from __future__ import annotations

import re
from typing import Any

import torch

from .errors import ConfigError, shown

# Hard limits on config input (a config is small: these stop memory and time blow-ups early).
MAX_CONFIG_BYTES = 256_000  # a YAML config file
MAX_STRING = 4096  # characters of any string value
MAX_LIST = 1000  # items of any list value
MAX_SPEC_VALUES = 1000  # values inside a split or method spec, nested ones included
MAX_COUNT = 100_000  # clients, rounds, evaluation period, chunk size
MAX_SAMPLES = 10_000_000  # test_samples, server_val
MAX_BATCH = 65_536
MAX_EPOCHS = 1000
MAX_SEED = 2**31 - 1
MAX_RATE = 1e6  # lr, weight_decay, ...: past this, training overflows (1e308 crashed with a traceback)
MAX_DEPTH = 20  # nesting of a spec value (lists in lists ...)
MAX_WORKERS = 256  # concurrent worker processes or jobs of one command (--workers, --jobs)
MAX_CUDA_INDEX = 255  # cuda:N
PORTS = (1, 65_535)  # a TCP port on localhost

DEVICES = "'cpu', 'cuda', 'cuda:N' or 'auto'"
_DEVICE = re.compile(r"cpu|auto|cuda(?::(0|[1-9][0-9]{0,2}))?")


def _cuda_count() -> int | None:
    """CUDA devices on this machine, or None without CUDA."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else None
    except Exception:  # a broken driver is "no CUDA" here; running on it reports the error
        return None


def check_device(name: Any, *, present: bool = False, what: str = "device") -> str:
    """``name`` when it is 'cpu', 'auto', 'cuda' or 'cuda:N' (N in [0, 255]); with CUDA on this
    machine, N must be one of its devices. ``present``: the device must also be here (CUDA available),
    for a command about to run on it. Else a one-line :class:`ConfigError` naming ``what``."""
    if not isinstance(name, str) or isinstance(name, bool):
        raise ConfigError(f"{what}: must be {DEVICES} (got {shown(name)})")
    match = _DEVICE.fullmatch(name)
    if match is None or (match.group(1) is not None and int(match.group(1)) > MAX_CUDA_INDEX):
        raise ConfigError(f"{what}: must be {DEVICES} (got {shown(name)})")
    if name.startswith("cuda"):
        count = _cuda_count()
        if count is None and present:
            raise ConfigError(f"{what}: {name!r} requested but CUDA is not available here")
        index = match.group(1)
        if count is not None and index is not None and int(index) >= count:
            raise ConfigError(f"{what}: {name!r} does not exist here ({count} CUDA device(s): "
                              f"cuda:0 to cuda:{count - 1})")
    return name


def _integer(value: Any) -> int | None:
    """``value`` as an int when it is one (or its decimal text), else None (a bool is not a number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,12}\s*", value):
        return int(value)
    return None


def check_workers(value: Any, what: str = "--workers") -> int:
    """A count of concurrent workers or jobs: an integer in [1, :data:`MAX_WORKERS`]."""
    n = _integer(value)
    if n is None or not 1 <= n <= MAX_WORKERS:
        raise ConfigError(f"{what}: must be an integer in [1, {MAX_WORKERS}] (got {shown(value)})")
    return n


def check_port(value: Any, what: str = "--port") -> int:
    """A TCP port: an integer in [1, 65535] (0, a negative or a non-integer is refused)."""
    n = _integer(value)
    if n is None or not PORTS[0] <= n <= PORTS[1]:
        raise ConfigError(f"{what}: must be an integer in [{PORTS[0]}, {PORTS[1]}] (got {shown(value)})")
    return n
