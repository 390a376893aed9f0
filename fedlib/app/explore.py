"""The live explorer as a web app: ``book/explore.ipynb`` served by Voilà on localhost.

Voilà runs the notebook in a kernel and shows only its outputs (the explorer's widgets), so
the Run button trains real federations in the browser. ``python -m fedlib explore`` (or
``make explore``) starts it and prints the URL; Ctrl-C or SIGTERM stops it.

Safety (issue 33): Voilà listens on 127.0.0.1 only, with a random token that is part of the printed
URL (a page without it is refused); requests whose Host header is not a loopback address or
``localhost`` are refused (403), so a DNS-rebinding page cannot reach the widgets. Voilà itself
turns that check off (``allow_remote_access``); its ``tornado_settings`` turn it back on, and send
``Referrer-Policy: no-referrer`` on every page (the token in the URL never leaks to another site through a
Referer header). Kernels: one per page load (a browser connection; Voilà shuts it down when the page
closes), about 1 GB each, at most ``MAX_KERNELS`` at once: starting one more shuts the oldest down first
(:class:`CappedKernelManager`); idle ones without a connected page are shut down after ``CULL_IDLE_S``
seconds. The settings and the token travel in a private config file
(mode 0600, deleted once Voilà has read it), not on the command line where ``ps`` shows them; only
that file is read (``config_file_paths``), not a ``voila.json``/``voila.py`` in the working folder.
SIGTERM and SIGINT stop Voilà, which shuts its kernels down. The printed URL carries the port
Voilà actually took (it moves to the next one when the asked port is taken).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import webbrowser
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..limits import check_port
from .kit.sources import book_dir

NOTEBOOK = "explore.ipynb"
LOCAL_HOSTNAMES = ["localhost"]  # besides loopback IP addresses, which jupyter_server always accepts
CULL_IDLE_S = 600  # shut down a kernel idle this long with no page connected ...
CULL_INTERVAL_S = 60  # ... checked this often
MAX_KERNELS = 3  # kernels at once (one per browser connection); a new one shuts the oldest down first
HEADERS = {"Referrer-Policy": "no-referrer"}  # on every page Voilà serves
KERNEL_MANAGER = "fedlib.app.explore.CappedKernelManager"
STOP_WAIT_S = 20.0  # how long Voilà gets to shut its kernels down before it is killed
RUNNING_AT = re.compile(r"^\s*https?://(?:127\.0\.0\.1|localhost|\[::1\]):(\d+)/")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def voila_config(token: str) -> dict:
    """The Voilà configuration (``voila.json``): token, Host check, kernel culling, localhost only."""
    return {
        "Voila": {
            "token": token, "ip": "127.0.0.1", "open_browser": False,
            # Voilà's standalone app sets allow_remote_access=True; these settings are applied after its own
            "tornado_settings": {"allow_remote_access": False, "local_hostnames": LOCAL_HOSTNAMES,
                                 "headers": dict(HEADERS)},
        },
        "VoilaConfiguration": {"multi_kernel_manager_class": KERNEL_MANAGER},
        "CappedKernelManager": {"max_kernels": MAX_KERNELS},
        "MappingKernelManager": {"cull_idle_timeout": CULL_IDLE_S, "cull_interval": CULL_INTERVAL_S,
                                 "cull_connected": False, "cull_busy": False},
    }


async def make_room(manager, order: list[str], limit: int) -> list[str]:
    """Shut down the oldest of ``manager``'s kernels (``order``: ids oldest first, kept up to date) until
    fewer than ``limit`` run, so that one more may start; returns the ids shut down."""
    running = list(manager.list_kernel_ids())
    order[:] = [k for k in order if k in running] + [k for k in running if k not in order]
    culled = []
    while order and len(order) >= max(1, limit):
        oldest = order.pop(0)
        manager.log.warning("fedlib explore: %d kernel(s) running, at most %d: shutting down the oldest (%s)",
                            len(order) + 1, limit, oldest)
        await manager.shutdown_kernel(oldest, now=True)
        culled.append(oldest)
    return culled


def _capped_kernel_manager():
    """The kernel manager class Voilà runs with (``VoilaConfiguration.multi_kernel_manager_class``):
    jupyter_server's, with at most ``max_kernels`` kernels. Built on first use (jupyter_server is the
    book extra's)."""
    # lazy: jupyter_server, traitlets (book extra); the command line imports this module
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
    from traitlets import Integer

    class CappedKernelManager(AsyncMappingKernelManager):
        """At most ``max_kernels`` kernels at once: starting one more shuts the oldest down first."""

        max_kernels = Integer(MAX_KERNELS, config=True, help="kernels at once; a new one shuts the oldest down")

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._order: list[str] = []
            self._starting = None

        async def start_kernel(self, *, kernel_id=None, **kwargs):
            if kernel_id is not None and kernel_id in self:  # not a new kernel
                return await super().start_kernel(kernel_id=kernel_id, **kwargs)
            self._starting = self._starting or asyncio.Lock()
            async with self._starting:  # pages loading at once still make room one after the other
                await make_room(self, self._order, self.max_kernels)
                started = await super().start_kernel(kernel_id=kernel_id, **kwargs)
                self._order.append(started)
                return started

    CappedKernelManager.__module__, CappedKernelManager.__qualname__ = __name__, "CappedKernelManager"
    return CappedKernelManager


