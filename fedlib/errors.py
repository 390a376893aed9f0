"""One-line errors for bad input (core: every layer raises them, the command line prints them).

Bad input is echoed only through :func:`shown` (a short ``repr``) or :func:`clipped` (short text):
an error never repeats a huge (or self-expanding) input whole. :class:`ConfigError` itself keeps
its message to one line of at most :data:`MAX_MESSAGE` characters, whatever a caller passes."""

from __future__ import annotations

import reprlib
from typing import Any

SHOWN_CHARS = 80  # an echoed bad value or key is cut to this many characters
MAX_MESSAGE = 1000  # a ConfigError's message at most (a safety net; messages are written shorter)
ELLIPSIS = "…"


def _one_line(text: str) -> str:
    return " ".join(text.split()) if ("\n" in text or "\r" in text) else text


class ConfigError(ValueError):
    """A bad configuration value; the message is one line naming the field (newlines become spaces,
    and a message longer than :data:`MAX_MESSAGE` characters is cut)."""

    def __init__(self, message: Any = "", *args: Any):
        if isinstance(message, str):
            message = _one_line(message)
            if len(message) > MAX_MESSAGE:
                message = message[:MAX_MESSAGE] + ELLIPSIS
        super().__init__(message, *args)


def clipped(text: Any, limit: int = SHOWN_CHARS) -> str:
    """``text`` (made a string) cut to ``limit`` characters plus ``…`` and its length; control
    characters (NUL, newlines) are escaped, so the result is printable and one line."""
    text = str(text)
    if not text.isprintable():
        text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}{ELLIPSIS} (length {len(text)})"


def shown(value: Any) -> str:
    """A short ``repr`` of a bad value: errors never echo a huge (or self-expanding) input whole."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = short.maxlong = SHOWN_CHARS
    short.maxlist = short.maxtuple = 6
    short.maxdict, short.maxlevel = 4, 2
    text = short.repr(value)
    if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > SHOWN_CHARS:
        text += f" (length {len(value)})"
    return text
