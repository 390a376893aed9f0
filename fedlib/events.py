"""Progress events of long computations (runs, batches of runs, named stages), appended as JSON lines
to the file ``$FEDLIB_PROGRESS`` names, when it names one (core: the book build listens to it,
``fedlib.app.progress``; without the variable nothing happens)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

ENV = "FEDLIB_PROGRESS"


def report(event: str, **fields: Any) -> None:
    """Append one event ("batch" with ``total``, "run" with ``cached`` and ``wall``, "stage" with
    ``name`` and optionally ``done``/``total``) to the side channel, if one is set; never raises
    (progress must not break a run)."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"event": event, "time": time.time(), **fields}) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as handle:  # one short append per event
            handle.write(line)
    except OSError:
        pass