def __getattr__(name: str):
    if name == "CappedKernelManager":  # the class Voilà imports by name (KERNEL_MANAGER)
        cls = globals()["CappedKernelManager"] = _capped_kernel_manager()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def write_config(token: str) -> Path:
    """A private folder holding ``voila.json`` (mode 0600); the caller removes it."""
    folder = Path(tempfile.mkdtemp(prefix="fedlib-explore-"))
    path = folder / "voila.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(voila_config(token), out)
    return folder


def voila_command(port: int, config_dir: str | Path | None = None) -> list[str]:
    """The Voilà command line serving the explorer on 127.0.0.1:port, without a browser; its
    configuration (token, Host check, culling) is read from ``config_dir`` only."""
    voila = Path(sys.executable).parent / "voila"
    exe = str(voila) if voila.exists() else shutil.which("voila")
    if exe is None:
        raise FileNotFoundError("voila: not installed (pip install -e '.[book]')")
    command = [exe, str(book_dir() / NOTEBOOK), f"--port={port}", "--no-browser", "--Voila.ip=127.0.0.1",
               "--show_tracebacks=True", "--theme=light"]
    if config_dir is not None:
        command.append(f"--Voila.config_file_paths={config_dir}")
    return command


def served_url(port: int, token: str) -> str:
    return f"http://127.0.0.1:{port}/?token={token}"


class _Output:
    """Reads the server's merged stdout/stderr in a thread: forwards each line to ``sink`` and
    notes the port of its 'Voilà is running at' line (the port it actually took)."""

    def __init__(self, stream, sink):
        self.port: int | None = None
        self.tail: list[str] = []
        self.ready = threading.Event()
        self._after_banner = False
        self._thread = threading.Thread(target=self._read, args=(stream, sink), daemon=True)
        self._thread.start()

    def _read(self, stream, sink) -> None:
        for line in iter(stream.readline, ""):
            if sink is not None:
                try:
                    sink.write(line)
                    sink.flush()
                except (OSError, ValueError):  # a closed sink: keep draining the pipe
                    sink = None
            self.tail = (self.tail + [line.rstrip()])[-20:]
            if "is running at" in line:
                self._after_banner = True
            match = RUNNING_AT.match(line)
            if match and self._after_banner and self.port is None:
                self.port = int(match.group(1))
                self.ready.set()
        self.ready.set()  # the stream ended: the server exited


def start(port: int = 0, timeout: float = 90.0, command: list[str] | None = None, token: str | None = None,
          **popen) -> tuple[subprocess.Popen, str]:
    """Start Voilà in the background (its own process group); returns (process, URL with the token)
    once it serves, on the port it actually took. ``stdout`` in ``popen``: where its output goes
    (default: this process's stderr). ``command``: a server to run instead of Voilà (tests)."""
    port = port or free_port()
    token = token or new_token()
    sink = popen.pop("stdout", sys.stderr)
    popen.pop("stderr", None)
    config_dir = write_config(token)
    try:
        argv = command or voila_command(port, config_dir)
        process = subprocess.Popen(argv, cwd=book_dir(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace", start_new_session=True, **popen)
        output = _Output(process.stdout, sink)
        deadline = time.monotonic() + timeout
        try:
            while not output.ready.wait(0.2):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"voila did not report serving within {timeout:.0f} s")
            if output.port is None:
                process.wait(timeout=5)
                raise RuntimeError(f"voila exited with code {process.returncode} before serving; last output: "
                                   f"{' | '.join(output.tail[-3:])[:300]}")
            while True:  # the banner comes once it listens; make sure it answers
                try:
                    with socket.create_connection(("127.0.0.1", output.port), timeout=2):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"voila reported port {output.port} but does not answer there")
                    time.sleep(0.2)
        except BaseException:
            stop(process)
            raise
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)
    return process, served_url(output.port, token)


def stop(process: subprocess.Popen, wait: float = STOP_WAIT_S) -> int:
    """SIGTERM to Voilà (it shuts its kernels down, then exits); after ``wait`` seconds SIGKILL to
    its process group. Returns its exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    try:  # anything left in its process group (it was started in a session of its own)
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return process.wait()


class _Stop(Exception):
    """Raised in the main thread by the SIGTERM/SIGINT handler of :func:`serve`."""


def serve(port: int = 8866, open_browser: bool = False, command: list[str] | None = None) -> int:
    """Serve the explorer until SIGINT (Ctrl-C) or SIGTERM; prints the URL (with its token and the
    port Voilà took). Either signal stops Voilà and its kernels; returns 0 then."""

    try:
        port = check_port(port)
    except ConfigError as err:
        print(f"fedlib explore: {err}", file=sys.stderr)
        return 2

    def on_signal(signum, frame):
        raise _Stop(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    process = None
    try:
        try:
            process, url = start(port, command=command)
        except (FileNotFoundError, RuntimeError, TimeoutError, OSError) as err:
            print(f"fedlib explore: {err}", file=sys.stderr)
            return 1
        taken = urlsplit(url).port
        moved = f" (port {port} was taken)" if port and taken != port else ""
        print(f"The live explorer is at {url}{moved}  (Ctrl-C stops it; keep the token private)", flush=True)
        if open_browser:
            webbrowser.open(url)
        return process.wait()
    except _Stop as sig:
        print(f"fedlib explore: {sig}: stopping Voilà and its kernels", file=sys.stderr, flush=True)
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if process is not None:
            stop(process)
