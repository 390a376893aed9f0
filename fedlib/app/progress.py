"""Progress of the runs inside a book chapter, reported to the process that builds the book.

Papermill captures everything a chapter's kernel prints into the page, so a chapter cannot
show its progress on the builder's terminal. Instead, when ``$FEDLIB_PROGRESS`` names a file,
``run_many`` announces each batch of runs and ``run`` each finished run (cached or fresh) as
one JSON line appended to that file, and long steps that are not runs (the FedSCM pipeline's
stages, the performance page's engines) announce themselves as a "stage" (``name``, optionally
``done`` of ``total``); the book build sets the variable for the kernel, reads the
file while the chapter executes (:class:`ProgressFile`) and draws a bar on its terminal
(:class:`ChapterBar`). Without the variable, :func:`report` does nothing.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..events import ENV, report  # noqa: F401 (the events are core; this module listens)


class ProgressFile:
    """Reads the events appended to a side-channel file since the last call."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = ""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                handle.seek(self._offset)
                text = handle.read()
                self._offset = handle.tell()
        except FileNotFoundError:
            return []
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next read
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return events


def format_seconds(seconds: float) -> str:
    """E.g. "42 s", "3 min 05 s", "1 h 02 min"."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class _StatusLine:
    """A subclass's ``line()`` on ``stream`` (stderr): redrawn in place on a terminal; in a log
    (not a TTY) written every ``log_every`` seconds at most."""

    def __init__(self, stream, log_every: float, clock: Callable[[], float]):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.log_every = log_every
        self.clock = clock
        self._last_log = clock()

    def draw(self, force: bool = False) -> None:
        now = self.clock()
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line())
        elif force or now - self._last_log >= self.log_every:
            self.stream.write(self.line() + "\n")
            self._last_log = now
        self.stream.flush()

    def clear(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()


class ChapterBar(_StatusLine):
    """The runs of one chapter on a terminal: a bar over the runs announced so far, the cached
    ones, the elapsed time and an estimate of what is left of the whole build.

    ``expected_runs`` (from the last build) keeps the bar from jumping to 100 % when the
    chapter announces its runs in several batches; ``remaining_after`` is the stored time of the
    chapters still to execute after this one.
    """

    def __init__(self, label: str, expected_seconds: float | None, remaining_after: float, expected_runs: int = 0,
                 stream=None, log_every: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__(stream, log_every, clock)
        self.label = label
        self.expected_seconds = expected_seconds
        self.remaining_after = remaining_after
        self.announced = 0
        self.expected_runs = expected_runs
        self.done = 0
        self.cached = 0
        self.stage = ""  # the last "stage" event: what the chapter is doing between runs
        self.start = self._last_log

    def update(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            if event.get("event") == "batch":
                self.announced += int(event.get("total", 0))
            elif event.get("event") == "run":
                self.done += 1
                self.cached += bool(event.get("cached"))
            elif event.get("event") == "stage":
                count = f" {event['done']}/{event['total']}" if "done" in event and "total" in event else ""
                self.stage = f"{event.get('name', '')}{count}"
        self.announced = max(self.announced, self.done)

    def remaining(self) -> float | None:
        """Seconds left for the whole build: this chapter's share, then the chapters after it."""
        elapsed = self.clock() - self.start
        total_runs = max(self.announced, self.expected_runs)
        if self.expected_seconds is not None:
            own = max(self.expected_seconds - elapsed, 0.0)
        elif self.done and total_runs:
            own = elapsed * (total_runs - self.done) / self.done
        else:
            return None
        return own + self.remaining_after

    def bar(self, width: int) -> tuple[str, int]:
        """The bar of ``width`` characters and the runs it counts to."""
        total = max(self.announced, self.expected_runs)
        filled = int(width * self.done / total) if total else 0
        return "#" * filled + "." * (width - filled), total

    def line(self) -> str:
        bar, total = self.bar(24)
        runs = f"{self.done}/{total} runs" if total else "no runs yet"
        cached = f", {self.cached} cached" if self.cached else ""
        left = self.remaining()
        eta = f", about {format_seconds(left)} left" if left is not None else ""
        stage = f" ({self.stage})" if self.stage else ""
        return f"    {self.label} [{bar}] {runs}{cached}{stage}, {format_seconds(self.clock() - self.start)}{eta}"

    def short(self) -> str:
        """E.g. "celm [######......] 12/58" for a line shared with other chapters."""
        bar, total = self.bar(12)
        if not total and self.stage:  # no runs announced: the stage says what it is doing
            return f"{self.label} {self.stage}"
        return f"{self.label} [{bar}] {self.done}/{total or '?'}" + (f" {self.stage}" if self.stage else "")


class Board(_StatusLine):
    """One status line for the chapters executing now (several when the build runs chapters in
    parallel): each chapter's bar and an estimate of the time left for the whole build, that is
    (what is left of the running chapters + the stored times of those still queued) / jobs."""

    def __init__(self, jobs: int = 1, stream=None, log_every: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(stream, log_every, clock)
        self.jobs = max(1, jobs)
        self.bars: dict[str, ChapterBar] = {}
        self.queued_seconds = 0.0
        self.lock = threading.Lock()

    def remaining(self) -> float | None:
        with self.lock:
            parts = [bar.remaining() for bar in self.bars.values()]
        if any(part is None for part in parts):
            return None
        return (sum(parts) + self.queued_seconds) / self.jobs

    def line(self) -> str:
        with self.lock:
            bars = list(self.bars.values())
        left = self.remaining()
        eta = "" if left is None else f" | about {format_seconds(left)} left" if left >= 1 else " | finishing"
        return "    " + " | ".join(bar.short() for bar in bars) + eta

    def draw(self, force: bool = False) -> None:
        if self.bars:
            super().draw(force)
