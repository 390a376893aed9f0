"""The live explorer as a web app: ``book/explore.ipynb`` served by Voilà on localhost.

Voilà runs the notebook in a kernel and shows only its outputs (the explorer's widgets), so
the Run button trains real federations in the browser. ``python -m fedlib explore`` (or
``make explore``) starts it and prints the URL; Ctrl-C stops it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from .book import book_dir

NOTEBOOK = "explore.ipynb"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def voila_command(port: int) -> list[str]:
    """The Voilà command line serving the explorer on 127.0.0.1:port, without a browser."""
    voila = Path(sys.executable).parent / "voila"
    exe = str(voila) if voila.exists() else shutil.which("voila")
    if exe is None:
        raise FileNotFoundError("voila: not installed (pip install -e '.[book]')")
    return [exe, str(book_dir() / NOTEBOOK), f"--port={port}", "--no-browser", "--Voila.ip=127.0.0.1",
            "--show_tracebacks=True", "--theme=light"]


def start(port: int = 0, timeout: float = 60.0, **popen) -> tuple[subprocess.Popen, str]:
    """Start Voilà in the background; returns (process, URL) once the server answers."""
    port = port or free_port()
    process = subprocess.Popen(voila_command(port), cwd=book_dir(), **popen)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"voila exited with code {process.returncode} before serving {url}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return process, url
        except OSError:
            time.sleep(0.3)
    process.terminate()
    raise TimeoutError(f"voila did not answer on {url} within {timeout:.0f} s")


def serve(port: int = 8866, open_browser: bool = False) -> int:
    """Serve the explorer until Ctrl-C; prints the URL."""
    try:
        process, url = start(port)
    except (FileNotFoundError, RuntimeError, TimeoutError) as err:
        print(f"fedlib explore: {err}", file=sys.stderr)
        return 1
    print(f"The live explorer is at {url}  (Ctrl-C stops it)", flush=True)
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        process.wait(timeout=10)
        return 0
