"""One-line errors for bad input (core: every layer raises them, the command line prints them)."""

from __future__ import annotations

from typing import Any

SHOWN_CHARS = 60  # an echoed bad value is cut to this many characters


class ConfigError(ValueError):
    """A bad configuration value; the message is one line naming the field."""


def shown(value: Any) -> str:
    """A short ``repr`` of a bad value: errors never echo a huge (or self-expanding) input whole."""
    import reprlib

    short = reprlib.Repr()
    short.maxstring = short.maxother = short.maxlong = SHOWN_CHARS
    short.maxlist = short.maxtuple = 6
    short.maxdict, short.maxlevel = 4, 2
    text = short.repr(value)
    if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > SHOWN_CHARS:
        text += f" (length {len(value)})"
    return text
